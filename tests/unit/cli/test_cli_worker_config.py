"""``dt-worker`` command line -> WorkerConfig: every flag, every variable, precedence, and bad
values rejected with a ConfigError that names the flag or variable. Pure: no sockets, no loop."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from distributed_testing.cli.worker import build_parser, config_from_args
from distributed_testing.config import WorkerConfig
from distributed_testing.errors import ConfigError
from distributed_testing.worker.auth import Credentials


def cfg(*argv: str, env: dict[str, str] | None = None) -> WorkerConfig:
    return config_from_args(build_parser().parse_args(list(argv)), env or {})


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    c = cfg()
    assert c.coordinator_url == "http://localhost:8080" and c.ws_url == "ws://localhost:8080/ws/worker"
    assert (c.api_key, c.token, c.token_file, c.db_path, c.task_timeout_s) == (None, None, None, None, None)
    assert c.name == socket.gethostname()
    assert re.fullmatch(r"worker-[0-9a-f]{12}", c.worker_id) and cfg().worker_id != c.worker_id
    assert c.tags == () and c.test_root == tmp_path.resolve()
    assert (c.heartbeat_interval_s, c.reconnect_attempts, c.reconnect_interval_s, c.max_concurrent_tasks) == (None, 10, 1.0, 1)  # None: the coordinator's interval
    assert c.pipeline_depth == 256


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["--coordinator", "https://coord.example:8443/base/"], "coordinator_url", "https://coord.example:8443/base"),
    (["--api-key", "dtk_a_b"], "api_key", "dtk_a_b"),
    (["--token", "h.p.s"], "token", "h.p.s"),
    (["--token-file", "/run/secrets/jwt"], "token_file", Path("/run/secrets/jwt")),
    (["--name", "gpu-box-1"], "name", "gpu-box-1"),
    (["--worker-id", "stable-1"], "worker_id", "stable-1"),
    (["--tags", " gpu, cuda ,,transformers "], "tags", ("gpu", "cuda", "transformers")),
    (["--db-path", "state/w.duckdb"], "db_path", Path("state/w.duckdb")),
    (["--heartbeat-interval", "2.5"], "heartbeat_interval_s", 2.5),
    (["--reconnect-attempts", "3"], "reconnect_attempts", 3),
    (["--reconnect-interval", "0.25"], "reconnect_interval_s", 0.25),
    (["--max-concurrent-tasks", "4"], "max_concurrent_tasks", 4),
    (["--pipeline-depth", "0"], "pipeline_depth", 0),
    (["--pipeline-depth", "256"], "pipeline_depth", 256),
    (["--task-timeout", "90"], "task_timeout_s", 90.0),
    (["--ca-file", "/etc/dt/ca.pem"], "ca_file", Path("/etc/dt/ca.pem")),
])
def test_each_flag_sets_its_field(argv: list[str], field: str, value: object) -> None:
    assert getattr(cfg(*argv), field) == value


def test_https_coordinator_uses_wss() -> None:
    assert cfg("--coordinator", "https://c.example").ws_url == "wss://c.example/ws/worker"


def test_test_root_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    assert cfg("--test-root", str(tmp_path / "suite" / ".." / "suite")).test_root == (tmp_path / "suite").resolve()


@pytest.mark.parametrize(("var", "field", "value", "expected"), [
    ("DT_COORDINATOR_URL", "coordinator_url", "http://c.example:9000/", "http://c.example:9000"),
    ("DT_API_KEY", "api_key", "dtk_env_key", "dtk_env_key"),
    ("DT_WORKER_NAME", "name", "env-name", "env-name"),
    ("DT_DB_PATH", "db_path", "/var/lib/dt/w.duckdb", Path("/var/lib/dt/w.duckdb")),
    ("DT_PIPELINE_DEPTH", "pipeline_depth", "4", 4),
])
def test_each_variable_sets_its_field(var: str, field: str, value: str, expected: object) -> None:
    assert getattr(cfg(env={var: value}), field) == expected


@pytest.mark.parametrize(("flag", "flag_value", "var", "field", "expected"), [
    ("--coordinator", "http://flag:1", "DT_COORDINATOR_URL", "coordinator_url", "http://flag:1"),
    ("--api-key", "dtk_flag_key", "DT_API_KEY", "api_key", "dtk_flag_key"),
    ("--name", "flag-name", "DT_WORKER_NAME", "name", "flag-name"),
    ("--db-path", "/flag.duckdb", "DT_DB_PATH", "db_path", Path("/flag.duckdb")),
    ("--pipeline-depth", "2", "DT_PIPELINE_DEPTH", "pipeline_depth", 2),
])
def test_flags_win_over_variables(flag: str, flag_value: str, var: str, field: str, expected: object) -> None:
    assert getattr(cfg(flag, flag_value, env={var: "from-env" if var != "DT_COORDINATOR_URL" else "http://env:2"}),
                   field) == expected


def test_empty_variables_count_as_unset() -> None:
    c = cfg(env={"DT_COORDINATOR_URL": "", "DT_API_KEY": "", "DT_WORKER_NAME": "", "DT_DB_PATH": ""})
    assert (c.coordinator_url, c.api_key, c.name, c.db_path) == ("http://localhost:8080", None, socket.gethostname(), None)


@pytest.mark.parametrize("argv", [["--token", "h.p.s"], ["--token-file", "/jwt"]])
def test_an_explicit_token_beats_dt_api_key(argv: list[str]) -> None:
    c = cfg(*argv, env={"DT_API_KEY": "dtk_env_key"})
    assert c.api_key is None
    Credentials(c.coordinator_url, api_key=c.api_key, token=c.token, token_file=c.token_file)  # one credential


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--coordinator", "ftp://x"], {}, "--coordinator"),
    (["--coordinator", "localhost:8080"], {}, "--coordinator"),
    (["--coordinator", "http://"], {}, "--coordinator"),
    ([], {"DT_COORDINATOR_URL": "garbage"}, "DT_COORDINATOR_URL"),
    (["--max-concurrent-tasks", "0"], {}, "--max-concurrent-tasks"),
    (["--max-concurrent-tasks", "-2"], {}, "--max-concurrent-tasks"),
    (["--reconnect-attempts", "0"], {}, "--reconnect-attempts"),
    (["--heartbeat-interval", "-1"], {}, "--heartbeat-interval"),
    (["--heartbeat-interval", "0"], {}, "--heartbeat-interval"),
    (["--reconnect-interval", "0"], {}, "--reconnect-interval"),
    (["--task-timeout", "0"], {}, "--task-timeout"),
    (["--task-timeout", "-5"], {}, "--task-timeout"),
    (["--test-root", "/nonexistent/dt-test-root"], {}, "--test-root"),
    (["--pipeline-depth", "-1"], {}, "--pipeline-depth"),
    (["--pipeline-depth", "257"], {}, "--pipeline-depth"),
    (["--pipeline-depth", "deep"], {}, "--pipeline-depth"),
    ([], {"DT_PIPELINE_DEPTH": "1.5"}, "DT_PIPELINE_DEPTH"),
    ([], {"DT_PIPELINE_DEPTH": "-3"}, "DT_PIPELINE_DEPTH"),
])
def test_bad_values_raise_config_error_naming_the_source(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(*argv, env=env)
    assert str(info.value).startswith(f"{needle}:"), str(info.value)


def test_test_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file.py").write_text("")
    with pytest.raises(ConfigError, match="^--test-root: .* is not a directory"):
        cfg("--test-root", str(tmp_path / "file.py"))


def test_flag_error_names_the_flag_even_when_the_variable_is_fine() -> None:
    with pytest.raises(ConfigError, match="^--coordinator:"):
        cfg("--coordinator", "ftp://x", env={"DT_COORDINATOR_URL": "http://ok:1"})


@pytest.mark.parametrize("argv", [
    ["--max-concurrent-tasks", "two"], ["--reconnect-attempts", "1.5"], ["--heartbeat-interval", "fast"],
    ["--log-level", "TRACE"], ["--no-such-flag"],
])
def test_malformed_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARNING", "ERROR"])
def test_log_level_choices(level: str) -> None:
    assert build_parser().parse_args(["--log-level", level]).log_level == level
    assert build_parser().parse_args([]).log_level == "INFO"


# ------------------------------------------------------------------------------ credentials


def creds(*argv: str, env: dict[str, str] | None = None) -> Credentials:
    c = cfg(*argv, env=env)
    return Credentials(c.coordinator_url, api_key=c.api_key, token=c.token, token_file=c.token_file)


def test_no_credentials_at_all_is_an_error_naming_every_option() -> None:
    with pytest.raises(ConfigError, match=r"^no credentials: pass --api-key \(or DT_API_KEY\), --token or --token-file"):
        creds()


@pytest.mark.parametrize(("argv", "env", "named"), [
    (["--api-key", "dtk_a_b", "--token", "h.p.s"], {}, "--api-key, --token"),
    (["--api-key", "dtk_a_b", "--token-file", "/jwt"], {}, "--api-key, --token-file"),
    (["--token", "h.p.s", "--token-file", "/jwt"], {}, "--token, --token-file"),
    (["--token", "h.p.s", "--token-file", "/jwt"], {"DT_API_KEY": "dtk_env"}, "--token, --token-file"),
])
def test_two_kinds_of_credential_are_an_error(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^give only one of {named}$"):
        creds(*argv, env=env)


def test_dt_api_key_alone_is_enough() -> None:
    assert creds(env={"DT_API_KEY": "dtk_env_key"}).api_key == "dtk_env_key"


def test_api_key_credentials_never_renew() -> None:
    assert creds("--api-key", "dtk_a_b").renew_in(0.0) is None


def test_ca_file_variable_and_precedence() -> None:
    assert cfg().ca_file is None
    assert cfg(env={"DT_CA_FILE": "/env/ca.pem"}).ca_file == Path("/env/ca.pem")
    assert cfg("--ca-file", "/flag/ca.pem", env={"DT_CA_FILE": "/env/ca.pem"}).ca_file == Path("/flag/ca.pem")


def test_an_unreadable_ca_file_is_a_config_error_for_an_https_coordinator(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^--ca-file: cannot load CA certificates from"):
        Credentials("https://c.example", api_key="dtk_a_b", ca_file=tmp_path / "missing.pem")
    assert Credentials("http://c.example", api_key="dtk_a_b", ca_file=tmp_path / "missing.pem").ssl is None


@pytest.mark.parametrize(("argv", "env", "port", "host"), [
    ([], {}, None, "127.0.0.1"),
    (["--metrics-port", "9101"], {}, 9101, "127.0.0.1"),
    ([], {"DT_METRICS_PORT": "0", "DT_METRICS_HOST": "0.0.0.0"}, 0, "0.0.0.0"),
    (["--metrics-port", "9102", "--metrics-host", "::1"], {"DT_METRICS_PORT": "1", "DT_METRICS_HOST": "x"}, 9102, "::1"),
])
def test_metrics_port_flags_and_variables(argv: list[str], env: dict[str, str], port: int | None, host: str) -> None:
    c = cfg(*argv, env=env)
    assert (c.metrics_port, c.metrics_host) == (port, host)


@pytest.mark.parametrize(("argv", "env", "named"), [
    (["--metrics-port", "abc"], {}, "--metrics-port"),
    ([], {"DT_METRICS_PORT": "-1"}, "DT_METRICS_PORT"),
])
def test_bad_metrics_port_names_its_source(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        cfg(*argv, env=env)


def test_several_coordinator_urls_from_the_flag_or_the_variable() -> None:
    c = cfg("--coordinator", "http://a:1, https://b:2/x/ ,http://a:1")
    assert c.urls == ("http://a:1", "https://b:2/x") and c.coordinator_url == "http://a:1"
    assert cfg(env={"DT_COORDINATOR_URL": "http://c:3,http://d:4"}).urls == ("http://c:3", "http://d:4")
    assert cfg("--coordinator", "http://e:5", env={"DT_COORDINATOR_URL": "http://c:3,http://d:4"}).urls == ("http://e:5",)
    with pytest.raises(ConfigError, match="--coordinator.*ftp://x"):
        cfg("--coordinator", "http://a:1,ftp://x")
    with pytest.raises(ConfigError, match="DT_COORDINATOR_URL: give at least one"):
        cfg(env={"DT_COORDINATOR_URL": " , "})
    # an https member anywhere in the list makes the worker verify certificates for all
    assert Credentials("http://a:1", api_key="k", others=("http://a:1", "https://b:2")).ssl is not None
    assert Credentials("http://a:1", api_key="k", others=("http://a:1",)).ssl is None


def test_high_availability_from_the_flag_or_the_variable() -> None:
    assert cfg().high_availability is False
    assert cfg("--high-availability").high_availability is True
    assert cfg(env={"DT_HIGH_AVAILABILITY": "yes"}).high_availability is True
    assert cfg(env={"DT_HIGH_AVAILABILITY": "0"}).high_availability is False
    with pytest.raises(ConfigError, match="DT_HIGH_AVAILABILITY: must be 1/true/yes or 0/false/no, got 'maybe'"):
        cfg(env={"DT_HIGH_AVAILABILITY": "maybe"})
