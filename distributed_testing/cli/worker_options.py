"""The worker's settings: one row per flag (its variable, type, bounds, default, help and README
text). ``cli/worker.py`` builds its parser and reads its configuration from this table;
``scripts/gen_options.py`` writes README.md's "Worker options" table from it. Add a flag here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from ..config import DEFAULT_COORDINATOR_URL, parse_urls
from ..errors import ConfigError
from ..process.netif import InterfaceError, interface_address
from ..protocol.messages import MAX_PIPELINE_DEPTH
from ..tasks.pytest_args import parse_test_options
from ..tasks.usercode import parse_module_prefixes
from ..worker.limits import PROFILES, gpu_unavailable_reason
from .options import SWITCH, Setting


def _tags(text: str, source: str) -> tuple[str, ...]:
    tags = tuple(t.strip() for t in text.split(",") if t.strip())
    if text.strip() and not tags:  # "," or " , ": a typo, not a wish for no tags (that is leaving it out)
        raise ConfigError(f"{source}: {text!r} names no tag; give comma-separated tags such as gpu,cuda")
    return tags


def _gpu(value: float, source: str) -> float:
    if (why := gpu_unavailable_reason()) is not None:
        raise ConfigError(f"{source}: needs an NVIDIA GPU readable through NVML: {why}")
    return value


def _interface(name: str, source: str) -> str | None:
    """Checked now: the interface must exist, be up and have an address."""
    if not name:
        return None
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


GROUPS = {
    "auth": "authentication (one of)",
    "limits": "resource limits (over a limit: no new tasks until back under it for the cool-down)",
    "state": "local state (need --db-path)",
    "bench": "benchmark tasks",
    "mon": "monitoring",
    "train": "multi-node training tasks",
    "trust": "what task submitters may run here (see docs/security.md)",
}
PERCENT: dict[str, Any] = {"type": float, "lo": 0, "hi": 100, "lo_open": True, "bounds": "a percentage in (0, 100]",
                           "metavar": "P", "group": "limits"}

WORKER_SETTINGS: tuple[Setting, ...] = (
    Setting("--coordinator", field="coordinator_urls", env="DT_COORDINATOR_URL", metavar="URL[,URL...]",
            default=(DEFAULT_COORDINATOR_URL,), check=parse_urls,
            help="coordinator http(s) URL, or several comma-separated (the members of an HA group): each "
                 "connection attempt takes the next one, and a standby's answer naming the leader is followed "
                 "when the leader is a member (configured, or listed by a member's GET /api/v1/cluster; never "
                 f"from https to http) (default {DEFAULT_COORDINATOR_URL})",
            doc="coordinator http(s) URL (default `http://localhost:8080`), or the comma-separated members of an "
                "HA group: each connect attempt takes the next one, and a standby's answer naming the leader sends "
                "the next attempt there when the leader is a member (configured, or listed by a member's "
                "`GET /api/v1/cluster`; never from https to http)"),
    Setting("--high-availability", type=SWITCH, env="DT_HIGH_AVAILABILITY", default=False,
            help="for an HA group of coordinators: also learn every member from GET /api/v1/cluster at each "
                 "connect; after a failure try the next coordinator at once (the leader named by a standby "
                 "first), pausing only between full rounds of every known coordinator (0.1 s, doubling up to "
                 "--reconnect-interval); never give up (--reconnect-attempts is ignored); send heartbeats "
                 "every half of the interval the coordinator grants and pings every half of its TTL",
            doc="for an HA group ([docs/operations.md](docs/operations.md#high-availability)): learn every member "
                "from `GET /api/v1/cluster` at each connect; after a failure try the next coordinator at once (a "
                "named leader first) and pause only between full rounds of all of them (0.1 s, doubling up to "
                "`--reconnect-interval`); never give up (`--reconnect-attempts` is ignored); send heartbeats every "
                "half of the interval the coordinator grants and pings every half of the TTL. Running tasks keep "
                "running across the switch and their results reach the new leader through the outbox"),
    # the credentials: config_from_args picks one (rules between them); read=False rows
    Setting("--api-key", env="DT_API_KEY", metavar="KEY", group="auth", read=False,
            help="API key with the worker role; on the command line every local user can read it in ps: "
                 "prefer --api-key-file or DT_API_KEY",
            doc="API key with the `worker` role. On the command line every local user can read it (`ps`, "
                "`/proc/PID/cmdline`): prefer `--api-key-file` or the variable"),
    Setting("--api-key-file", type=Path, env="DT_API_KEY_FILE", metavar="PATH", group="auth", read=False,
            help="file holding the API key", doc="file holding the API key (keep it mode 0600); not with `--api-key`"),
    Setting("--token", metavar="JWT", group="auth", help="JWT for a worker key; renewed before it expires",
            doc="a JWT instead of a key; renewed before it expires, up to the coordinator's `--max-session-age`"),
    Setting("--token-file", type=Path, metavar="PATH", group="auth",
            help="file holding a JWT; re-read at each reconnect"),
    Setting("--ca-file", type=Path, env="DT_CA_FILE", metavar="PATH",
            help="PEM CA bundle to verify an https coordinator's certificate with (default: the system's CAs)",
            doc="PEM CA bundle that an `https` coordinator's certificate must chain to (default: the system's CAs)"),
    Setting("--name", env="DT_WORKER_NAME", metavar="NAME", help="friendly name (default: hostname)"),
    Setting("--worker-id", metavar="ID", help="stable worker id (default: a new random id per start)",
            doc="stable id; a restarted worker with the same id gets its running tasks reconciled"),
    Setting("--tags", metavar="a,b", default=(), check=_tags,
            help="comma-separated capability tags, e.g. gpu,cuda,transformers",
            doc="extra capability tags that tasks can require"),
    Setting("--db-path", type=Path, env="DT_DB_PATH", metavar="PATH",
            help="DuckDB file for the result outbox (default: in memory)",
            doc="DuckDB file for the durable result outbox (default: in memory); files 0600, a directory it "
                "creates 0700"),
    Setting("--test-root", type=Path, metavar="DIR",
            help="directory test_file paths resolve under (default: current directory)",
            doc="where `test_file` paths and `test_args` test paths resolve; paths escaping it are rejected"),
    Setting("--allow-model-modules", env="DT_ALLOW_MODEL_MODULES", metavar="PREFIXES", group="trust", default=(),
            check=parse_module_prefixes, shown="--allow-model-modules a.b,c",
            help="comma-separated module prefixes whose 'module:callable' models benchmark and training tasks "
                 "may import, e.g. mypkg.models (default: none)",
            doc="module prefixes whose `module:callable` models benchmark and training tasks may import here "
                "(default: none; see [docs/security.md](docs/security.md#what-a-submitter-can-make-a-worker-run))"),
    Setting("--allow-test-options", env="DT_ALLOW_TEST_OPTIONS", metavar="OPTIONS", group="trust", default=(),
            check=parse_test_options, shown="--allow-test-options=--debug,...",
            help="comma-separated guarded pytest options test_args may use, dashes optional, e.g. "
                 "junitxml,debug or =--junitxml,-p (default: none)",
            doc="guarded pytest options `test_args` may use here, e.g. `junitxml` (default: none; "
                "docs/security.md lists them)"),
    Setting("--heartbeat-interval", type=float, lo=0, lo_open=True, metavar="S", field="heartbeat_interval_s",
            help="seconds between heartbeats, asked of the coordinator at registration: it answers with the TTL it "
                 "applies (at least 3 intervals by default; the worker pings once per TTL), or refuses an "
                 "interval above its --max-heartbeat-interval (exit 2) (default: the coordinator's "
                 "--heartbeat-interval)",
            doc="seconds between heartbeats, asked of the coordinator at registration: it answers with the TTL it "
                "applies to this worker (3 intervals, at least its `--worker-ttl`; the worker pings the "
                "coordinator once per TTL), or refuses an interval above its `--max-heartbeat-interval` (default "
                "60 s; exit 2). Default: the coordinator's `--heartbeat-interval` (1 s). See "
                "[docs/operations.md](docs/operations.md#liveness)"),
    Setting("--reconnect-attempts", type=int, lo=1, default=10, metavar="N",
            help="consecutive failed connects before giving up, exit 1 with one line saying whether any "
                 "coordinator was ever reached (default 10; not with --high-availability)",
            doc="consecutive failed connects before exiting 1, with one line on stderr saying whether any coordinator "
                "was ever reached and the last error (default 10; not with `--high-availability`)"),
    Setting("--reconnect-interval", type=float, lo=0, lo_open=True, default=1.0, metavar="S",
            field="reconnect_interval_s",
            help="delay before retrying a failed connect in seconds; doubles with jitter up to 30 s (or this "
                 "delay when it is longer), jitter included (default 1); the first reconnect after a lost session "
                 "waits a random 0..min(1, this) s",
            doc="delay before retrying a failed connect; doubles with jitter up to 30 s (or S when longer), jitter "
                "included (default 1); the first reconnect after a lost session waits a random 0..min(1, S) s"),
    Setting("--profile", choices=PROFILES, metavar="{" + ",".join(PROFILES) + "}",
            shown="--profile " + "\\|".join(PROFILES),
            help="preset of concurrency, task timeout and limits (see README); explicit flags win",
            doc="preset of concurrency, task timeout and limits (table below)"),
    Setting("--max-concurrent-tasks", type=int, lo=1, metavar="N", help="tasks run at once (default 1, or the profile's)",
            doc="tasks at once (default 1, or the profile's)"),
    Setting("--pipeline-depth", type=int, env="DT_PIPELINE_DEPTH", lo=0, hi=MAX_PIPELINE_DEPTH, default=MAX_PIPELINE_DEPTH,
            metavar="N",
            help="short tasks the coordinator may send beyond --max-concurrent-tasks, queued here to start "
                 "as slots free, so a worker does not wait a round trip between millisecond tasks; the "
                 "coordinator sends fewer (none for tasks of 20 ms or more) and never queues anything "
                 f"behind a benchmark or training task; 0 turns pipelining off (0..{MAX_PIPELINE_DEPTH}, "
                 f"default {MAX_PIPELINE_DEPTH})",
            doc="short tasks the coordinator may send beyond the slots, queued to start as slots free, so a "
                f"one-slot worker does not wait a round trip between millisecond tasks (0..{MAX_PIPELINE_DEPTH}, "
                f"default {MAX_PIPELINE_DEPTH}; 0: off). The coordinator sends fewer, none once tasks take 20 ms, never queues "
                "anything behind a benchmark or training task, and takes queued tasks back for an idle worker "
                "(see [docs/protocol.md](docs/protocol.md#pipelining))"),
    Setting("--task-timeout", type=float, lo=0, lo_open=True, metavar="S", field="task_timeout_s",
            help="seconds a task may run when it sets no timeout_s (default: none)",
            doc="timeout for tasks that set no `timeout_s` (default none, or the profile's)"),
    Setting("--max-cpu-percent", **PERCENT, help="system-wide CPU use above which no new task is taken",
            doc="system-wide CPU % above which the worker is `constrained` (takes no new task)"),
    Setting("--max-memory-percent", **PERCENT, help="memory use above which no new task is taken",
            doc="memory % above which the worker is `constrained`"),
    Setting("--max-gpu-percent", **PERCENT, check=_gpu,
            help="busiest NVIDIA GPU's utilisation above which no new task is taken",
            doc="busiest NVIDIA GPU's utilisation % above which it is `constrained`; refused at start when NVML "
                "sees no GPU"),
    Setting("--limit-cooldown", type=float, lo=0, default=10.0, metavar="S", group="limits", field="limit_cooldown_s",
            help="seconds back under every limit before taking tasks again (default 10)",
            doc="seconds back under every limit before it is `ready` again (default 10)"),
    Setting("--memory-buffer", type=float, lo=0, hi=0.9, bounds="a fraction in [0, 0.9]", metavar="F", group="limits",
            help="fraction of memory (0..0.9) kept free: tasks get available memory minus this",
            doc="fraction (0..0.9) of memory kept free: less free is `constrained`, and tasks whose "
                "`max_memory_mb` exceeds available minus the buffer go elsewhere"),
    Setting("--enable-swap", type=SWITCH, default=False, group="limits",
            help="count swap as memory overflow: --max-memory-percent, --memory-buffer and the memory "
                 "offered to tasks see RAM + swap (needs one of those limits, and swap on the machine)",
            doc="count swap as memory overflow: `--max-memory-percent`, `--memory-buffer` and the memory offered "
                "to tasks see RAM + swap (free swap is available memory). Refused at start without one of those "
                "limits or on a machine without swap"),
    Setting("--drain-timeout", type=float, lo=0, default=30.0, metavar="S", field="drain_timeout_s",
            help="on SIGTERM/SIGINT: seconds running tasks may finish before they are handed back (default 30)"),
    Setting("--recover", type=SWITCH, default=False, group="state",
            help="at start, report unacknowledged results and tasks interrupted by a crash (as retryable errors)",
            doc="with `--db-path`: at start, log unacknowledged results and report tasks a crash interrupted as "
                "retryable errors"),
    Setting("--reset-state", type=SWITCH, default=False, group="state",
            help="at start, delete the outbox database, its journal and the cache directory; with "
                 "--recover, only after reporting what --recover reports and the coordinator acknowledging it",
            doc="with `--db-path`: at start, delete the outbox database, its journal and the cache directory. "
                "With `--recover` (the guide's `--recover --reset-state`): first report what `--recover` reports "
                "and wait for the coordinator to acknowledge all of it (up to `--drain-timeout`), then reset; what "
                "cannot be delivered keeps the state (exit 1)"),
    Setting("--cache-models", type=SWITCH, default=False, group="bench",
            help="keep the benchmark process and its loaded models between tasks"),
    Setting("--mixed-precision", type=SWITCH, default=False, group="bench",
            help="autocast by default for fp32 torch benchmarks that do not set autocast",
            doc="autocast by default for fp32 torch benchmarks"),
    Setting("--optimize-for", choices=("throughput", "latency"), metavar="{throughput,latency}", group="bench",
            shown="--optimize-for throughput\\|latency",
            help="default optimize_for of benchmark tasks (see docs/tasks.md)",
            doc="default `optimize_for` of benchmark tasks"),
    Setting("--cuda-streams", type=int, lo=0, lo_open=True, metavar="N", group="bench",
            help="default cuda_streams of benchmark tasks (CUDA only)",
            doc="default `cuda_streams` of benchmark tasks (CUDA only)"),
    Setting("--bench-threads", type=int, lo=0, lo_open=True, metavar="N", group="bench",
            help="torch intra-op threads of benchmark tasks that set no 'threads' (default: 1, as "
                 "torch.utils.benchmark)"),
    Setting("--metrics-port", type=int, env="DT_METRICS_PORT", lo=0, hi=65535, metavar="PORT", group="mon",
            help="serve GET /metrics (Prometheus text, no credential) on this port, 0 for any free one "
                 "(default: not served)",
            doc="serve `GET /metrics` (Prometheus text, no credential) on this port, 0 for any free one (default: "
                "not served); metric names in [docs/operations.md](docs/operations.md#metrics)"),
    Setting("--metrics-host", env="DT_METRICS_HOST", default="127.0.0.1", metavar="ADDR", group="mon",
            help="address --metrics-port binds (default 127.0.0.1)",
            doc="address `--metrics-port` binds (default 127.0.0.1)"),
    Setting("--interface", env="DT_INTERFACE", metavar="NAME", group="train", check=_interface,
            help="network interface other workers reach this one on, and that gloo/NCCL bind "
                 "(default: the one that routes to the coordinator)",
            doc="NIC for multi-node training: its address is the one reported to gang peers, and the pre-flight, "
                "gloo and NCCL bind it (default: the NIC that carries the coordinator connection, and its "
                "address); refused at start (exit 2) when it does not exist, is down or has no address"),
    Setting("--accept-bundles", type=SWITCH, env="DT_ACCEPT_BUNDLES", default=False, group="trust",
            help="run tasks with shipped code (a bundle), each in a sandbox"),
    Setting("--sandbox", env="DT_SANDBOX", choices=("bwrap", "none"), default="bwrap", metavar="{bwrap,none}",
            group="trust",
            help="how task children are confined: bwrap (bubblewrap: shipped code in an allow-list sandbox, "
                 "refused where bwrap cannot make one; the operator's own tasks in a deny-list one that hides "
                 "this worker's files) or none (every task unconfined, logged as a warning at every start) "
                 "(default bwrap)"),
    Setting("--task-network", env="DT_TASK_NETWORK", choices=("none", "loopback", "host"), default="loopback",
            metavar="{none,loopback,host}", group="trust",
            help="the network of a task with shipped code: none, a private loopback, or the host's (the "
                 "operator's own tasks keep the host's) (default loopback)"),
    Setting("--cache-max-gb", type=float, env="DT_CACHE_MAX_GB", lo=0, lo_open=True, default=10.0, metavar="GB",
            group="trust",
            help="size cap of the bundle blob cache, least recently used evicted first (default 10)"),
)
