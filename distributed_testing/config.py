"""Per-process configuration: frozen dataclasses built once from CLI flags and ``DT_*`` variables.

Nothing below the CLI reads ``os.environ``. Precedence: flag > variable > default. A bad value
raises :class:`~distributed_testing.errors.ConfigError` naming the flag or variable it came from.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .errors import ConfigError

DEFAULT_COORDINATOR_URL = "http://localhost:8080"
METRICS_MODES = ("key", "off")  # --metrics


@dataclass(frozen=True)
class CoordinatorConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    db_path: str = "state/coordinator.duckdb"
    admin_key_file: Path | None = None
    jwt_secret_file: Path | None = None  # default: jwt.secret beside the database; none for memory://
    token_ttl_s: float = 900.0
    max_session_age_s: float = 86400.0  # a JWT renews JWTs up to this long after its API key was used
    tls_cert: Path | None = None  # with tls_key: serve https/wss
    tls_key: Path | None = None
    ca_file: Path | None = None  # a standby verifies an https leader's certificate with it (default: the system's)
    # liveness (docs/operations.md#liveness): workers that ask for no interval heartbeat every
    # heartbeat_interval_s and are lost after worker_ttl_s without a frame; a worker asking for a
    # longer interval (up to max_heartbeat_interval_s) gets a TTL of as many intervals
    heartbeat_interval_s: float = 1.0
    worker_ttl_s: float = 3.0
    max_heartbeat_interval_s: float = 60.0
    worker_grace_s: float = 10.0  # reconnect window before a disconnected worker's tasks are requeued
    worker_retention_s: float = 86400.0  # a worker disconnected this long is forgotten (history kept); 0: never
    max_frame_bytes: int = 16 * 1024 * 1024
    max_clock_skew_s: float = 300.0
    max_violations: int = 5
    batch_max: int = 8
    batch_wait_s: float = 0.2
    gang_max_wait_s: float = 60.0  # a gang waiting longer reserves its eligible workers as they free up
    gang_ports: tuple[int, int] = (29500, 29999)  # rendezvous ports handed to multi-node training tasks
    strict: bool = False  # refuse at submit what no connected worker could run (a missing custom handler)
    # unauthenticated clients (coordinator/admission.py, docs/security.md "Unauthenticated clients")
    header_timeout_s: float = 10.0  # from accept or the last answer to a complete request head
    max_connections: int = 0  # open HTTP connections at once; 0: derived from RLIMIT_NOFILE
    max_worker_sessions: int = 0  # registered worker sessions at once; 0: derived from RLIMIT_NOFILE
    auth_fail_limit: int = 20  # failed authentications per client address per window before 429; 0: off
    auth_fail_window_s: float = 60.0
    # per-key quotas (coordinator/core/quota.py, docs/security.md "Quotas"); 0: off
    max_queued_per_key: int = 10000  # tasks queued or running per key
    max_payload_mb_per_key: int = 64  # MiB of task specs (as weighed in memory) queued or running per key
    metrics: str = "key"  # GET /metrics on the main port: "key" (a credential with metrics:read) or "off"
    metrics_port: int | None = None  # also serve /metrics, open, on this port of ``host`` (0: any free one)
    dashboard: bool = False  # also serve the dashboard under /dashboard (distributed_testing/dashboard)
    # HA group (PostgreSQL store only; coordinator/group.py): the URL other members, workers and
    # clients reach this coordinator on (None: derived from the bound address), and a stable
    # member id (None: hostname plus a random suffix per process)
    advertise_url: str | None = None
    member_id: str | None = None
    # bundles (docs/tasks.md, "Bundles"): caps on one bundle and one file of it, in MiB, and how
    # long blobs stay after the last task or upload that used them
    max_bundle_mb: float = 1024.0
    max_bundle_file_mb: float = 100.0
    bundle_retention_s: float = 7 * 86400.0
    max_blob_mb_per_key: int = 2048  # MiB of bundle blobs one key may hold (coordinator/bundle_access.py); 0: off

    def __post_init__(self) -> None:
        """The rules between settings; each setting's own type and bounds are checked once, where
        it is read (the table in cli/coordinator_options.py)."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key: give both (the certificate chain and its private key) or neither")
        lo, hi = self.gang_ports
        if not 1 <= lo <= hi <= 65535:
            raise ConfigError(f"--gang-ports: must be LOW-HIGH with 1 <= LOW <= HIGH <= 65535, got {lo}-{hi}")
        if self.worker_ttl_s < 2 * self.heartbeat_interval_s:
            raise ConfigError(f"--worker-ttl: must be at least twice --heartbeat-interval ({self.heartbeat_interval_s:g}s), "
                              f"or one late heartbeat kills a worker; got {self.worker_ttl_s:g}")
        if self.max_heartbeat_interval_s < self.heartbeat_interval_s:
            raise ConfigError(f"--max-heartbeat-interval: must be at least --heartbeat-interval "
                              f"({self.heartbeat_interval_s:g}s), got {self.max_heartbeat_interval_s:g}")

    @property
    def postgres(self) -> bool:
        """Whether the store is PostgreSQL (the coordinator is then a member of an HA group)."""
        return self.db_path.strip().lower().startswith(("postgresql://", "postgres://"))

    @property
    def state_dir(self) -> Path:
        """The database's directory (``duckdb://`` URLs included); ``state`` for other stores."""
        scheme, sep, rest = self.db_path.partition("://")
        if not sep:
            return Path(self.db_path).parent
        return Path(rest).parent if scheme.lower() == "duckdb" and rest else Path("state")

    @property
    def admin_key_path(self) -> Path:
        return self.admin_key_file or self.state_dir / "admin.key"

    @property
    def jwt_secret_path(self) -> Path | None:
        """Where the token-signing secret lives; None: a memory:// store keeps it in memory only,
        and a PostgreSQL group shares it in the database."""
        if self.jwt_secret_file is not None:
            return self.jwt_secret_file
        if self.postgres:  # the group's secret lives in the database (coordinator/group.py)
            return None
        return None if self.db_path.startswith("memory://") else self.state_dir / "jwt.secret"

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"


