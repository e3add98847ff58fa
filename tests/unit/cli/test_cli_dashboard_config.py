"""``dt-dashboard`` command line -> DashboardConfig, host, port: every flag and variable, flags
winning, bad values rejected naming the flag or variable; and the coordinator's --dashboard."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.cli import coordinator as coord_cli
from distributed_testing.cli import dashboard as dash_cli
from distributed_testing.dashboard.sessions import SessionStore
from distributed_testing.errors import ConfigError


def cfg(*argv: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return dash_cli.config_from_args(dash_cli.build_parser().parse_args(list(argv)), env or {})


def test_defaults_and_variables(tmp_path: Path) -> None:
    config, host, port = cfg()
    assert (config.coordinator_urls, host, port, config.session_ttl_s) == (("http://127.0.0.1:8080",), "127.0.0.1",
                                                                           8081, 28800.0)
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    env = {"DT_COORDINATOR_URL": "http://a:1, https://b:2", "DT_DASHBOARD_HOST": "0.0.0.0", "DT_DASHBOARD_PORT": "0",
           "DT_DASHBOARD_SESSION_TTL": "60", "DT_CA_FILE": str(ca)}
    config, host, port = cfg(env=env)
    assert (config.coordinator_urls, host, port, config.session_ttl_s, config.ca_file) == (
        ("http://a:1", "https://b:2"), "0.0.0.0", 0, 60.0, ca)
    config, host, port = cfg("--coordinator", "http://c:3", "--host", "::1", "--port", "9", "--session-ttl", "5",
                             env=env)
    assert (config.coordinator_urls, host, port, config.session_ttl_s) == (("http://c:3",), "::1", 9, 5.0)


@pytest.mark.parametrize(("argv", "env", "named"), [
    (["--coordinator", "ftp://x"], {}, "--coordinator"),
    ([], {"DT_COORDINATOR_URL": "nohost"}, "DT_COORDINATOR_URL"),
    (["--coordinator", " , "], {}, "--coordinator"),
    (["--port", "x"], {}, "--port"),
    ([], {"DT_DASHBOARD_PORT": "70000"}, "DT_DASHBOARD_PORT"),
    (["--session-ttl", "0"], {}, "--session-ttl"),
    ([], {"DT_DASHBOARD_SESSION_TTL": "soon"}, "DT_DASHBOARD_SESSION_TTL"),
    ([], {"DT_CA_FILE": "/no/such/ca.pem"}, "DT_CA_FILE"),
])
def test_bad_values_name_the_flag_or_variable(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^{named}:"):
        cfg(*argv, env=env)


def test_main_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert dash_cli.main(["--port", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "dt-dashboard: --port: must be 0..65535, got -1"


def test_sessions_last_the_ttl_and_sign_out_ends_them() -> None:
    store = SessionStore(ttl_s=60)
    s = store.create("key", "kid", "viewer", now=1000.0)
    assert store.get(s.session_id, 1059.0) is s and store.get(s.session_id, 1060.0) is None
    s2 = store.create("key", "kid", "admin", now=2000.0)
    assert s2.can_drain and s2.can_cancel and not s.can_cancel and s2.csrf_ok(s2.csrf) and not s2.csrf_ok(s.csrf)
    store.end(s2.session_id)
    assert store.get(s2.session_id, 2001.0) is None and len(store) == 0


def test_the_coordinator_flag() -> None:
    parse = coord_cli.build_parser().parse_args
    assert coord_cli.config_from_args(parse(["--dashboard"]), {}).dashboard is True
    assert coord_cli.config_from_args(parse([]), {}).dashboard is False
