"""``dt`` command line: how the coordinator URL and key are chosen (flags win over DT_COORDINATOR_URL
and DT_API_KEY), and the subcommand flags' parsing. No network."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.cli import dt
from distributed_testing.errors import ConfigError

VARS = ("DT_COORDINATOR_URL", "DT_API_KEY", "DT_CA_FILE")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def client(*argv: str):  # type: ignore[no-untyped-def]
    return dt.client_from_args(dt.build_parser().parse_args([*argv, "workers"]))


def test_defaults_to_localhost(env: pytest.MonkeyPatch) -> None:
    api = client("--api-key", "k")
    assert (api.base_url, api.credential) == ("http://localhost:8080", "k")


def test_variables_are_used_without_flags(env: pytest.MonkeyPatch) -> None:
    env.setenv("DT_COORDINATOR_URL", "https://coord.example/")
    env.setenv("DT_API_KEY", "dtk_env")
    api = client()
    assert (api.base_url, api.credential) == ("https://coord.example", "dtk_env")


def test_flags_win_over_variables(env: pytest.MonkeyPatch) -> None:
    env.setenv("DT_COORDINATOR_URL", "http://env:1")
    env.setenv("DT_API_KEY", "dtk_env")
    api = client("--coordinator", "http://flag:2", "--api-key", "dtk_flag")
    assert (api.base_url, api.credential) == ("http://flag:2", "dtk_flag")


@pytest.mark.parametrize(("argv", "variables", "needle"), [
    (["--coordinator", "ftp://x", "--api-key", "k"], {}, "--coordinator:"),
    (["--api-key", "k"], {"DT_COORDINATOR_URL": "garbage"}, "DT_COORDINATOR_URL:"),
    ([], {}, "no credentials"),
    ([], {"DT_API_KEY": ""}, "no credentials"),
])
def test_bad_connection_settings(env: pytest.MonkeyPatch, argv: list[str], variables: dict[str, str], needle: str) -> None:
    for k, v in variables.items():
        env.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        client(*argv)
    assert str(info.value).startswith(needle)


def test_ca_file_flag_and_variable_choose_the_trusted_ca(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from distributed_testing.testing import make_tls_files

    ca = make_tls_files(tmp_path).ca
    api = client("--coordinator", "https://c.example", "--api-key", "k", "--ca-file", str(ca))
    assert api.ssl_context is not None and api.ssl_context.verify_mode.name == "CERT_REQUIRED"
    assert len(api.ssl_context.get_ca_certs()) == 1  # only the private CA: the flag's file was loaded
    assert client("--coordinator", "http://c.example", "--api-key", "k").ssl_context is None
    env.setenv("DT_CA_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="^DT_CA_FILE: cannot load CA certificates"):
        client("--coordinator", "https://c.example", "--api-key", "k")
    with pytest.raises(ConfigError, match="^--ca-file: cannot load CA certificates"):
        client("--coordinator", "https://c.example", "--api-key", "k", "--ca-file", str(tmp_path / "none.pem"))


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return dt.build_parser().parse_args(list(argv))


def test_subcommand_flags_parse() -> None:
    ns = parse("keys", "create", "--role", "worker", "--name", "n", "--expires-in", "30")
    assert (ns.role, ns.name, ns.expires_in) == ("worker", "n", 30.0)
    ns = parse("submit", "t.json", "--wait", "--timeout", "5", "--junit", "r.xml", "--json", "o.json")
    assert (ns.file, ns.wait, ns.timeout, ns.junit, ns.json_out) == (Path("t.json"), True, 5.0, Path("r.xml"), Path("o.json"))
    assert (parse("submit", "-").wait, parse("submit", "-").timeout) == (False, None)  # None: 3600 s once waiting
    ns = parse("results", "--task-id", "t", "--worker-id", "w", "--status", "failed", "--batch-size", "4", "--limit", "7",
               "--model", "bert", "--precision", "fp16", "--hardware", "cuda", "--format", "csv")
    assert (ns.task_id, ns.worker_id, ns.status, ns.batch_size, ns.limit, ns.model, ns.precision, ns.hardware, ns.format) == (
        "t", "w", "failed", 4, 7, "bert", "fp16", "cuda", "csv")
    assert (parse("results").format, parse("results").limit) == ("table", 100)


@pytest.mark.parametrize("argv", [
    ["keys", "create"], ["keys", "create", "--role", "root"], ["results", "--format", "xml"],
    ["results", "--batch-size", "four"], ["submit"], ["status"], [],
])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
