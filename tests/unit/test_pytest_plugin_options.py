"""Which options of the local pytest invocation each task carries (plugin/invocation.py), read
from real pytest configs: what changes the run is sent (conftest options too), what acts here is
not, and what cannot travel is a usage error before anything is sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.config import _prepareconfig

from distributed_testing.plugin.invocation import invocation

CONFTEST = ("def pytest_addoption(parser):\n"
            "    parser.addoption('--runslow', action='store_true')\n"
            "    parser.addoption('--data-dir')\n")


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tree with its ini and conftest at the root; pytest runs from its ``tests`` folder."""
    root = tmp_path / "tree"
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs one\n")
    (root / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    monkeypatch.chdir(root / "tests")
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(name, raising=False)
    yield root


def _config(*args: str) -> pytest.Config:
    config = _prepareconfig(list(args))
    config._ensure_unconfigure()  # nothing configured: only the parsed options are read
    return config


def test_what_changes_the_run_travels_and_what_acts_here_stays(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "--tb=short -p no:cacheprovider")
    config = _config("-p", "no:asyncio", "-o", "xfail_strict=true", "-o", "cache_dir=/tmp/c", "-W", "error::DeprecationWarning",
                     "-k", "a and not b", "-mnot gpu", "--import-mode=importlib", "--strict-markers", "-vv", "-rA",
                     "--junitxml", str(tree.parent / "x.xml"), "-x", "--runslow", "--data-dir", str(tree / "data"),
                     "--confcutdir", str(tree), "--basetemp=/tmp/bt", "--ignore", "legacy", "--ignore=/elsewhere/x",
                     "--ignore-glob=*_old.py", "--ignore-glob", str(tree / "tests" / "gen" / "*"),
                     "--ignore-glob", str(tree.parent / "*"), "--lf", "--deselect", "tests/test_a.py::x",
                     "-c", "../pytest.ini", "--rootdir", "..", "test_a.py")
    env = {"PYTEST_ADDOPTS": "--tb=short -p no:cacheprovider", "PYTEST_PLUGINS": "myplugin"}
    inv = invocation(config, tree, env, shipped=True)
    assert inv.args == ("--config-file=pytest.ini", "--rootdir=.", "--tb=short",
                        "-p", "no:cacheprovider",  # no cache here: none there (the cache fixture fails alike)
                        "-p", "no:asyncio",
                        "--override-ini=xfail_strict=true", "--pythonwarnings=error::DeprecationWarning",
                        "-ka and not b", "-mnot gpu", "--import-mode=importlib", "--strict-markers", "--runslow",
                        "--data-dir=../data",  # a path in the tree, from where the task's pytest runs
                        "--confcutdir=.",
                        # the ignored paths: relative to the tree (--ignore) or to where pytest runs (a glob);
                        # none outside the tree
                        "--ignore=tests/legacy", "--ignore-glob=*_old.py", "--ignore-glob=gen/*",
                        "-p", "myplugin",
                        "--junitxml=/dev/null",  # the XML is written here; junitxml acts there too
                        "--verbosity=2")
    assert inv.cwd == "tests" and inv.local_ids
    shared = invocation(config, tree, env, shipped=False)  # the workers' own tree: their rootdir and ini
    assert "--config-file=pytest.ini" in shared.args and not shared.local_ids
    assert "no:cacheprovider" not in shared.args  # -p needs the operator's leave there
    assert not any(a.startswith(("--rootdir", "--junitxml")) for a in shared.args)


@pytest.mark.parametrize(("args", "needle"), [
    (["--pdb"], "--pdb needs the terminal of the process that runs the test"),
    (["--trace"], "--trace needs the terminal"),
    (["--setup-show"], "--setup-show needs the terminal"),  # pytest prints its lines there, in no report
    (["--setup-only"], "--setup-only needs the terminal"),
    (["--confcutdir", "/"], "--confcutdir / lies outside the tree the workers run"),
    (["--data-dir", "/srv/data"], "--data-dir /srv/data: a path outside the tree"),
])
def test_what_cannot_travel_is_a_usage_error(tree: Path, args: list[str], needle: str) -> None:
    with pytest.raises(pytest.UsageError, match="distributed_testing: ") as info:
        invocation(_config(*args), tree, {}, shipped=True)
    assert needle in str(info.value)


def test_a_shipped_tree_must_hold_the_ini_pytest_read(tree: Path) -> None:
    with pytest.raises(pytest.UsageError, match=r"not in the shipped tree .* --dt-test-root"):
        invocation(_config(), tree / "tests", {}, shipped=True)
    (tree / ".dtignore").write_text("*.ini\n")
    with pytest.raises(pytest.UsageError, match=r"leaves out of the bundle; re-include it with '!pytest.ini'"):
        invocation(_config(), tree, {}, shipped=True)
    assert invocation(_config(), tree / "tests", {}, shipped=False).args == ("--verbosity=0",)  # the workers' tree: theirs to hold


# pytest-benchmark's options as it declares them (5.x), in a conftest standing in for the plugin
BENCHMARK_OPTIONS = ("\n\ndef pytest_addoption(parser):\n"
                     "    for flag in ('--benchmark-disable', '--benchmark-enable', '--benchmark-skip', '--benchmark-only',\n"
                     "                 '--benchmark-autosave'):\n"
                     "        parser.addoption(flag, action='store_true', default=False)\n"
                     "    parser.addoption('--benchmark-json')\n"
                     "    parser.addoption('--benchmark-compare-fail', action='append')\n"
                     "    parser.addoption('--benchmark-min-rounds', type=int, default=5)\n")


@pytest.fixture
def benchmarking(tree: Path) -> Path:
    (tree / "tests" / "conftest.py").write_text(BENCHMARK_OPTIONS)
    return tree


def test_benchmarks_run_disabled_on_the_fleet_and_their_saving_stays_here(benchmarking: Path) -> None:
    """As pytest-benchmark turns itself off under pytest-xdist: the workers' pytest gets
    ``--benchmark-disable`` where the environment (which carries the plugin) travels; what saves or
    compares this process's benchmarks is not sent."""
    config = _config("--benchmark-json", "b.json", "--benchmark-compare-fail=min:5%", "--benchmark-autosave",
                     "--benchmark-min-rounds=3")
    args = invocation(config, benchmarking, {}, shipped=True).args
    assert "--benchmark-disable" in args and "--benchmark-min-rounds=3" in args
    assert not any(a.startswith(("--benchmark-json", "--benchmark-compare", "--benchmark-autosave")) for a in args)
    assert "--benchmark-disable" not in invocation(config, benchmarking, {}, shipped=False).args  # not its plugins
    for already in (["--benchmark-disable"], ["--benchmark-skip"]):  # timed nowhere: sent as given, nothing added
        assert invocation(_config(*already), benchmarking, {}, shipped=True).args.count("--benchmark-disable") \
            == already.count("--benchmark-disable")


def test_benchmark_only_is_refused(benchmarking: Path) -> None:
    with pytest.raises(pytest.UsageError, match="--benchmark-only runs nothing but pytest-benchmark's benchmarks"):
        invocation(_config("--benchmark-only"), benchmarking, {}, shipped=True)


def test_no_benchmark_option_without_pytest_benchmark(tree: Path) -> None:
    assert not any(a.startswith("--benchmark") for a in invocation(_config(), tree, {}, shipped=True).args)


def test_the_shipping_threads_imports_are_made_before_they_start() -> None:
    # a logger made in a shipping thread while pytest walked the loggers at collection: INTERNALERROR
    import sys

    from distributed_testing.plugin.fleet import SHIPPING_IMPORTS, preload

    preload()
    assert all(f"distributed_testing.{name}" in sys.modules for name in SHIPPING_IMPORTS)
