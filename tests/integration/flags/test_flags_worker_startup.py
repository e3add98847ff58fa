"""``dt-worker`` refuses to start, with exit code 2 and a message naming the flag or variable,
when its configuration or credentials are wrong (``cli.worker.main`` in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flags_support import refusing_port

from distributed_testing.cli import worker as worker_cli

pytestmark = pytest.mark.timeout(60)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = worker_cli.main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--coordinator", "ftp://x", "--api-key", "dtk_a_b"], {}, "--coordinator: expected an http(s) URL"),
    (["--api-key", "dtk_a_b"], {"DT_COORDINATOR_URL": "garbage"}, "DT_COORDINATOR_URL: expected an http(s) URL"),
    (["--coordinator", "http://127.0.0.1:abc", "--api-key", "dtk_a_b"], {}, "--coordinator: expected an http(s) URL"),
    (["--api-key", "dtk_a_b"], {"DT_COORDINATOR_URL": "http://[::1"}, "DT_COORDINATOR_URL: expected an http(s) URL"),
    (["--api-key", "dtk_a_b", "--max-concurrent-tasks", "0"], {}, "--max-concurrent-tasks: must be >= 1"),
    (["--api-key", "dtk_a_b", "--tags", " , "], {}, "--tags: ' , ' names no tag"),
    (["--api-key", "dtk_a_b", "--reconnect-attempts", "0"], {}, "--reconnect-attempts: must be >= 1"),
    (["--api-key", "dtk_a_b", "--heartbeat-interval", "-1"], {}, "--heartbeat-interval: must be > 0"),
    (["--api-key", "dtk_a_b", "--test-root", "/nonexistent/dt-root"], {}, "--test-root: /nonexistent/dt-root is not a directory"),
])
def test_bad_values_exit_2_naming_the_flag_or_variable(
        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], env: dict[str, str], needle: str) -> None:
    for k, v in env.items():
        clean_env.setenv(k, v)
    code, err = run_main(capsys, *argv)
    assert code == 2
    assert f"dt-worker: {needle}" in err


def test_no_credentials_at_all_is_a_clear_startup_error(
        clean_env: pytest.MonkeyPatch, fast_hardware: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(capsys, "--coordinator", f"http://127.0.0.1:{refusing_port()}")
    assert code == 2
    assert "dt-worker: no credentials: pass --api-key (or DT_API_KEY), --token or --token-file" in err


@pytest.mark.parametrize("extra", [["--token", "a.b.c"], ["--token-file", "/some/file"]])
def test_two_kinds_of_credential_at_once_is_an_error(
        clean_env: pytest.MonkeyPatch, fast_hardware: None, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    code, err = run_main(capsys, "--coordinator", f"http://127.0.0.1:{refusing_port()}", "--api-key", "dtk_a_b", *extra)
    assert code == 2
    assert f"dt-worker: give only one of --api-key, {extra[0]}" in err


def test_dt_api_key_variable_counts_as_a_credential(
        clean_env: pytest.MonkeyPatch, fast_hardware: None, capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("DT_API_KEY", "dtk_a_b")  # nothing listens: the worker gets past the credential check
    code, err = run_main(capsys, "--coordinator", f"http://127.0.0.1:{refusing_port()}", "--reconnect-attempts", "1")
    assert code == 1
    assert "no credentials" not in err


@pytest.mark.parametrize("content", [None, ""])
def test_unreadable_or_empty_token_file_exits_2_naming_token_file(
        clean_env: pytest.MonkeyPatch, fast_hardware: None, capsys: pytest.CaptureFixture[str],
        tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    code, err = run_main(capsys, "--coordinator", f"http://127.0.0.1:{refusing_port()}", "--token-file", str(path))
    assert code == 2
    assert "dt-worker: --token-file: " in err and str(path) in err