@dataclass(frozen=True)
class WorkerConfig:
    coordinator_url: str = DEFAULT_COORDINATOR_URL
    # every --coordinator URL in order (the first is coordinator_url); () means (coordinator_url,)
    coordinator_urls: tuple[str, ...] = ()
    # --high-availability (worker/agent.py, "High availability"): learn the group from
    # GET /api/v1/cluster, switch to the next coordinator at once, never give up, beat twice as often
    high_availability: bool = False
    api_key: str | None = None
    api_key_file: Path | None = None  # where api_key was read from: hidden from task children (worker/confine.py)
    token: str | None = None
    token_file: Path | None = None
    name: str = field(default_factory=socket.gethostname)
    worker_id: str = field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:12]}")
    tags: tuple[str, ...] = ()
    db_path: Path | None = None
    test_root: Path = field(default_factory=Path.cwd)
    # heartbeats and WebSocket pings: the interval asked of the coordinator at registration;
    # None: the coordinator's (its ``registered`` answer sets the interval and TTL in force)
    heartbeat_interval_s: float | None = None
    reconnect_attempts: int = 10
    reconnect_interval_s: float = 1.0
    max_concurrent_tasks: int = 1
    # --pipeline-depth: tasks the coordinator may send beyond the slots, to wait here and start as
    # slots free (it decides how many from the durations it observes; docs/protocol.md, "Pipelining")
    pipeline_depth: int = 256
    task_timeout_s: float | None = None
    cache_models: bool = False
    mixed_precision: bool = False
    optimize_for: str | None = None
    cuda_streams: int | None = None
    bench_threads: int | None = None
    # resource limits (worker/limits.py); None: no limit
    max_cpu_percent: float | None = None
    max_memory_percent: float | None = None
    max_gpu_percent: float | None = None
    memory_buffer: float | None = None  # fraction of total memory kept free
    enable_swap: bool = False  # --enable-swap: the memory limit, buffer and offer count swap as memory
    limit_cooldown_s: float = 10.0
    profile: str | None = None
    drain_timeout_s: float = 30.0  # SIGTERM: how long running tasks may finish before hand-back
    recover: bool = False  # report unacked results and tasks interrupted by a crash at start
    reset_state: bool = False  # delete the local outbox, its journal and the cache dir at start
    # --interface: NIC whose address is reported for multi-node rendezvous and that gloo/NCCL bind
    interface: str | None = None
    # what a submitter may make this worker run (docs/security.md): module prefixes of
    # ``module:callable`` models, and guarded pytest options test tasks may pass
    allow_model_modules: tuple[str, ...] = ()
    allow_test_options: tuple[str, ...] = ()
    # shipped code (docs/security.md, "Shipped code"): run tasks with a bundle, how their children
    # are confined, their network, and the blob cache's size cap
    accept_bundles: bool = False
    sandbox: str = "bwrap"
    task_network: str = "loopback"
    cache_max_gb: float = 10.0
    ca_file: Path | None = None  # --ca-file: trust this CA bundle for an https coordinator (default: the system's)
    metrics_port: int | None = None  # --metrics-port: serve GET /metrics (no credential) on 127.0.0.1 or metrics_host
    metrics_host: str = "127.0.0.1"

    @property
    def ws_url(self) -> str:
        return ws_url(self.coordinator_url)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every configured coordinator URL, the first one first."""
        return self.coordinator_urls or (self.coordinator_url,)


def normalize_url(url: str, source: str) -> str:
    """Validate an http(s) coordinator URL (a host, a port of 1-65535 if any); the error names
    ``source`` (flag or variable)."""
    expected = f"{source}: expected an http(s) URL such as {DEFAULT_COORDINATOR_URL}, got {url!r}"
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when it is not a number of 0-65535
    except ValueError as exc:  # "http://[::1" (an unclosed IPv6 address), "http://host:abc"
        raise ConfigError(f"{expected}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(expected)
    if port == 0:
        raise ConfigError(f"{expected}: port 0 is no port to connect to")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def parse_urls(raw: str, source: str) -> tuple[str, ...]:
    """Comma-separated coordinator URLs (``--coordinator``, ``DT_COORDINATOR_URL``), each checked
    by :func:`normalize_url`, duplicates dropped; ConfigError naming ``source`` otherwise."""
    urls = tuple(dict.fromkeys(normalize_url(u.strip(), source) for u in raw.split(",") if u.strip()))
    if not urls:
        raise ConfigError(f"{source}: give at least one coordinator URL, got {raw!r}")
    return urls


def ws_url(http_url: str) -> str:
    parts = urlsplit(http_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/ws/worker", "", ""))


def env_pick(flag_value: str | None, env: Mapping[str, str], var: str, default: str | None = None) -> tuple[str | None, str]:
    """Flag wins over variable wins over default; returns (value, source name for errors)."""
    if flag_value is not None:
        return flag_value, "flag"
    if env.get(var):
        return env[var], var
    return default, "default"


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--token-file: cannot read {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(f"--token-file: {path} is empty")
    return token


def read_key_file(path: Path, source: str) -> str:
    """The API key in ``path`` (surrounding whitespace stripped); ConfigError naming ``source``."""
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read {path}: {exc.strerror}") from exc
    if not key:
        raise ConfigError(f"{source}: {path} is empty")
    return key


def environ() -> Mapping[str, str]:
    """The process environment; only CLI entry points call this."""
    return os.environ
