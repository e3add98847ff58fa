"""``dt-coordinator`` command line -> CoordinatorConfig: every flag, every variable, precedence,
and bad values rejected naming the flag or variable. Pure apart from ``main``'s exit path."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.cli import coordinator as coord_cli
from distributed_testing.config import CoordinatorConfig
from distributed_testing.errors import ConfigError


def cfg(*argv: str, env: dict[str, str] | None = None) -> CoordinatorConfig:
    return coord_cli.config_from_args(coord_cli.build_parser().parse_args(list(argv)), env or {})


def test_defaults() -> None:
    c = cfg()
    assert (c.host, c.port, c.db_path, c.admin_key_file) == ("127.0.0.1", 8080, "state/coordinator.duckdb", None)
    assert c.admin_key_path == Path("state/admin.key")  # beside the database
    assert (c.token_ttl_s, c.heartbeat_interval_s, c.worker_ttl_s, c.worker_grace_s) == (900.0, 1.0, 3.0, 10.0)
    assert coord_cli.build_parser().parse_args([]).port_file is None


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["--host", "0.0.0.0"], "host", "0.0.0.0"),
    (["--port", "0"], "port", 0),
    (["--port", "65535"], "port", 65535),
    (["--db-path", "/srv/dt/c.duckdb"], "db_path", "/srv/dt/c.duckdb"),
    (["--db-path", "memory://"], "db_path", "memory://"),
    (["--admin-key-file", "/etc/dt/admin.key"], "admin_key_file", Path("/etc/dt/admin.key")),
    (["--token-ttl", "60"], "token_ttl_s", 60.0),
    (["--heartbeat-interval", "0.5"], "heartbeat_interval_s", 0.5),
    (["--worker-ttl", "12"], "worker_ttl_s", 12.0),
    (["--worker-grace", "0"], "worker_grace_s", 0.0),
    (["--worker-grace", "2.5"], "worker_grace_s", 2.5),
    (["--worker-retention", "3600"], "worker_retention_s", 3600.0),
    (["--worker-retention", "0"], "worker_retention_s", 0.0),
    (["--worker-retention", "0.5"], "worker_retention_s", 0.5),
    (["--jwt-secret-file", "/etc/dt/jwt.secret"], "jwt_secret_file", Path("/etc/dt/jwt.secret")),
    (["--max-session-age", "3600"], "max_session_age_s", 3600.0),
    (["--tls-cert", "/tls/c.pem", "--tls-key", "/tls/k.pem"], "tls_cert", Path("/tls/c.pem")),
    (["--tls-cert", "/tls/c.pem", "--tls-key", "/tls/k.pem"], "tls_key", Path("/tls/k.pem")),
])
def test_each_flag_sets_its_field(argv: list[str], field: str, value: object) -> None:
    assert getattr(cfg(*argv), field) == value


def test_admin_key_path_follows_the_database_unless_given() -> None:
    assert cfg("--db-path", "/srv/dt/c.duckdb").admin_key_path == Path("/srv/dt/admin.key")
    assert cfg("--db-path", "/srv/dt/c.duckdb", "--admin-key-file", "/k").admin_key_path == Path("/k")


def test_port_file_flag() -> None:
    assert coord_cli.build_parser().parse_args(["--port-file", "/run/dt.port"]).port_file == Path("/run/dt.port")


@pytest.mark.parametrize(("var", "value", "field", "expected"), [
    ("DT_COORDINATOR_HOST", "0.0.0.0", "host", "0.0.0.0"),
    ("DT_COORDINATOR_PORT", "9001", "port", 9001),
    ("DT_COORDINATOR_PORT", "0", "port", 0),
    ("DT_COORDINATOR_DB", "/data/c.duckdb", "db_path", "/data/c.duckdb"),
    ("DT_ADMIN_KEY_FILE", "/secrets/admin.key", "admin_key_file", Path("/secrets/admin.key")),
    ("DT_JWT_SECRET_FILE", "/secrets/jwt", "jwt_secret_file", Path("/secrets/jwt")),
    ("DT_MAX_SESSION_AGE", "600", "max_session_age_s", 600.0),
])
def test_each_variable_sets_its_field(var: str, value: str, field: str, expected: object) -> None:
    assert getattr(cfg(env={var: value}), field) == expected


def test_dt_coordinator_db_moves_the_default_admin_key_too() -> None:
    assert cfg(env={"DT_COORDINATOR_DB": "/data/c.duckdb"}).admin_key_path == Path("/data/admin.key")


def test_flags_win_over_variables() -> None:
    env = {"DT_COORDINATOR_HOST": "10.0.0.1", "DT_COORDINATOR_PORT": "1", "DT_COORDINATOR_DB": "/env.duckdb",
           "DT_ADMIN_KEY_FILE": "/env.key"}
    c = cfg("--host", "127.0.0.2", "--port", "0", "--db-path", "/flag.duckdb", "--admin-key-file", "/flag.key", env=env)
    assert (c.host, c.port, c.db_path, c.admin_key_file) == ("127.0.0.2", 0, "/flag.duckdb", Path("/flag.key"))


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--port", "65536"], {}, "--port"),
    (["--port", "-1"], {}, "--port"),
    ([], {"DT_COORDINATOR_PORT": "http"}, "DT_COORDINATOR_PORT"),
    (["--token-ttl", "0"], {}, "--token-ttl"),
    (["--token-ttl", "-60"], {}, "--token-ttl"),
    (["--heartbeat-interval", "0"], {}, "--heartbeat-interval"),
    (["--worker-ttl", "0"], {}, "--worker-ttl"),
    (["--worker-grace", "-1"], {}, "--worker-grace"),
    (["--max-session-age", "0"], {}, "--max-session-age"),
    ([], {"DT_MAX_SESSION_AGE": "a day"}, "DT_MAX_SESSION_AGE"),
    (["--tls-cert", "/c.pem"], {}, "--tls-cert and --tls-key"),
    ([], {"DT_TLS_KEY": "/k.pem"}, "--tls-cert and --tls-key"),
])
def test_bad_values_raise_config_error_naming_the_source(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(*argv, env=env)
    assert str(info.value).startswith(f"{needle}:"), str(info.value)


def test_out_of_range_port_variable_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="^DT_COORDINATOR_PORT:"):
        cfg(env={"DT_COORDINATOR_PORT": "70000"})


def test_fractional_port_variable_is_rejected() -> None:
    with pytest.raises(ConfigError, match="DT_COORDINATOR_PORT"):
        cfg(env={"DT_COORDINATOR_PORT": "8080.9"})


def test_main_exits_2_on_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert coord_cli.main(["--port", "70000"]) == 2
    assert "dt-coordinator: --port: must be 0..65535, got 70000" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--port", "eighty"], ["--token-ttl", "long"], ["--token-ttl", "1.5"],
                                  ["--log-level", "LOUD"]])
def test_malformed_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        coord_cli.build_parser().parse_args(argv)
    assert info.value.code == 2


# ------------------------------------------------------------------ unauthenticated clients


def test_unauthenticated_client_limits_default() -> None:
    c = cfg()
    assert (c.header_timeout_s, c.max_connections, c.max_worker_sessions) == (10.0, 0, 0)  # 0: from RLIMIT_NOFILE
    assert (c.auth_fail_limit, c.auth_fail_window_s) == (20, 60.0)


@pytest.mark.parametrize(("flag", "var", "field", "raw", "value"), [
    ("--header-timeout", "DT_HEADER_TIMEOUT", "header_timeout_s", "2.5", 2.5),
    ("--max-connections", "DT_MAX_CONNECTIONS", "max_connections", "100", 100),
    ("--max-worker-sessions", "DT_MAX_WORKER_SESSIONS", "max_worker_sessions", "50", 50),
    ("--auth-fail-limit", "DT_AUTH_FAIL_LIMIT", "auth_fail_limit", "5", 5),
    ("--auth-fail-limit", "DT_AUTH_FAIL_LIMIT", "auth_fail_limit", "0", 0),
    ("--auth-fail-window", "DT_AUTH_FAIL_WINDOW", "auth_fail_window_s", "300", 300.0),
])
def test_each_limit_has_a_flag_and_a_variable_and_the_flag_wins(flag: str, var: str, field: str, raw: str,
                                                               value: object) -> None:
    assert getattr(cfg(flag, raw), field) == value
    assert getattr(cfg(env={var: raw}), field) == value
    assert getattr(cfg(flag, raw, env={var: "7"}), field) == value


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--header-timeout", "0"], {}, "--header-timeout"),
    (["--header-timeout", "nan"], {}, "--header-timeout"),
    ([], {"DT_HEADER_TIMEOUT": "-1"}, "DT_HEADER_TIMEOUT"),
    ([], {"DT_HEADER_TIMEOUT": "soon"}, "DT_HEADER_TIMEOUT"),
    (["--max-connections", "-1"], {}, "--max-connections"),
    (["--max-connections", "1.5"], {}, "--max-connections"),
    ([], {"DT_MAX_WORKER_SESSIONS": "many"}, "DT_MAX_WORKER_SESSIONS"),
    (["--auth-fail-limit", "-3"], {}, "--auth-fail-limit"),
    ([], {"DT_AUTH_FAIL_WINDOW": "0"}, "DT_AUTH_FAIL_WINDOW"),
    (["--auth-fail-window", "inf"], {}, "--auth-fail-window"),
    (["--max-connections", "100000000"], {}, "--max-connections"),  # beyond RLIMIT_NOFILE
])
def test_bad_limits_name_their_source(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(*argv, env=env)
    assert str(info.value).startswith(f"{needle}"), str(info.value)


def test_the_help_names_every_limit_flag_and_variable() -> None:
    text = coord_cli.build_parser().format_help()
    for name in ("--header-timeout", "DT_HEADER_TIMEOUT", "--max-connections", "DT_MAX_CONNECTIONS",
                 "--max-worker-sessions", "DT_MAX_WORKER_SESSIONS", "--auth-fail-limit", "DT_AUTH_FAIL_LIMIT",
                 "--auth-fail-window", "DT_AUTH_FAIL_WINDOW"):
        assert name in text, name


def test_secret_and_session_defaults() -> None:
    assert cfg().max_session_age_s == 86400.0
    assert cfg("--db-path", "/srv/dt/c.duckdb").jwt_secret_path == Path("/srv/dt/jwt.secret")  # beside the database
    assert cfg("--db-path", "memory://").jwt_secret_path is None  # in memory only, like the store
    assert cfg("--db-path", "duckdb:///srv/dt/c.duckdb").jwt_secret_path == Path("/srv/dt/jwt.secret")
    assert cfg("--db-path", "duckdb:///srv/dt/c.duckdb").admin_key_path == Path("/srv/dt/admin.key")
    assert cfg("--db-path", "memory://", "--jwt-secret-file", "/s").jwt_secret_path == Path("/s")
    assert cfg().tls_cert is None and cfg().scheme == "http"


def test_tls_variables_and_flag_precedence() -> None:
    env = {"DT_TLS_CERT": "/env/c.pem", "DT_TLS_KEY": "/env/k.pem", "DT_JWT_SECRET_FILE": "/env/jwt",
           "DT_MAX_SESSION_AGE": "60"}
    c = cfg(env=env)
    assert (c.tls_cert, c.tls_key, c.scheme) == (Path("/env/c.pem"), Path("/env/k.pem"), "https")
    c = cfg("--tls-cert", "/f/c.pem", "--tls-key", "/f/k.pem", "--jwt-secret-file", "/f/jwt",
            "--max-session-age", "120", env=env)
    assert (c.tls_cert, c.tls_key, c.jwt_secret_file, c.max_session_age_s) == (
        Path("/f/c.pem"), Path("/f/k.pem"), Path("/f/jwt"), 120.0)


def test_main_names_a_missing_certificate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert coord_cli.main(["--db-path", "memory://", "--tls-cert", str(tmp_path / "none.pem"),
                           "--tls-key", str(tmp_path / "none.key")]) == 2
    assert f"dt-coordinator: --tls-cert: {tmp_path / 'none.pem'} is not a readable file" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "env", "mode", "port"), [
    ([], {}, "key", None),
    (["--metrics", "off"], {}, "off", None),
    ([], {"DT_METRICS": "off", "DT_METRICS_PORT": "9100"}, "off", 9100),
    (["--metrics", "key", "--metrics-port", "0"], {"DT_METRICS": "off", "DT_METRICS_PORT": "9100"}, "key", 0),
])
def test_metrics_flags_and_variables(argv: list[str], env: dict[str, str], mode: str, port: int | None) -> None:
    c = cfg(*argv, env=env)
    assert (c.metrics, c.metrics_port) == (mode, port)


@pytest.mark.parametrize(("argv", "env", "named"), [
    ([], {"DT_METRICS": "open"}, "DT_METRICS"),
    (["--metrics-port", "http"], {}, "--metrics-port"),
    ([], {"DT_METRICS_PORT": "70000"}, "DT_METRICS_PORT"),
])
def test_bad_metrics_values_name_their_source(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        cfg(*argv, env=env)


def test_advertise_url_from_the_flag_or_the_variable() -> None:
    assert cfg().advertise_url is None
    assert cfg("--advertise-url", "http://coord-a.internal:8080/").advertise_url == "http://coord-a.internal:8080"
    assert cfg(env={"DT_ADVERTISE_URL": "https://b:1"}).advertise_url == "https://b:1"
    with pytest.raises(ConfigError, match="DT_ADVERTISE_URL: expected an http"):
        cfg(env={"DT_ADVERTISE_URL": "coord-a:8080"})


def test_a_postgresql_store_makes_a_group_member_with_its_secret_in_the_database() -> None:
    c = cfg("--db-path", "postgresql://dt@pg:5432/dt")
    assert c.postgres and c.jwt_secret_path is None
    assert cfg("--db-path", "postgresql://dt@pg/dt", "--jwt-secret-file", "/s/jwt").jwt_secret_path == Path("/s/jwt")
    assert coord_cli.state_files(c) == [(c.admin_key_path, "--admin-key-file")]  # no database file to check


def test_the_default_advertised_url_names_this_machine_for_a_wildcard_bind() -> None:
    import socket

    from distributed_testing.coordinator.group import default_advertise_url

    assert default_advertise_url("http", "127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert default_advertise_url("https", "::1", 1) == "https://[::1]:1"
    assert default_advertise_url("http", "0.0.0.0", 80) in (f"http://{socket.getfqdn()}:80",
                                                            f"http://{socket.gethostname()}:80")


def test_worker_retention_default_variable_precedence_and_bad_values() -> None:
    assert cfg().worker_retention_s == 86400.0
    assert cfg(env={"DT_WORKER_RETENTION": "60"}).worker_retention_s == 60.0
    assert cfg("--worker-retention", "5", env={"DT_WORKER_RETENTION": "60"}).worker_retention_s == 5.0
    for argv, env, named in [(["--worker-retention", "soon"], {}, "--worker-retention"),
                             (["--worker-retention", "-1"], {}, "--worker-retention"),
                             (["--worker-retention", "nan"], {}, "--worker-retention"),
                             (["--worker-retention", "inf"], {}, "--worker-retention"),
                             ([], {"DT_WORKER_RETENTION": "1e12"}, "DT_WORKER_RETENTION")]:
        with pytest.raises(ConfigError, match=f"^{named}:"):
            cfg(*argv, env=env)


def test_worker_retention_is_in_the_help_and_the_operations_table() -> None:
    text = coord_cli.build_parser().format_help()
    assert "--worker-retention" in text and "DT_WORKER_RETENTION" in text and "86400" in text
    ops = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    (row,) = [line for line in ops.splitlines() if line.startswith("| `--worker-retention`")]
    assert "`DT_WORKER_RETENTION`" in row and row.endswith("| 86400 s |")
