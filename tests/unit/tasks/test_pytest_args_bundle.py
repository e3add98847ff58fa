"""The worker's rule for a shipped tree's pytest options (it runs in the bundle sandbox, so the
options that act on that run alone are allowed, their paths inside the tree) and the rebasing of
test paths for a pytest that runs below the root."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.errors import ExecutionError
from distributed_testing.tasks.pytest_args import rebase_test_paths, refused_test_args
from distributed_testing.worker.executors.test import pytest_argv, task_cwd

LOCAL_INVOCATION = ["-p", "no:asyncio", "--override-ini=xfail_strict=true", "-Werror::DeprecationWarning",
                    "--config-file=sub/pytest.ini", "--rootdir=sub", "--confcutdir=sub", "--import-mode=importlib",
                    "-kfast and not slow", "-mnot gpu", "--strict-markers", "--tb=short", "--runslow",
                    # pytest-cov, where the run's coverage travels (plugin/invocation.py COVERAGE)
                    "--cov=pkg", "--cov", "--cov-branch", "--cov-config=sub/.coveragerc", "--cov-report=", "--no-cov"]


def test_a_bundle_may_use_the_options_that_act_on_its_run_alone(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert refused_test_args(LOCAL_INVOCATION, root=tmp_path, bundle=True) == []
    refused = refused_test_args(LOCAL_INVOCATION, root=tmp_path)  # an operator's test root: today's rule
    assert [e.split("'")[1] for e in refused] == ["-p", "--override-ini", "-W", "--config-file", "--rootdir",
                                                   "--confcutdir", "--import-mode", "--cov", "--cov",
                                                   "--cov-config", "--cov-report"]


@pytest.mark.parametrize(("args", "needle"), [
    (["-c", "/etc/pytest.ini"], "outside the test root"),
    (["--rootdir=/"], "outside the test root"),
    (["--confcutdir", "../.."], "outside the test root"),
    (["--cov-config=/etc/coveragerc"], "outside the test root"),
    (["--report-log=/tmp/x.json"], "--allow-test-options --report-log"),
    (["--basetemp", "/tmp/x"], "--allow-test-options --basetemp"),
    (["--pdb"], "--allow-test-options --pdb"),
    (["--dt-coordinator=http://x:1"], "own pytest plugin"),
])
def test_a_bundle_still_may_not_leave_its_tree_or_write_elsewhere(tmp_path: Path, args: list[str], needle: str) -> None:
    errors = refused_test_args(args, root=tmp_path, bundle=True)
    assert errors and needle in errors[0], errors


def test_paths_given_from_the_root_are_rebased_for_a_pytest_that_runs_below_it(tmp_path: Path) -> None:
    cwd = tmp_path / "sub"
    args = ["pkg/test_a.py::test_x", "-c", "sub/pytest.ini", "--rootdir=sub", "--ignore", "pkg/slow",
            "--deselect", "pkg/test_a.py::test_y", "--name", "4", "--dir=rel", "/abs/test_b.py", "-kexpr"]
    assert rebase_test_paths(args, tmp_path, cwd) == [
        "../pkg/test_a.py::test_x", "-c", "pytest.ini", "--rootdir=.", "--ignore", "../pkg/slow",
        "--deselect", "pkg/test_a.py::test_y",  # a node id prefix, matched from the rootdir
        "--name", "4", "--dir=rel",  # a conftest option's value is its own business
        "/abs/test_b.py", "-kexpr"]
    assert rebase_test_paths(args, tmp_path, tmp_path) == args


def test_the_task_runs_where_the_submitter_ran_or_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert task_cwd(tmp_path, "sub") == tmp_path / "sub"
    assert task_cwd(tmp_path, None) == task_cwd(tmp_path, "gone") == tmp_path
    with pytest.raises(ExecutionError, match="outside the test root"):
        task_cwd(tmp_path, "..")
    argv = pytest_argv("pkg/test_a.py", tmp_path, ["--verbosity=2", "pkg/test_b.py"], tmp_path / "r.jsonl",
                       "python", cwd=tmp_path / "sub")
    assert argv[3:8] == ["../pkg/test_a.py", f"--rootdir={tmp_path}", "-q", "--verbosity=2", "../pkg/test_b.py"]


def test_a_task_has_its_own_cache_unless_its_options_turn_the_cache_off(tmp_path: Path) -> None:
    """pytest's cache is the task's (the ``cache`` fixture works, the ini's ``cache_dir`` is known,
    nothing is written into the tree); ``-p no:cacheprovider`` from the submitter leaves it off, as
    it was there, and no ``cache_dir`` names an option no plugin knows."""
    cache = tmp_path / "scratch" / "pytest-cache"
    argv = pytest_argv("t.py", tmp_path, ["-k", "x"], tmp_path / "r.jsonl", "python", cache_dir=cache)
    assert argv[argv.index("-o") + 1] == f"cache_dir={cache}" and "no:cacheprovider" not in argv
    argv = pytest_argv("t.py", tmp_path, [], tmp_path / "r.jsonl", "python", cache_dir=cache)  # most tasks have no options
    assert argv[argv.index("-o") + 1] == f"cache_dir={cache}" and "no:cacheprovider" not in argv
    argv = pytest_argv("t.py", tmp_path, ["-p"], tmp_path / "r.jsonl", "python", cache_dir=cache)  # pytest's error to give
    assert argv[argv.index("-o") + 1] == f"cache_dir={cache}"
    for off in (["-p", "no:cacheprovider"], ["-pno:cacheprovider"]):
        argv = pytest_argv("t.py", tmp_path, off, tmp_path / "r.jsonl", "python", cache_dir=cache)
        assert not any(a.startswith("cache_dir=") for a in argv) and "no:cacheprovider" in " ".join(argv)
    assert "no:cacheprovider" in pytest_argv("t.py", tmp_path, [], tmp_path / "r.jsonl", "python")  # no place for one


def test_a_node_id_that_holds_the_local_tree_travels_as_the_workers_own(tmp_path: Path) -> None:
    from distributed_testing.plugin.chunks import portable_id
    from distributed_testing.tasks.pytest_args import TREE_MARK

    local = Path("/home/me/proj")
    sent = portable_id(f"t.py::test_f[{local}/data/a.txt-{local}2/x]", local)
    assert sent == f"t.py::test_f[{TREE_MARK}/data/a.txt-{local}2/x]"  # another directory's path is not the tree's
    assert portable_id("t.py::test_plain", local) == "t.py::test_plain"
    assert portable_id(f"{local}/t.py", local) == f"{local}/t.py"  # a path argument is no node id
    worker = tmp_path / "tree"
    (worker / "sub").mkdir(parents=True)
    assert rebase_test_paths([sent, "-k", "x"], worker, worker) == [f"t.py::test_f[{worker}/data/a.txt-{local}2/x]",
                                                                   "-k", "x"]
    assert rebase_test_paths([sent], worker, worker / "sub") == [f"../t.py::test_f[{worker}/data/a.txt-{local}2/x]"]
