"""TestExecutor running real pytest child processes on files written into tmp_path."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from executor_support import run, wait_until

from distributed_testing.errors import ExecutionError
from distributed_testing.worker.executors import TaskContext, TestExecutor
from distributed_testing.worker.executors.proc import pid_alive

pytestmark = pytest.mark.timeout(60)

# Third-party pytest plugins in this venv (hypothesis, ...) add ~1.5 s to each pytest start.
FAST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

PASSING = """
    import os

    def test_one():
        assert 1 + 1 == 2

    def test_extra_env_reaches_pytest():
        assert os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
"""

MIXED = """
    import pytest

    def test_ok():
        pass

    def test_bad():
        assert 1 == 2, "one is not two"

    class TestGroup:
        def test_also_bad(self):
            raise RuntimeError("kaput")

        @pytest.mark.skip(reason="not today")
        def test_skipped(self):
            pass

    @pytest.fixture
    def broken():
        raise OSError("fixture broke")

    def test_uses_broken(broken):
        pass
"""

SKIPPED = """
    import pytest

    @pytest.mark.skip(reason="nothing to see")
    def test_skip():
        pass
"""


def write(root: Path, rel: str, source: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def ctx(root: Path, test_file: str, args: list[str] | None = None, **kw) -> TaskContext:
    config: dict = {"test_file": test_file, "test_args": args or []}
    if "config_timeout" in kw:
        config["timeout_s"] = kw.pop("config_timeout")
    return TaskContext(task_id="t1", attempt=1, type="test", config=config, test_root=root, **kw)


def execute(context: TaskContext):
    return run(TestExecutor(extra_env=FAST_ENV).run(context))


def test_passing_file_succeeds(tmp_path: Path) -> None:
    write(tmp_path, "tests/test_pass.py", PASSING)
    out = execute(ctx(tmp_path, "tests/test_pass.py"))
    assert out.status == "succeeded", out.error
    assert out.error is None
    o = out.output
    assert (o["passed"], o["failed"], o["skipped"], o["errors"], o["total"], o["exit_code"]) == (2, 0, 0, 0, 2, 0)
    assert [t["nodeid"] for t in o["tests"]] == [
        "tests/test_pass.py::test_one",
        "tests/test_pass.py::test_extra_env_reaches_pytest",
    ]
    assert all(t["outcome"] == "passed" and t["duration_s"] >= 0 for t in o["tests"])
    assert "2 passed" in o["stdout_tail"]


def test_failures_are_reported_per_test(tmp_path: Path) -> None:
    write(tmp_path, "test_mixed.py", MIXED)
    out = execute(ctx(tmp_path, "test_mixed.py"))
    assert out.status == "failed"
    assert out.error == "2 of 5 tests failed; 1 errored"
    tests = {t["nodeid"]: t for t in out.output["tests"]}
    assert tests["test_mixed.py::test_ok"]["outcome"] == "passed"
    assert tests["test_mixed.py::test_bad"]["outcome"] == "failed"
    assert "one is not two" in tests["test_mixed.py::test_bad"]["message"]
    assert tests["test_mixed.py::TestGroup::test_also_bad"]["message"] == "RuntimeError: kaput"
    assert tests["test_mixed.py::TestGroup::test_skipped"]["outcome"] == "skipped"
    assert tests["test_mixed.py::TestGroup::test_skipped"]["message"] == "not today"
    assert tests["test_mixed.py::test_uses_broken"]["outcome"] == "error"
    assert "fixture broke" in tests["test_mixed.py::test_uses_broken"]["message"]
    assert out.output["exit_code"] == 1


def test_args_are_passed_as_a_list(tmp_path: Path) -> None:
    write(tmp_path, "test_mixed.py", MIXED)
    marker = tmp_path / "injected"
    out = execute(ctx(tmp_path, "test_mixed.py", ["-k", f"test_ok or $(touch {marker})"]))
    assert out.status == "failed"  # one -k expression that pytest rejects; no shell ran it
    assert out.output["exit_code"] == 4
    assert out.error.startswith("pytest exit code 4 (usage error): ERROR: Wrong expression passed to '-k'")
    assert not marker.exists()
    out = execute(ctx(tmp_path, "test_mixed.py", ["-k", "test_ok or test_skipped"]))
    assert out.status == "succeeded", out.error
    assert (out.output["passed"], out.output["skipped"], out.output["total"]) == (1, 1, 2)


def test_node_id_suffix_selects_one_test(tmp_path: Path) -> None:
    write(tmp_path, "test_mixed.py", MIXED)
    out = execute(ctx(tmp_path, "test_mixed.py::test_ok"))
    assert out.status == "succeeded"
    assert [t["nodeid"] for t in out.output["tests"]] == ["test_mixed.py::test_ok"]


def test_all_skipped_succeeds(tmp_path: Path) -> None:
    write(tmp_path, "test_skip.py", SKIPPED)
    out = execute(ctx(tmp_path, "test_skip.py"))
    assert out.status == "succeeded"
    assert (out.output["skipped"], out.output["total"]) == (1, 1)
    assert out.output["tests"][0]["message"] == "nothing to see"


def test_collection_error_fails_with_output_tail(tmp_path: Path) -> None:
    write(tmp_path, "test_broken.py", "import dt_module_that_does_not_exist\n")
    out = execute(ctx(tmp_path, "test_broken.py"))
    assert out.status == "failed"
    assert out.output["exit_code"] == 2
    assert out.error.startswith("pytest exit code 2 (interrupted")
    assert "dt_module_that_does_not_exist" in out.error
    assert out.output["errors"] == 1


def test_no_tests_collected(tmp_path: Path) -> None:
    write(tmp_path, "test_empty.py", "X = 1\n")
    out = execute(ctx(tmp_path, "test_empty.py"))
    assert (out.status, out.error, out.output["exit_code"]) == ("failed", "no tests collected", 5)


@pytest.mark.parametrize("bad", ["../outside.py", "/etc/passwd", "sub/../../outside.py"])
def test_paths_escaping_the_root_are_rejected(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    write(tmp_path, "outside.py", PASSING)
    with pytest.raises(ExecutionError, match="outside the test root") as info:
        execute(ctx(root, bad))
    assert bad in str(info.value) and str(root) in str(info.value)


def test_symlink_escaping_the_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    target = write(tmp_path, "outside/test_x.py", PASSING)
    (root / "test_link.py").symlink_to(target)
    with pytest.raises(ExecutionError, match="outside the test root"):
        execute(ctx(root, "test_link.py"))


def test_missing_file_and_bad_config_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ExecutionError, match="not found under the test root"):
        execute(ctx(tmp_path, "test_missing.py"))
    with pytest.raises(ExecutionError, match=r"Expected `array`, got `str` - at `\$.test_args`"):
        execute(TaskContext("t", 1, "test", {"test_file": "x.py", "test_args": "-q"}, test_root=tmp_path))
    with pytest.raises(ExecutionError, match="unknown field `shell`"):
        execute(TaskContext("t", 1, "test", {"test_file": "x.py", "shell": True}, test_root=tmp_path))


SLOW = """
    import subprocess
    import time
    from pathlib import Path

    def test_slow():
        child = subprocess.Popen(["sleep", "60"])
        Path("{pidfile}.part").write_text(str(child.pid))
        Path("{pidfile}.part").rename("{pidfile}")  # whole when it appears: the test reads it at once
        print("started sleeper", flush=True)
        time.sleep(60)
