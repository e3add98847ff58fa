"""``dt-worker`` / ``run_worker_example.py``: run a worker.

Flags follow the worker guide; variables DT_COORDINATOR_URL, DT_API_KEY, DT_API_KEY_FILE,
DT_WORKER_NAME, DT_DB_PATH, DT_INTERFACE, DT_CA_FILE, DT_ALLOW_MODEL_MODULES and
DT_ALLOW_TEST_OPTIONS, DT_METRICS_PORT, DT_METRICS_HOST, DT_HIGH_AVAILABILITY and DT_PIPELINE_DEPTH
stand in for --coordinator, --api-key, --api-key-file, --name, --db-path, --interface, --ca-file,
--allow-model-modules, --allow-test-options, --metrics-port, --metrics-host, --high-availability
and --pipeline-depth (flags win). Once the
configuration is read, the credential variables are removed from the process environment, so no
task child inherits them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from .. import aio
from ..childenv import scrub_environ
from ..config import (
    DEFAULT_COORDINATOR_URL,
    WorkerConfig,
    env_pick,
    environ,
    parse_urls,
    positive,
    read_key_file,
)
from ..errors import ConfigError
from ..netif import InterfaceError, interface_address
from ..promhttp import serve_metrics
from ..protocol.messages import MAX_PIPELINE_DEPTH
from ..retry import RetriesExhausted
from ..tasks.pytest_args import parse_test_options
from ..tasks.usercode import parse_module_prefixes
from ..worker import metrics as worker_metrics
from ..worker.agent import WorkerAgent
from ..worker.limits import PROFILES, gpu_unavailable_reason, profile_settings, swap_unavailable_reason
from ..worker.session import SessionRejected
from .common import add_log_flag, metrics_port, setup_logging, tune_gc

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-worker", description="Run a distributed_testing worker.",
                                epilog=aio.HELP)
    p.add_argument("--coordinator",
                   help="coordinator http(s) URL, or several comma-separated (the members of an HA group): each "
                        "connection attempt takes the next one, and a standby's answer naming the leader is followed "
                        "when the leader is a member (configured, or listed by a member's GET /api/v1/cluster; never "
                        "from https to http) "
                        f"(default {DEFAULT_COORDINATOR_URL}; env DT_COORDINATOR_URL)")
    p.add_argument("--high-availability", action="store_true", default=None,
                   help="for an HA group of coordinators: also learn every member from GET /api/v1/cluster at each "
                        "connect; after a failure try the next coordinator at once (the leader named by a standby "
                        "first), pausing only between full rounds of every known coordinator (0.1 s, doubling up to "
                        "--reconnect-interval); never give up (--reconnect-attempts is ignored); send heartbeats "
                        "every half of the interval the coordinator grants and pings every half of its TTL "
                        "(env DT_HIGH_AVAILABILITY=1/0)")
    auth = p.add_argument_group("authentication (one of)")
    auth.add_argument("--api-key", help="API key with the worker role (env DT_API_KEY); on the command line "
                                        "every local user can read it in ps: prefer --api-key-file or DT_API_KEY")
    auth.add_argument("--api-key-file", type=Path, help="file holding the API key (env DT_API_KEY_FILE)")
    auth.add_argument("--token", help="JWT for a worker key; renewed before it expires")
    auth.add_argument("--token-file", type=Path, help="file holding a JWT; re-read at each reconnect")
    p.add_argument("--ca-file", type=Path,
                   help="PEM CA bundle to verify an https coordinator's certificate with (default: the system's CAs; "
                        "env DT_CA_FILE)")
    p.add_argument("--name", help="friendly name (default: hostname; env DT_WORKER_NAME)")
    p.add_argument("--worker-id", help="stable worker id (default: a new random id per start)")
    p.add_argument("--tags", default="", help="comma-separated capability tags, e.g. gpu,cuda,transformers")
    p.add_argument("--db-path", type=Path, help="DuckDB file for the result outbox (default: in memory; env DT_DB_PATH)")
    p.add_argument("--test-root", type=Path, help="directory test_file paths resolve under (default: current directory)")
    p.add_argument("--heartbeat-interval", type=float,
                   help="seconds between heartbeats, asked of the coordinator at registration: it answers with the TTL it "
                        "applies (at least 3 intervals by default; the worker pings once per TTL), or refuses an "
                        "interval above its --max-heartbeat-interval (exit 2) (default: the coordinator's "
                        "--heartbeat-interval)")
    p.add_argument("--reconnect-attempts", type=int, default=10,
                   help="consecutive failed connects before giving up (default 10; not with --high-availability)")
    p.add_argument("--reconnect-interval", type=float, default=1.0, help="delay before retrying a failed connect in seconds; doubles with jitter (default 1); the first "
                        "reconnect after a lost session waits a random 0..min(1, this) s")
    p.add_argument("--profile", choices=PROFILES,
                   help="preset of concurrency, task timeout and limits (see README); explicit flags win")
    p.add_argument("--max-concurrent-tasks", type=int, help="tasks run at once (default 1, or the profile's)")
    p.add_argument("--pipeline-depth", metavar="N",
                   help="short tasks the coordinator may send beyond --max-concurrent-tasks, queued here to start "
                        "as slots free, so a worker does not wait a round trip between millisecond tasks; the "
                        "coordinator sends fewer (none for tasks of 20 ms or more) and never queues anything "
                        f"behind a benchmark or training task; 0 turns pipelining off (0..{MAX_PIPELINE_DEPTH}, "
                        "default 64; env DT_PIPELINE_DEPTH)")
    p.add_argument("--task-timeout", type=float, help="seconds a task may run when it sets no timeout_s (default: none)")
    limits = p.add_argument_group("resource limits (over a limit: no new tasks until back under it for the cool-down)")
    limits.add_argument("--max-cpu-percent", type=float, help="system-wide CPU use above which no new task is taken")
    limits.add_argument("--max-memory-percent", type=float, help="memory use above which no new task is taken")
    limits.add_argument("--max-gpu-percent", type=float, help="busiest NVIDIA GPU's utilisation above which no new task is taken")
    limits.add_argument("--memory-buffer", type=float,
                        help="fraction of memory (0..0.9) kept free: tasks get available memory minus this")
    limits.add_argument("--enable-swap", action="store_true",
                        help="count swap as memory overflow: --max-memory-percent, --memory-buffer and the memory "
                             "offered to tasks see RAM + swap (needs one of those limits, and swap on the machine)")
    limits.add_argument("--limit-cooldown", type=float, default=10.0,
                        help="seconds back under every limit before taking tasks again (default 10)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: seconds running tasks may finish before they are handed back (default 30)")
    state = p.add_argument_group("local state (need --db-path)")
    state.add_argument("--recover", action="store_true",
                       help="at start, report unacknowledged results and tasks interrupted by a crash (as retryable errors)")
    state.add_argument("--reset-state", action="store_true",
                       help="at start, delete the outbox database, its journal and the cache directory; with "
                            "--recover, only after reporting what --recover reports and the coordinator acknowledging it")
    bench = p.add_argument_group("benchmark tasks")
    bench.add_argument("--cache-models", action="store_true", help="keep the benchmark process and its loaded models between tasks")
    bench.add_argument("--mixed-precision", action="store_true", help="autocast by default for fp32 torch benchmarks that do not set autocast")
    bench.add_argument("--optimize-for", choices=["throughput", "latency"], help="default optimize_for of benchmark tasks (see docs/tasks.md)")
    bench.add_argument("--cuda-streams", type=int, help="default cuda_streams of benchmark tasks (CUDA only)")
    bench.add_argument("--bench-threads", type=int, help="torch intra-op threads of benchmark tasks that set no 'threads' (default: 1, as torch.utils.benchmark)")
    mon = p.add_argument_group("monitoring")
    mon.add_argument("--metrics-port", metavar="PORT",
                     help="serve GET /metrics (Prometheus text, no credential) on this port, 0 for any free one "
                          "(default: not served; env DT_METRICS_PORT)")
    mon.add_argument("--metrics-host", metavar="ADDR",
                     help="address --metrics-port binds (default 127.0.0.1; env DT_METRICS_HOST)")
    train = p.add_argument_group("multi-node training tasks")
    train.add_argument("--interface", metavar="NAME",
                       help="network interface other workers reach this one on, and that gloo/NCCL bind "
                            "(default: the one that routes to the coordinator; env DT_INTERFACE)")
    trust = p.add_argument_group("what task submitters may run here (see docs/security.md)")
    trust.add_argument("--allow-model-modules", metavar="PREFIXES",
                       help="comma-separated module prefixes whose 'module:callable' models benchmark and "
                            "training tasks may import, e.g. mypkg.models (default: none; env DT_ALLOW_MODEL_MODULES)")
    trust.add_argument("--allow-test-options", metavar="OPTIONS",
                       help="comma-separated guarded pytest options test_args may use, dashes optional, e.g. "
                            "junitxml,debug or =--junitxml,-p (default: none; env DT_ALLOW_TEST_OPTIONS)")
    trust.add_argument("--accept-bundles", action="store_true", default=None,
                       help="run tasks with shipped code (a bundle), each in a sandbox (env DT_ACCEPT_BUNDLES=1)")
    trust.add_argument("--sandbox", choices=("bwrap", "none"),
                       help="how shipped code is confined: bwrap (bubblewrap; without it such tasks are refused) or "
                            "none (unconfined, logged as a warning at every start) (default bwrap; env DT_SANDBOX)")
    trust.add_argument("--task-network", choices=("none", "loopback", "host"),
                       help="a sandboxed task's network: none, a private loopback, or the host's (default loopback; "
                            "env DT_TASK_NETWORK)")
    trust.add_argument("--cache-max-gb", type=float, metavar="GB",
                       help="size cap of the bundle blob cache, least recently used evicted first (default 10; env "
                            "DT_CACHE_MAX_GB)")
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    url, url_src = env_pick(ns.coordinator, env, "DT_COORDINATOR_URL", DEFAULT_COORDINATOR_URL)
    api_key = _api_key(ns, env)
    name, _ = env_pick(ns.name, env, "DT_WORKER_NAME")
    ca_file, _ = env_pick(str(ns.ca_file) if ns.ca_file else None, env, "DT_CA_FILE")
    db, _ = env_pick(str(ns.db_path) if ns.db_path else None, env, "DT_DB_PATH")
    if ns.reconnect_attempts < 1:
        raise ConfigError(f"--reconnect-attempts: must be >= 1, got {ns.reconnect_attempts}")
    preset = profile_settings(ns.profile, os.cpu_count() or 1) if ns.profile else {}
    if ns.max_concurrent_tasks is not None:
        preset["max_concurrent_tasks"] = ns.max_concurrent_tasks
        if ns.max_concurrent_tasks < 1:
            raise ConfigError(f"--max-concurrent-tasks: must be >= 1, got {ns.max_concurrent_tasks}")
    if ns.task_timeout is not None:
        preset["task_timeout_s"] = positive(ns.task_timeout, "--task-timeout")
    preset.update(_limit_flags(ns))
    if ns.enable_swap:
        preset["enable_swap"] = _enable_swap(preset)
    db_path = Path(db) if db else None
    for flag, on in (("--recover", ns.recover), ("--reset-state", ns.reset_state)):
        if on and db_path is None:
            raise ConfigError(f"{flag}: needs --db-path (or DT_DB_PATH); without it the worker keeps no local state")
    test_root = (ns.test_root or Path.cwd()).resolve()
    if not test_root.is_dir():
        raise ConfigError(f"--test-root: {test_root} is not a directory")
    kwargs = {"name": name} if name else {}
    if ns.worker_id:
        kwargs["worker_id"] = ns.worker_id
    urls = parse_urls(url or DEFAULT_COORDINATOR_URL, "--coordinator" if url_src == "flag" else url_src)
    return WorkerConfig(
        coordinator_url=urls[0], coordinator_urls=urls, high_availability=_high_availability(ns, env),
        api_key=api_key, token=ns.token, token_file=ns.token_file, ca_file=Path(ca_file) if ca_file else None,
        tags=tuple(t.strip() for t in ns.tags.split(",") if t.strip()),
        db_path=db_path, test_root=test_root,
        heartbeat_interval_s=_heartbeat_interval(ns.heartbeat_interval),
        reconnect_attempts=ns.reconnect_attempts,
        reconnect_interval_s=positive(ns.reconnect_interval, "--reconnect-interval"),
        limit_cooldown_s=positive(ns.limit_cooldown, "--limit-cooldown", allow_zero=True),
        drain_timeout_s=positive(ns.drain_timeout, "--drain-timeout", allow_zero=True),
        profile=ns.profile, recover=ns.recover, reset_state=ns.reset_state,
        cache_models=ns.cache_models, mixed_precision=ns.mixed_precision, optimize_for=ns.optimize_for,
        cuda_streams=int(positive(ns.cuda_streams, "--cuda-streams")) if ns.cuda_streams is not None else None,
        bench_threads=int(positive(ns.bench_threads, "--bench-threads")) if ns.bench_threads is not None else None,
        interface=_interface(ns, env), allow_model_modules=_allow_model_modules(ns, env),
        pipeline_depth=_pipeline_depth(ns, env),
        allow_test_options=_allow_test_options(ns, env), **_metrics(ns, env), **_shipped(ns, env),
        **preset, **kwargs,  # type: ignore[arg-type]
    )


def _shipped(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """--accept-bundles, --sandbox, --task-network, --cache-max-gb (and their DT_* variables)."""
    accept = ns.accept_bundles or env.get("DT_ACCEPT_BUNDLES", "").strip().lower() in ("1", "true", "yes")
    sandbox, s_src = env_pick(ns.sandbox, env, "DT_SANDBOX", "bwrap")
    network, n_src = env_pick(ns.task_network, env, "DT_TASK_NETWORK", "loopback")
    if sandbox not in ("bwrap", "none"):
        raise ConfigError(f"{s_src}: must be bwrap or none, got {sandbox!r}")
    if network not in ("none", "loopback", "host"):
        raise ConfigError(f"{n_src}: must be none, loopback or host, got {network!r}")
    raw, c_src = env_pick(None if ns.cache_max_gb is None else str(ns.cache_max_gb), env, "DT_CACHE_MAX_GB", "10")
    try:
        cache = float(str(raw))
    except ValueError:
        cache = -1.0
    if not cache > 0:
        raise ConfigError(f"{'--cache-max-gb' if c_src in ('flag', 'default') else c_src}: must be a number of GB > 0, "
                          f"got {raw!r}")
    return {"accept_bundles": bool(accept), "sandbox": sandbox, "task_network": network, "cache_max_gb": cache}


def _pipeline_depth(ns: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``--pipeline-depth`` / DT_PIPELINE_DEPTH: an integer 0..MAX_PIPELINE_DEPTH (default 64)."""
    raw, src = env_pick(ns.pipeline_depth, env, "DT_PIPELINE_DEPTH", str(WorkerConfig.pipeline_depth))
    where = "--pipeline-depth" if src in ("flag", "default") else src
    try:
        depth = int(str(raw))
    except ValueError:
        raise ConfigError(f"{where}: expected a whole number of tasks, got {raw!r}") from None
    if not 0 <= depth <= MAX_PIPELINE_DEPTH:
        raise ConfigError(f"{where}: must be 0..{MAX_PIPELINE_DEPTH} (0: no pipelining), got {depth}")
    return depth


