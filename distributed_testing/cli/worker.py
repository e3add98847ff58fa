"""``dt-worker`` / ``run_worker_example.py``: run a worker.

Flags follow the worker guide; variables DT_COORDINATOR_URL, DT_API_KEY, DT_WORKER_NAME and
DT_DB_PATH stand in for --coordinator, --api-key, --name and --db-path (flags win).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..config import DEFAULT_COORDINATOR_URL, WorkerConfig, env_pick, environ, normalize_url, positive
from ..errors import ConfigError
from ..retry import RetriesExhausted
from ..worker.agent import SessionRejected
from .common import add_log_flag, setup_logging, wait_for_signal

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-worker", description="Run a distributed_testing worker.")
    p.add_argument("--coordinator", help=f"coordinator http(s) URL (default {DEFAULT_COORDINATOR_URL}; env DT_COORDINATOR_URL)")
    auth = p.add_argument_group("authentication (one of)")
    auth.add_argument("--api-key", help="API key with the worker role (env DT_API_KEY)")
    auth.add_argument("--token", help="JWT for a worker key; renewed before it expires")
    auth.add_argument("--token-file", type=Path, help="file holding a JWT; re-read at each reconnect")
    p.add_argument("--name", help="friendly name (default: hostname; env DT_WORKER_NAME)")
    p.add_argument("--worker-id", help="stable worker id (default: a new random id per start)")
    p.add_argument("--tags", default="", help="comma-separated capability tags, e.g. gpu,cuda,transformers")
    p.add_argument("--db-path", type=Path, help="DuckDB file for the result outbox (default: in memory; env DT_DB_PATH)")
    p.add_argument("--test-root", type=Path, help="directory test_file paths resolve under (default: current directory)")
    p.add_argument("--heartbeat-interval", type=float, default=10.0, help="seconds between heartbeats (default 10)")
    p.add_argument("--reconnect-attempts", type=int, default=10, help="consecutive failed connects before giving up (default 10)")
    p.add_argument("--reconnect-interval", type=float, default=1.0, help="first reconnect delay in seconds; doubles with jitter (default 1)")
    p.add_argument("--max-concurrent-tasks", type=int, default=1, help="tasks run at once (default 1)")
    p.add_argument("--task-timeout", type=float, help="seconds a task may run when it sets no timeout_s (default: none)")
    bench = p.add_argument_group("benchmark tasks")
    bench.add_argument("--cache-models", action="store_true", help="keep the benchmark process and its loaded models between tasks")
    bench.add_argument("--mixed-precision", action="store_true", help="autocast by default for fp32 torch benchmarks that do not set autocast")
    bench.add_argument("--optimize-for", choices=["throughput", "latency"], help="default optimize_for of benchmark tasks (see docs/tasks.md)")
    bench.add_argument("--cuda-streams", type=int, help="default cuda_streams of benchmark tasks (CUDA only)")
    bench.add_argument("--bench-threads", type=int, help="torch threads in the benchmark process (default: all cores)")
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    url, url_src = env_pick(ns.coordinator, env, "DT_COORDINATOR_URL", DEFAULT_COORDINATOR_URL)
    api_key, _ = env_pick(ns.api_key, env, "DT_API_KEY")
    if ns.token or ns.token_file:
        api_key = ns.api_key  # an explicit token beats a key from the environment
    name, _ = env_pick(ns.name, env, "DT_WORKER_NAME")
    db, _ = env_pick(str(ns.db_path) if ns.db_path else None, env, "DT_DB_PATH")
    if ns.reconnect_attempts < 1:
        raise ConfigError(f"--reconnect-attempts: must be >= 1, got {ns.reconnect_attempts}")
    if ns.max_concurrent_tasks < 1:
        raise ConfigError(f"--max-concurrent-tasks: must be >= 1, got {ns.max_concurrent_tasks}")
    test_root = (ns.test_root or Path.cwd()).resolve()
    if not test_root.is_dir():
        raise ConfigError(f"--test-root: {test_root} is not a directory")
    kwargs = {"name": name} if name else {}
    if ns.worker_id:
        kwargs["worker_id"] = ns.worker_id
    return WorkerConfig(
        coordinator_url=normalize_url(url or DEFAULT_COORDINATOR_URL, "--coordinator" if url_src == "flag" else url_src),
        api_key=api_key, token=ns.token, token_file=ns.token_file,
        tags=tuple(t.strip() for t in ns.tags.split(",") if t.strip()),
        db_path=Path(db) if db else None, test_root=test_root,
        heartbeat_interval_s=positive(ns.heartbeat_interval, "--heartbeat-interval"),
        reconnect_attempts=ns.reconnect_attempts,
        reconnect_interval_s=positive(ns.reconnect_interval, "--reconnect-interval"),
        max_concurrent_tasks=ns.max_concurrent_tasks,
        task_timeout_s=positive(ns.task_timeout, "--task-timeout") if ns.task_timeout is not None else None,
        cache_models=ns.cache_models, mixed_precision=ns.mixed_precision, optimize_for=ns.optimize_for,
        cuda_streams=int(positive(ns.cuda_streams, "--cuda-streams")) if ns.cuda_streams is not None else None,
        bench_threads=int(positive(ns.bench_threads, "--bench-threads")) if ns.bench_threads is not None else None,
        **kwargs,  # type: ignore[arg-type]
    )


async def run_worker(config: WorkerConfig) -> int:
    from ..worker.factory import build_agent

    agent = await build_agent(config)
    runner = asyncio.create_task(agent.run(), name="worker-agent")
    signalled = asyncio.create_task(wait_for_signal(), name="worker-signals")
    done, _ = await asyncio.wait({runner, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if signalled in done:
        log.info("received %s; stopping", signalled.result().name)
        agent.stop()
    else:
        signalled.cancel()
    try:
        await runner
    except RetriesExhausted as exc:
        log.error("%s", exc)
        return 1
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await signalled
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    setup_logging(ns.log_level)
    try:
        config = config_from_args(ns, environ())
        return asyncio.run(run_worker(config))
    except (ConfigError, SessionRejected) as exc:
        print(f"dt-worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