"""


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper.pid"
    write(tmp_path, "test_slow.py", SLOW.format(pidfile=pidfile))
    out = execute(ctx(tmp_path, "test_slow.py", ["-s"], config_timeout=5, timeout_s=30))
    assert out.status == "timed_out"
    assert out.error.startswith("pytest timed out after 5 s")
    assert out.output["exit_code"] is None
    assert "started sleeper" in out.output["stdout_tail"]
    sleeper = int(pidfile.read_text())
    run(wait_until(lambda: not pid_alive(sleeper), what=f"sleeper {sleeper} to die"))


def test_cancellation_kills_pytest(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper.pid"
    write(tmp_path, "test_slow.py", SLOW.format(pidfile=pidfile))

    async def body() -> int:
        task = asyncio.create_task(TestExecutor(extra_env=FAST_ENV).run(ctx(tmp_path, "test_slow.py")))
        await wait_until(pidfile.exists, what="the test to start its sleeper")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        sleeper = int(pidfile.read_text())
        await wait_until(lambda: not pid_alive(sleeper), what=f"sleeper {sleeper} to die")
        return sleeper

    run(body())


HOG = """
    import time

    def test_hog():
        held = b"x" * (300 * 1024 * 1024)
        time.sleep(60)
        assert held
"""


def test_memory_limit_kills_pytest(tmp_path: Path) -> None:
    write(tmp_path, "test_hog.py", HOG)
    out = execute(ctx(tmp_path, "test_hog.py", max_memory_mb=100, timeout_s=40))
    assert out.status == "failed"
    assert out.error.startswith("memory limit of 100 MB exceeded: peak RSS")
    assert out.output["peak_rss_mb"] > 100


def test_a_usage_error_says_pytests_reason_first(tmp_path: Path) -> None:
    """Before pytest's trailing warnings, which buried it at the end of the error."""
    write(tmp_path, "test_mixed.py", MIXED)
    out = execute(ctx(tmp_path, "test_mixed.py::test_nope"))
    assert out.status == "failed" and out.output["exit_code"] == 4
    assert out.error.startswith("pytest exit code 4 (usage error): ERROR: not found: "), out.error
    assert "test_mixed.py::test_nope" in out.error.splitlines()[0]


def test_a_log_line_of_the_tests_is_not_taken_for_pytests_error() -> None:
    from distributed_testing.worker.executors.test import pytest_errors

    text = ("ERROR    root:test_x.py:3 a log record of the test\n"
            "ERROR: file or directory not found: nothere.py\n"
            "ERROR test_y.py - ModuleNotFoundError: No module named 'zzz'\n")
    assert pytest_errors(text) == ("ERROR: file or directory not found: nothere.py; "
                                    "ERROR test_y.py - ModuleNotFoundError: No module named 'zzz'")


LOUD_FAILURES = """
    import pytest

    @pytest.mark.parametrize("n", range(150))
    def test_loud(n):
        print("o" * 20000)
        assert n < 0, "x" * 20000
"""


def test_reports_too_large_for_one_result_are_trimmed_and_every_outcome_kept(tmp_path: Path) -> None:
    """150 failing tests that each print 20,000 characters and fail with a 20,000-character message
    give reports of more than a result may carry (8 MiB): the whole result was refused, and each
    test came back as an error of the task. Trimmed, every test is its own failure."""
    from distributed_testing.protocol.codec import free_form_payload
    from distributed_testing.worker.core.output import MAX_OUTPUT_BYTES, bound

    write(tmp_path, "test_loud.py", LOUD_FAILURES)
    out = execute(ctx(tmp_path, "test_loud.py"))
    assert out.status == "failed", out.error
    tests = out.output["tests"]
    assert len(tests) == 150 and {t["outcome"] for t in tests} == {"failed"}
    assert all(t["message"].startswith("AssertionError: xxx") for t in tests)
    assert "did not fit one result" in out.output["reports_trimmed"]
    assert len(free_form_payload(out.output)) <= MAX_OUTPUT_BYTES
    assert bound(out.status, out.output, out.error)[0] == "failed"