def _high_availability(ns: argparse.Namespace, env: Mapping[str, str]) -> bool:
    """``--high-availability``, else DT_HIGH_AVAILABILITY (1/true/yes or 0/false/no)."""
    if ns.high_availability:
        return True
    raw = env.get("DT_HIGH_AVAILABILITY", "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"DT_HIGH_AVAILABILITY: must be 1/true/yes or 0/false/no, got {env['DT_HIGH_AVAILABILITY']!r}")


def _heartbeat_interval(value: float | None) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value):
        raise ConfigError(f"--heartbeat-interval: must be a finite number of seconds, got {value}")
    return positive(value, "--heartbeat-interval")


def _api_key(ns: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """--api-key, --api-key-file, DT_API_KEY, DT_API_KEY_FILE: the first one given. An explicit
    --token or --token-file beats a key from the environment."""
    if ns.api_key and ns.api_key_file:
        raise ConfigError("--api-key and --api-key-file: give one (the file keeps the key out of ps)")
    if ns.api_key or ns.api_key_file:
        return ns.api_key or read_key_file(ns.api_key_file, "--api-key-file")
    if ns.token or ns.token_file:
        return None
    if env.get("DT_API_KEY"):
        return env["DT_API_KEY"]
    if env.get("DT_API_KEY_FILE"):
        return read_key_file(Path(env["DT_API_KEY_FILE"]), "DT_API_KEY_FILE")
    return None


def _allow_model_modules(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ...]:
    """--allow-model-modules or DT_ALLOW_MODEL_MODULES, validated (default: none)."""
    modules, src = env_pick(ns.allow_model_modules, env, "DT_ALLOW_MODEL_MODULES", "")
    return parse_module_prefixes(modules or "", "--allow-model-modules" if src == "flag" else src)


def _allow_test_options(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ...]:
    """--allow-test-options or DT_ALLOW_TEST_OPTIONS, validated (default: none)."""
    options, src = env_pick(ns.allow_test_options, env, "DT_ALLOW_TEST_OPTIONS", "")
    return parse_test_options(options or "", "--allow-test-options" if src == "flag" else src)


def _interface(ns: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """``--interface`` / DT_INTERFACE, checked now: it must exist, be up and have an address."""
    name, src = env_pick(ns.interface, env, "DT_INTERFACE")
    if not name:
        return None
    source = "--interface" if src == "flag" else src
    addresses = psutil.net_if_addrs()
    if name not in addresses:
        raise ConfigError(f"{source}: network interface {name!r} does not exist on this machine "
                          f"(it has: {', '.join(sorted(addresses))})")
    stats = psutil.net_if_stats().get(name)
    if stats is not None and not stats.isup:
        raise ConfigError(f"{source}: network interface {name!r} is down")
    try:
        interface_address(name)
    except InterfaceError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return name


def _limit_flags(ns: argparse.Namespace) -> dict[str, float]:
    """The resource-limit flags that were given, validated."""
    out: dict[str, float] = {}
    for flag, field_name in (("--max-cpu-percent", "max_cpu_percent"), ("--max-memory-percent", "max_memory_percent"),
                             ("--max-gpu-percent", "max_gpu_percent")):
        value = getattr(ns, field_name)
        if value is not None:
            if not 0 < value <= 100:
                raise ConfigError(f"{flag}: must be a percentage in (0, 100], got {value:g}")
            out[field_name] = value
    if ns.max_gpu_percent is not None and (why := gpu_unavailable_reason()) is not None:
        raise ConfigError(f"--max-gpu-percent: needs an NVIDIA GPU readable through NVML: {why}")
    if ns.memory_buffer is not None:
        if not 0 <= ns.memory_buffer <= 0.9:
            raise ConfigError(f"--memory-buffer: must be a fraction in [0, 0.9], got {ns.memory_buffer:g}")
        out["memory_buffer"] = ns.memory_buffer
    return out


def _metrics(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """``--metrics-port`` / DT_METRICS_PORT and ``--metrics-host`` / DT_METRICS_HOST."""
    port = metrics_port(ns.metrics_port, env)
    if port is None:
        return {}
    host, _ = env_pick(ns.metrics_host, env, "DT_METRICS_HOST", "127.0.0.1")
    return {"metrics_port": port, "metrics_host": host}


def _enable_swap(limits: Mapping[str, object]) -> bool:
    """--enable-swap is refused where it would change nothing: without a memory limit to count
    swap in, or on a machine without swap."""
    if limits.get("memory_buffer") is None and limits.get("max_memory_percent") is None:
        raise ConfigError("--enable-swap: counts swap in --memory-buffer and --max-memory-percent; give one of them "
                          "(or a --profile that sets one)")
    if (why := swap_unavailable_reason()) is not None:
        raise ConfigError(f"--enable-swap: {why}; add swap space (swapon) or drop the flag")
    return True


async def run_worker(config: WorkerConfig) -> int:
    from ..worker.factory import build_agent

    if config.reset_state:
        from ..worker.reset import RecoveryIncomplete, recover_then_reset, reset_local_state

        if config.recover:  # report first, reset once the coordinator holds every report
            try:
                await recover_then_reset(config)
            except (RecoveryIncomplete, RetriesExhausted) as exc:
                log.error("%s", exc)
                return 1
            config = dataclasses.replace(config, recover=False)  # the fresh state has nothing to recover
        else:
            await asyncio.to_thread(reset_local_state, config)
    agent = await build_agent(config)
    metrics = None
    if config.metrics_port is not None:
        metrics = await _serve_metrics(agent, config.metrics_host, config.metrics_port)
    try:
        return await _run_agent(agent)
    finally:
        if metrics is not None:
            await metrics.cleanup()


async def _serve_metrics(agent: WorkerAgent, host: str, port: int) -> web.AppRunner:
    registry = worker_metrics.registry_for(agent)
    runner, bound = await serve_metrics(lambda: worker_metrics.render(registry), host, port)
    log.info("metrics on http://%s:%d/metrics (no credential)", host, bound)
    return runner


async def _run_agent(agent: WorkerAgent) -> int:
    runner = asyncio.create_task(agent.run(), name="worker-agent")
    with _Signals() as signals:
        first = asyncio.create_task(signals.next(), name="worker-signals")
        done, _ = await asyncio.wait({runner, first}, return_when=asyncio.FIRST_COMPLETED)
        if first in done:
            await _drain_or_stop(agent, runner, signals, first.result())
        else:
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
        try:
            await runner
        except RetriesExhausted as exc:
            log.error("%s", exc)
            return 1
    return 0


async def _drain_or_stop(agent: WorkerAgent, runner: asyncio.Task[None], signals: _Signals, sig: signal.Signals) -> None:
    """First signal: drain (finish, hand back, flush, goodbye). A second one: stop at once."""
    log.info("received %s; draining (send it again to stop at once)", sig.name)
    drain = asyncio.create_task(agent.drain(f"received {sig.name}"), name="worker-drain")
    second = asyncio.create_task(signals.next(), name="worker-signals")
    done, _ = await asyncio.wait({runner, second}, return_when=asyncio.FIRST_COMPLETED)
    if second in done:
        log.warning("received %s again; stopping now", second.result().name)
        drain.cancel()
        agent.stop()
    else:
        second.cancel()
    for t in (drain, second):
        with contextlib.suppress(asyncio.CancelledError):
            await t


class _Signals:
    """SIGINT and SIGTERM as a queue, for as long as the ``with`` block lasts."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> _Signals:
        self._q: asyncio.Queue[signal.Signals] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self._q.put_nowait, sig)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.remove_signal_handler(sig)

    async def next(self) -> signal.Signals:
        return await self._q.get()


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    setup_logging(ns.log_level)
    try:
        config = config_from_args(ns, environ())
        scrub_environ(os.environ, [s for s in (config.api_key, config.token) if s])
        loop = aio.loop_choice()
        tune_gc()
        return aio.run(run_worker(config), loop)
    except (ConfigError, SessionRejected) as exc:
        print(f"dt-worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
