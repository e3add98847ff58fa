"""The coordinator's settings: one row per flag (its variable, type, bounds, default, help, and
the text of docs/operations.md's table). ``cli/coordinator.py`` builds its parser and reads its
configuration from this table; ``scripts/gen_options.py`` writes the docs table from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import METRICS_MODES, normalize_url
from ..errors import ConfigError
from ..security import tls
from .options import SWITCH, Setting


def _port_range(raw: str, source: str) -> tuple[int, int]:
    lo, sep, hi = raw.partition("-")
    try:
        if not sep:
            raise ValueError(raw)
        return int(lo), int(hi)
    except ValueError as exc:
        raise ConfigError(f"{source}: expected LOW-HIGH such as 29500-29999, got {raw!r}") from exc


def _as_float(value: int, source: str) -> float:
    """Whole seconds on the command line, float seconds in CoordinatorConfig."""
    return float(value)


def _ca_file(path: Path, source: str) -> Path:
    tls.client_context(path, source)  # ConfigError now rather than at the first forwarded request
    return path


SECONDS: dict[str, Any] = {"type": float, "lo": 0, "lo_open": True, "metavar": "S"}
WAIT: dict[str, Any] = {"type": float, "lo": 0, "metavar": "S"}  # 0 allowed
COUNT: dict[str, Any] = {"type": int, "lo": 0, "metavar": "N"}

COORDINATOR_SETTINGS: tuple[Setting, ...] = (
    Setting("--host", env="DT_COORDINATOR_HOST", default="127.0.0.1", help="address to bind (default 127.0.0.1)",
            doc="", shown_default="127.0.0.1"),
    Setting("--port", type=int, env="DT_COORDINATOR_PORT", lo=0, hi=65535, default=8080, usage_error=True,
            help="port to bind, 0 for any free one (default 8080)", doc="0: any free port", shown_default="8080"),
    Setting("--db-path", env="DT_COORDINATOR_DB", default="state/coordinator.duckdb",
            help="DuckDB state file, memory://, or postgresql://user@host:port/db: several coordinators on one "
                 "PostgreSQL database form an HA group, one leader and hot standbys (default "
                 "state/coordinator.duckdb)",
            doc="a DuckDB file, `memory://`, or `postgresql://user@host:port/db` (see [PostgreSQL "
                "store](#postgresql-store)): an HA group, see [High availability](#high-availability)",
            shown_default="state/coordinator.duckdb"),
    Setting("--advertise-url", env="DT_ADVERTISE_URL", metavar="URL", check=normalize_url,
            help="the URL workers, clients and the other members reach this coordinator on, as GET "
                 "/api/v1/cluster lists it and standbys redirect to it (default: scheme://host:port as bound; "
                 "the machine's host name when bound to 0.0.0.0 or ::)",
            doc="where workers, clients and the other members reach this coordinator: listed by `GET "
                "/api/v1/cluster`, where standbys forward requests and send workers",
            shown_default="`scheme://host:port` as bound; the host name when bound to 0.0.0.0 or ::"),
    Setting("--admin-key-file", type=Path, env="DT_ADMIN_KEY_FILE",
            help="where the first start writes the admin key (default: admin.key beside the database)",
            doc="", shown_default="admin.key beside the database"),
    Setting("--jwt-secret-file", type=Path, env="DT_JWT_SECRET_FILE",
            help="file holding the token-signing secret, created 0600 on the first start (default: jwt.secret "
                 "beside the database; with memory:// the secret lives in memory only; with PostgreSQL it is "
                 "shared in the database, unless this is given: then give every member the same file)",
            doc="the token-signing secret, hex, mode 0600; see "
                "[security.md](security.md#secrets-at-rest-and-in-transit)",
            shown_default="jwt.secret beside the database (memory:// keeps it in memory)"),
    Setting("--rotate-jwt-secret", type=SWITCH, read=False,
            help="write a new token-signing secret to the secret file and exit; after the coordinator restarts, "
                 "JWTs signed with the old one are refused (API keys keep working). With PostgreSQL and no "
                 "--jwt-secret-file: replace the group's secret in the database; every member uses it within "
                 "a second, no restart",
            doc="write a new signing secret and exit; restart to use it; with PostgreSQL and no "
                "`--jwt-secret-file`: replace the group's secret in the database, every member uses it within a "
                "second"),
    Setting("--token-ttl", type=int, lo=1, hi=86400, default=900.0, field="token_ttl_s", check=_as_float,
            help="JWT lifetime in whole seconds, at least 1 (default 900)", doc="", shown_default="900 s"),
    Setting("--max-session-age", type=int, env="DT_MAX_SESSION_AGE", lo=1, hi=365 * 86400, default=86400.0,
            usage_error=True, field="max_session_age_s", check=_as_float,
            help="seconds after a JWT was first obtained with an API key during which it (and its renewals) may "
                 "be renewed; renewed JWTs never outlive it (default 86400)",
            doc="a JWT renews JWTs only this long after its API key was used", shown_default="86400 s"),
    Setting("--tls-cert", type=Path, env="DT_TLS_CERT",
            help="PEM certificate chain: serve https and wss (needs --tls-key)",
            doc="PEM certificate chain: serve https and wss; needs `--tls-key`", shown_default="plain http"),
    Setting("--tls-key", type=Path, env="DT_TLS_KEY", help="PEM private key of --tls-cert",
            doc="PEM private key of `--tls-cert`", shown_default="plain http"),
    Setting("--ca-file", type=Path, metavar="PATH", check=_ca_file,
            help="PEM CA bundle a standby verifies an https leader's certificate with when it forwards "
                 "requests (default: the system's CAs)",
            doc="PEM CA bundle a standby verifies an `https` leader's certificate with when it forwards "
                "requests", shown_default="the system's CAs"),
    Setting("--heartbeat-interval", **SECONDS, default=1.0, field="heartbeat_interval_s",
            help="seconds between heartbeats of workers that do not ask for an interval; "
                 "told to each worker at registration (default 1)",
            doc="workers that ask for no interval; see [Liveness](#liveness)", shown_default="1 s"),
    Setting("--worker-ttl", **SECONDS, default=3.0, field="worker_ttl_s",
            help="declare a worker dead after this many seconds without any frame from it, at least 2x "
                 "--heartbeat-interval; a worker asking for a longer interval gets a TTL of as many of its "
                 "intervals (default 3)",
            doc="nothing heard for this long → worker lost; at least 2 × `--heartbeat-interval`",
            shown_default="3 s"),
    Setting("--max-heartbeat-interval", **SECONDS, default=60.0, field="max_heartbeat_interval_s",
            help="the longest heartbeat interval a worker may ask for; a longer one is refused at registration "
                 "(default 60)",
            doc="longest interval a worker may ask for; longer is refused at registration", shown_default="60 s"),
    Setting("--worker-grace", **WAIT, default=10.0, field="worker_grace_s",
            help="seconds a disconnected worker has to reconnect before its tasks are requeued (default 10)",
            doc="reconnect window before requeue", shown_default="10 s"),
    Setting("--worker-retention", type=float, env="DT_WORKER_RETENTION", lo=0, hi=10 * 365 * 86400,
            default=86400.0, metavar="S", field="worker_retention_s",
            bounds="0 (never) or a number of seconds up to ten years",
            help="forget a worker disconnected and not heard from for S seconds: it leaves dt workers and its id "
                 "is free again; the tasks and results it ran stay; 0 keeps every worker (default 86400, a day)",
            doc="forget a worker disconnected and silent this long: it leaves `dt workers` and its id is free "
                "again; its tasks and results stay; 0 keeps every worker", shown_default="86400 s"),
    Setting("--batch-max", type=int, lo=1, default=8, metavar="N",
            help="benchmark tasks sharing a model sent to one worker as one batch, at most (default 8; 1 "
                 "disables batching)",
            doc="benchmark tasks per batch; 1 disables batching", shown_default="8"),
    Setting("--batch-wait", **WAIT, default=0.2, field="batch_wait_s",
            help="seconds a benchmark task may wait for others to batch with (default 0.2)",
            doc="seconds a lone benchmark task waits for batch mates", shown_default="0.2"),
    Setting("--gang-max-wait", **WAIT, default=60.0, field="gang_max_wait_s",
            help="seconds a multi-node training task may wait while smaller tasks use the free slots; after "
                 "that its eligible workers take no new work of lower or equal priority until it fits (default 60)",
            doc="seconds a multi-node training task lets smaller tasks use free slots before its eligible "
                "workers are kept for it", shown_default="60 s"),
    Setting("--gang-ports", metavar="LOW-HIGH", default=(29500, 29999), check=_port_range,
            help="rendezvous ports the coordinator hands to multi-node training tasks, one per running task "
                 "and master address (default 29500-29999)",
            doc="rendezvous ports handed to multi-node training tasks, `LOW-HIGH`", shown_default="29500-29999"),
    Setting("--strict", type=SWITCH, env="DT_STRICT", default=False,
            help="refuse (400) a custom task whose handler no connected worker has, instead of letting it "
                 "wait for one",
            doc="refuse at submission a custom task whose handler no connected worker has, instead of letting it "
                "wait", shown_default="off"),
    Setting("--max-bundle-mb", type=float, env="DT_MAX_BUNDLE_MB", lo=0, lo_open=True, hi=1 << 20, default=1024.0,
            metavar="MB",
            help="largest bundle (shipped code) a manifest may describe; larger ones get 413 naming the "
                 "largest files (default 1024)",
            doc="largest bundle (shipped code) a manifest may describe; larger ones get 413 naming the largest "
                "files", shown_default="1024"),
    Setting("--max-bundle-file-mb", type=float, env="DT_MAX_BUNDLE_FILE_MB", lo=0, lo_open=True, hi=1 << 20,
            default=100.0, metavar="MB", help="largest single file of a bundle (default 100)",
            doc="largest single file of a bundle", shown_default="100"),
    Setting("--bundle-retention", type=float, env="DT_BUNDLE_RETENTION", lo=0, lo_open=True, hi=10 * 365 * 86400,
            default=7 * 86400.0, metavar="S", field="bundle_retention_s",
            help="seconds a bundle's blobs stay after the last upload or task that used them; unfinished "
                 "tasks keep theirs (default 604800, a week)",
            doc="seconds a bundle's blobs stay after the last upload or task that used them; unfinished tasks "
                "keep theirs", shown_default="604800 s (a week)"),
    Setting("--header-timeout", type=float, env="DT_HEADER_TIMEOUT", lo=0, lo_open=True, hi=3600, default=10.0,
            metavar="S", field="header_timeout_s",
            help="close a connection that sends no complete request head within S seconds of opening or "
                 "of its last answer (idle keep-alive included) (default 10)",
            doc="seconds a connection has to send a complete request head, from opening or its last answer; "
                "idle keep-alive included", shown_default="10 s"),
    Setting("--max-connections", **COUNT, env="DT_MAX_CONNECTIONS", default=0,
            help="HTTP connections open at once; more are answered 503 and closed at accept (default: "
                 "half of what RLIMIT_NOFILE leaves after a reserve)",
            doc="HTTP connections open at once; more get 503 at accept", shown_default="derived from `ulimit -n`"),
    Setting("--max-worker-sessions", **COUNT, env="DT_MAX_WORKER_SESSIONS", default=0,
            help="registered worker WebSocket sessions at once, counted apart from --max-connections; "
                 "handshakes beyond get 503 (default: the other half)",
            doc="registered worker sessions at once; more get 503 at the handshake",
            shown_default="derived from `ulimit -n`"),
    Setting("--auth-fail-limit", **COUNT, env="DT_AUTH_FAIL_LIMIT", default=20,
            help="failed authentications from one client address (IPv6: its /64) within --auth-fail-window "
                 "before it gets 429 until they age out; 0 turns this off (default 20)",
            doc="failed authentications from one address within the window before 429; 0: off", shown_default="20"),
    Setting("--auth-fail-window", type=float, env="DT_AUTH_FAIL_WINDOW", lo=0, lo_open=True, hi=86400, default=60.0,
            metavar="S", field="auth_fail_window_s",
            help="the window of --auth-fail-limit in seconds (default 60)", doc="seconds", shown_default="60 s"),
    Setting("--max-queued-per-key", **COUNT, env="DT_MAX_QUEUED_PER_KEY", default=10000,
            help="tasks one API key may have queued or running at once; a submission past it gets 429 "
                 "with Retry-After (413 if it is over the cap by itself); 0 turns this off (default 10000)",
            doc="tasks one key may have queued or running; past it 429 with `Retry-After`, or 413 for one submission over it by itself; 0: off; see "
                "[security.md](security.md#quotas)", shown_default="10000"),
    Setting("--max-payload-mb-per-key", type=int, lo=0, metavar="MIB", env="DT_MAX_PAYLOAD_MB_PER_KEY", default=64,
            help="MiB of task specs one API key may have queued or running at once, each weighed as its JSON "
                 "plus 192 bytes per value it holds (what it costs in memory); a submission past it gets 429 "
                 "with Retry-After (413 if it is over the cap by itself); 0 turns this off (default 64)",
            doc="MiB of task specs one key may have queued or running, each weighed as its JSON plus 192 bytes per "
                "value (what it costs in memory); past it 429, or 413 for one submission over it by itself; 0: off; "
                "see [security.md](security.md#quotas)",
            shown_default="64"),
    Setting("--max-blob-mb-per-key", type=int, lo=0, metavar="MIB", env="DT_MAX_BLOB_MB_PER_KEY", default=2048,
            help="MiB of bundle files (blobs and manifests) one API key may keep stored, each file counted once; "
                 "an upload past it gets 413 (files no upload or task used within --bundle-retention are "
                 "deleted); 0 turns this off (default 2048)",
            doc="MiB of bundle files (blobs and manifests) one key may keep stored, each counted once; past it 413; "
                "0: off; see [security.md](security.md#quotas)",
            shown_default="2048"),
    Setting("--metrics", choices=METRICS_MODES, env="DT_METRICS", default="key", shown="--metrics key\\|off",
            help="GET /metrics (Prometheus) on the main port: key = needs a credential with metrics:read "
                 "(admin, submitter, viewer), off = not served there (default key)",
            doc="`GET /metrics` on the main port: `key` needs a credential with `metrics:read`; `off`: not "
                "served there; see [Metrics](#metrics)", shown_default="key"),
    Setting("--metrics-port", type=int, env="DT_METRICS_PORT", lo=0, hi=65535, metavar="PORT",
            help="also serve GET /metrics with no credential on this port of --host (plain http; 0 for any "
                 "free one); for a scraper on a trusted network",
            doc="also serve `GET /metrics` with no credential on this port of `--host`, plain http; 0: any free "
                "port", shown_default="none"),
    Setting("--dashboard", type=SWITCH, default=False,
            help="also serve the web dashboard under /dashboard (sign in with any key that may read tasks)",
            doc="also serve the web dashboard under `/dashboard`; sign in with any key that may read tasks",
            shown_default="off"),
    Setting("--port-file", type=Path, read=False,
            help="write the bound port to this file once listening (for scripts using --port 0); a group member "
                 "once it leads or stands by",
            doc="write the bound port, for scripts; a group member writes it once it leads or knows it stands by"),
)
