"""Python requirements of bundle tasks, installed for real by a worker: a bundle that ships its own
package (``./mypkg``, built by setuptools from the worker's environment with no network) and a
test that imports it; the second task needing the same environment reuses it; a requirement pip
cannot satisfy ends the task in ``error`` with pip's message; a refused requirements.txt line is
named; bad requirement strings are refused at submit with 400 naming the field."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import bundle_cluster, run_cluster
from distributed_testing.worker.sandbox import SCRATCH_NAME, available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

PYPROJECT = '''[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1"
dependencies = {deps}
'''
TEST = '''import sys
import mypkg

def test_imports_the_shipped_package():
    assert mypkg.VALUE == 42
    assert mypkg.__file__.startswith(sys.prefix), (mypkg.__file__, sys.prefix)  # installed in the environment
    assert "/pyenvs/" in sys.prefix

def test_nothing_of_the_worker_is_there():
    import importlib.util
    assert importlib.util.find_spec("aiohttp") is None  # the worker's, not a requirement of this bundle
    assert importlib.util.find_spec("distributed_testing") is None
'''


def make_bundle(root: Path, *, requirements: str | None, deps: str = "[]", name: str = "mypkg") -> Path:
    pkg = root / "mypkg"
    (pkg / name).mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT.format(name=name, deps=deps))
    (pkg / name / "__init__.py").write_text("VALUE = 42\n")
    (root / "test_uses_pkg.py").write_text(TEST)
    if requirements is not None:
        (root / "requirements.txt").write_text(requirements)
    return root


def output(done: dict[str, Any]) -> dict[str, Any]:
    return dict((done.get("result") or {}).get("output") or {})


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_bundle_package_is_installed_once_and_reused(tmp_path: Path, sandbox: str) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, sandbox=sandbox, task_network="none",
                           db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        # the environment comes from the bundle's requirements.txt (a comment and a blank line in it)
        first = await asyncio.to_thread(upload, c.base_url, code, make_bundle(
            tmp_path / "a", requirements="# ours\nmsgspec\n\n./mypkg  # the shipped package\n"))
        [t1] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": first}, key=code)
        done1 = await c.wait(t1, timeout=180)
        # the same requirements given in the task, by a bundle without the file: the same environment
        second = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "b", requirements=None))
        [t2] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": second,
                               "requirements": {"python": ["./mypkg", "msgspec"]}}, key=code)
        done2 = await c.wait(t2, timeout=180)
    assert (done1["outcome"] or {}).get("status") == "succeeded", done1
    assert (done2["outcome"] or {}).get("status") == "succeeded", done2
    env1, env2 = output(done1)["python_env"], output(done2)["python_env"]
    assert env1["cached"] is False and env1["build_s"] > 0
    assert env2["cached"] is True and env2["digest"] == env1["digest"]
    # a test task's environment is its set alone, with pytest and the package's build backend added
    assert env1["requirements"] == ["./mypkg", "msgspec", "pytest", "setuptools"] and env1["isolated"] is True
    envs = list((tmp_path / "state").glob("pyenvs/*/.dt-complete"))
    assert len(envs) == 1, envs
    # built by pip as the task's user, shared read-only afterwards: nothing in it stays that user's
    owners = {p.lstat().st_uid for p in envs[0].parent.rglob("*")} | {envs[0].parent.lstat().st_uid}
    assert owners == {os.geteuid()}, owners


async def test_a_changed_package_builds_a_new_environment(tmp_path: Path) -> None:
    """Submitters A and B ship different packages under one entry, spelled ``./mypkg/.`` (which
    once named an environment without the package's files): B's test runs B's package."""
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        digests = []
        for i, root in enumerate([tmp_path / "a", tmp_path / "b"]):
            make_bundle(root, requirements="./mypkg/.\n")
            (root / "mypkg" / "mypkg" / "extra.py").write_text(f"N = {i}\n")
            with (root / "test_uses_pkg.py").open("a") as f:
                f.write(f"\n\ndef test_its_own_package():\n    from mypkg import extra\n    assert extra.N == {i}\n")
            bundle = await asyncio.to_thread(upload, c.base_url, code, root)
            [t] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bundle},
                                 key=code)
            done = await c.wait(t, timeout=180)
            assert (done["outcome"] or {}).get("status") == "succeeded", (done["outcome"], output(done).get("stdout_tail"))
            assert output(done)["python_env"]["cached"] is False
            digests.append(output(done)["python_env"]["digest"])
    assert digests[0] != digests[1]


async def test_pip_failures_end_the_task_in_error_with_pips_message(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        # a dependency no index here has (--no-index for the bundle's own packages: nothing is fetched)
        bad = await asyncio.to_thread(upload, c.base_url, code, make_bundle(
            tmp_path / "a", requirements="./mypkg\n", deps='["definitely-not-here-dt==9.9"]'))
        [t1] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bad}, key=code)
        # a requirements.txt line pip would take as an option
        opt = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "b", requirements="-e .\n"))
        [t2] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": opt}, key=code)
        # a directory the bundle does not have
        plain = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "c3", requirements=None))
        [t3] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": plain,
                               "requirements": {"python": ["./absent"]}}, key=code)
        done1, done2, done3 = [await c.wait(t, timeout=180) for t in (t1, t2, t3)]
    o1, o2, o3 = (d["outcome"] or {} for d in (done1, done2, done3))
    assert o1.get("status") == "error", done1
    assert "installing the task's Python requirements failed" in o1["error"]
    assert "definitely-not-here-dt" in o1["error"], o1["error"]  # pip's own message
    assert o2.get("status") == "error" and "requirements.txt line 1: pip options are not allowed" in o2["error"], o2
    assert o3.get("status") == "error" and "'./absent': not a directory of the bundle" in o3["error"], o3
    assert not list((tmp_path / "state").glob("pyenvs/*/.dt-complete"))  # no half-built env kept


@pytest.mark.parametrize(("python", "field", "says"), [
    (["-e ."], "requirements.python[0]", "pip options are not allowed"),
    (["numpy", "--index-url=https://evil.example/simple"], "requirements.python[1]", "pip options are not allowed"),
    (["-f", "x"], "requirements.python[0]", "pip options are not allowed"),
    (["pkg @ https://evil.example/pkg.whl"], "requirements.python[0]", "URLs and file paths are not allowed"),
    (["git+https://evil.example/x.git"], "requirements.python[0]", "URLs and file paths are not allowed"),
    (["./a/../../etc"], "requirements.python[0]", "must stay inside the bundle"),
    (["/etc/passwd"], "requirements.python[0]", "URLs and file paths are not allowed"),
    (["not a requirement!"], "requirements.python[0]", "not a valid requirement"),
    (["x" * 201], "requirements.python[0]", "at most 200 characters"),
    (["ok"] * 501, "requirements.python", "at most 500"),
])
async def test_bad_requirements_are_refused_at_submit(tmp_path: Path, python: list[str], field: str,
                                                      says: str) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        code = await c.create_key("submitter", allow_code=True)
        bundle = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "a", requirements=None))
        status, body = await c.request("POST", "/api/v1/tasks", key=code, json={
            "type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bundle,
            "requirements": {"python": python}})
        unbundled, body2 = await c.request("POST", "/api/v1/tasks", key=code, json={
            "type": "test", "config": {"test_file": "t.py"}, "requirements": {"python": ["numpy"]}})
    assert status == 400, body
    assert any(e["field"] == field and says in e["error"] for e in body["errors"]), body
    assert unbundled == 400 and body2["errors"][0]["field"] == "requirements.python", body2
    assert "needs a bundle" in body2["errors"][0]["error"]


SLOW_SETUP = '''import os, pathlib, time
pathlib.Path(os.environ["HOME"], "building").write_text("x")
time.sleep(120)
from setuptools import setup
setup()
'''


def _pip_processes(under: Path) -> list[str]:
    """The command lines of pip runs whose interpreter is an environment under ``under``."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(under) in cmd and ("__pip-runner__" in cmd or "_in_process" in cmd):  # not the pool's bwrap (paths)
            out.append(cmd)
    return out


async def test_a_cancel_stops_pip_at_once(tmp_path: Path) -> None:
    from distributed_testing.testing import wait_for

    root = make_bundle(tmp_path / "a", requirements="./mypkg\n")
    (root / "mypkg" / "setup.py").write_text(SLOW_SETUP)
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        bundle = await asyncio.to_thread(upload, c.base_url, code, root)
        [t] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bundle}, key=code)
        await wait_for(lambda: any((tmp_path / "state").glob(f"bundles-*/tasks/*/{SCRATCH_NAME}/building")), timeout=120,
                       what="the package's build to start")
        status, body = await c.request("POST", f"/api/v1/tasks/{t}/cancel")
        assert status == 200, body
        done = await c.wait(t, timeout=60)
        await wait_for(lambda: not _pip_processes(tmp_path / "state"), timeout=30, what="pip to be gone")
        # the cancelled result goes out first; the half-built environment is removed after pip is killed
        await wait_for(lambda: not list((tmp_path / "state").glob("pyenvs/[!.]*")), timeout=30,
                       what="the half-built environment to be removed")
    assert done["state"] == "cancelled", done


async def test_pip_is_stopped_past_its_time_limit(tmp_path: Path) -> None:
    from distributed_testing.bundles.manifest import scan
    from distributed_testing.errors import ExecutionError
    from distributed_testing.worker.pyenv import PythonEnvs
    from distributed_testing.worker.sandbox import Sandbox

    root = make_bundle(tmp_path / "a", requirements=None)
    (root / "mypkg" / "setup.py").write_text(SLOW_SETUP)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    envs = PythonEnvs(tmp_path / "envs", Sandbox(network="none"), timeout_s=5)
    with pytest.raises(ExecutionError, match="ran past 5 s"):
        await envs.ensure(["./mypkg"], root, scan(root)[0], scratch)
    assert not _pip_processes(tmp_path / "envs")
    assert [p.name for p in (tmp_path / "envs").iterdir()] == [".locks"]


async def test_two_tasks_needing_one_environment_build_it_once(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", max_concurrent_tasks=2,
                           db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        bundle = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "a", requirements="./mypkg\n"))
        ids = await c.submit([{"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bundle}] * 2,
                             key=code)
        done = [await c.wait(t, timeout=180) for t in ids]
    assert all((d["outcome"] or {}).get("status") == "succeeded" for d in done), done
    assert sorted(output(d)["python_env"]["cached"] for d in done) == [False, True]
    assert len(list((tmp_path / "state").glob("pyenvs/*/.dt-complete"))) == 1


PROBING_SETUP = '''import os, pathlib, socket
KEY, STATE, PORT = {key!r}, {state!r}, {port}

def blocked(action):
    try:
        action()
    except OSError:
        return True
    return False

problems = []
if not blocked(lambda: open(KEY).read()):
    problems.append("read the worker's key file")
if not blocked(lambda: open(os.path.join(STATE, "planted"), "w").write("x")):
    problems.append("wrote the worker's state directory")
if not blocked(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2)):
    problems.append("connected out")
if "DT_CANARY" in os.environ:
    problems.append("saw the worker's environment")
if problems:
    raise SystemExit("PROBE: " + ", ".join(problems))
from setuptools import setup
setup()
'''


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_shipped_packages_build_reaches_nothing_of_the_worker(tmp_path: Path, sandbox: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("DT_CANARY", "worker-secret")
    state = tmp_path / "state"
    state.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    root = make_bundle(tmp_path / "a", requirements="./mypkg\n")
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, sandbox=sandbox, task_network="none", db_path=state / "outbox.duckdb")
        key_file = state / "worker.key"
        key_file.write_text(c.worker_keys["w0"])
        (root / "mypkg" / "setup.py").write_text(PROBING_SETUP.format(
            key=str(key_file), state=str(state), port=listener.getsockname()[1]))
        code = await c.create_key("submitter", allow_code=True)
        bundle = await asyncio.to_thread(upload, c.base_url, code, root)
        [t] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bundle}, key=code)
        done = await c.wait(t, timeout=180)
    listener.close()
    outcome = done["outcome"] or {}
    if sandbox == "bwrap":
        assert outcome.get("status") == "succeeded", done
        assert not (state / "planted").exists()
    else:  # unconfined: the probe is not vacuous
        assert outcome.get("status") == "error", done
        assert "PROBE: read the worker's key file" in outcome["error"], outcome["error"]


async def test_least_recently_used_environments_beyond_the_cap_are_removed_unless_held(tmp_path: Path) -> None:
    from distributed_testing.bundles.manifest import scan
    from distributed_testing.worker.pyenv import PythonEnvs
    from distributed_testing.worker.sandbox import Sandbox

    root = make_bundle(tmp_path / "a", requirements=None)
    m = scan(root)[0]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    envs = PythonEnvs(tmp_path / "envs", Sandbox(network="none"), max_envs=1)

    def kept() -> set[str]:
        return {p.name for p in (tmp_path / "envs").iterdir()} - {".locks"}

    a = await envs.ensure(["./mypkg"], root, m, scratch)  # held, as by a running task
    b = await envs.ensure(["./mypkg", "msgspec"], root, m, scratch)  # already satisfied: no network
    assert kept() == {a.digest, b.digest}  # over the cap, but both are held
    envs.release(a.digest)
    envs.release(b.digest)
    c = await envs.ensure(["./mypkg", "msgspec>=0.1"], root, m, scratch)
    assert kept() == {c.digest}  # a and b, least recently used and no longer held, are gone
    envs.release(c.digest)
    again = await envs.ensure(["./mypkg", "msgspec>=0.1"], root, m, scratch)
    assert again.cached and kept() == {c.digest}


async def test_relative_cache_and_task_paths_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose --db-path is relative has a relative cache (bwrap needs absolute paths)."""
    from distributed_testing.bundles.manifest import scan
    from distributed_testing.worker.pyenv import PythonEnvs
    from distributed_testing.worker.sandbox import Sandbox

    monkeypatch.chdir(tmp_path)
    make_bundle(Path("a"), requirements=None)
    Path("scratch").mkdir()
    envs = PythonEnvs(Path("envs"), Sandbox(network="none"))
    env = await envs.ensure(["./mypkg"], Path("a"), scan(Path("a"))[0], Path("scratch"))
    assert env.path.is_absolute() and (env.path / ".dt-complete").exists()


async def test_a_worker_with_a_relative_db_path_runs_bundle_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its bundle directory was relative: the sandbox bound the wrong scratch directory and pytest,
    started in the bundle, wrote its report where the worker did not look (the task failed)."""
    monkeypatch.chdir(tmp_path)
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", db_path=Path("state/outbox.duckdb"))
        code = await c.create_key("submitter", allow_code=True)
        bundle = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "a", requirements="./mypkg\n"))
        [t] = await c.submit({"type": "test", "config": {"test_file": "test_uses_pkg.py"}, "bundle": bundle}, key=code)
        done = await c.wait(t, timeout=180)
    assert (done["outcome"] or {}).get("status") == "succeeded", done


HANDLER = '''import sys
import mypkg

def run(parameters, ctx):
    return {"value": mypkg.VALUE, "from": mypkg.__file__, "prefix": sys.prefix}
'''
MODEL = '''import mypkg
import torch

def make():
    assert mypkg.VALUE == 42
    return torch.nn.Linear(4, 4)
'''


async def test_custom_and_benchmark_bundle_tasks_import_the_installed_package(tmp_path: Path) -> None:
    """A custom handler and a benchmark model from a bundle whose requirements.txt names ./mypkg
    run in the bundle's environment (its interpreter), as test tasks do."""
    pytest.importorskip("torch")
    root = make_bundle(tmp_path / "a", requirements="./mypkg\n")
    (root / "handler.py").write_text(HANDLER)
    (root / "tinymodel.py").write_text(MODEL)
    bench = {"model": "tinymodel:make", "input_shape": [4], "batch_sizes": [2], "iterations": 2, "warmup": 1,
             "min_duration_s": 0.0}
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        bundle = await asyncio.to_thread(upload, c.base_url, code, root)
        [custom] = await c.submit({"type": "custom", "config": {"name": "handler:run"}, "bundle": bundle}, key=code)
        done_custom = await c.wait(custom, timeout=180)
        [benchmark] = await c.submit({"type": "benchmark", "config": bench, "bundle": bundle}, key=code)
        done_bench = await c.wait(benchmark, timeout=180)
    assert (done_custom["outcome"] or {}).get("status") == "succeeded", done_custom
    out = output(done_custom)
    assert out["value"] == 42 and out["from"].startswith(out["prefix"]) and "/pyenvs/" in out["prefix"], out
    assert output(done_custom)["python_env"]["cached"] is False
    assert (done_bench["outcome"] or {}).get("status") == "succeeded", done_bench
    assert output(done_bench)["python_env"]["cached"] is True


PLUGIN_PYPROJECT = PYPROJECT.format(name="myplugin", deps="[]") + '\n[project.entry-points.pytest11]\nmyplugin = "myplugin"\n'
PLUGIN_TEST = '''import pathlib
import myplugin

def test_the_plugins_rewritten_byte_code_was_kept_at_build():
    cache = pathlib.Path(myplugin.__file__).parent / "__pycache__"
    kept = [p.name for p in cache.glob("helpers.*-pytest-*.pyc")]
    assert kept, sorted(p.name for p in cache.iterdir())

def test_its_asserts_are_rewritten():
    try:
        myplugin.helpers.check(2)
    except AssertionError as exc:
        assert "assert 2 == 1" in str(exc), str(exc)
    else:
        raise RuntimeError("no AssertionError")
'''


async def test_a_plugins_rewritten_byte_code_is_written_while_its_environment_is_built(tmp_path: Path) -> None:
    """pytest rewrites the asserts of every module of a pytest11 distribution and keeps the result
    beside the module; the environment is read-only to sessions, so it is written at the build
    (worker/plugin_pyc.py), by the environment's own pytest: a session finds it there."""
    root = tmp_path / "b"
    pkg = root / "myplugin" / "myplugin"
    pkg.mkdir(parents=True)
    (root / "myplugin" / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (pkg / "__init__.py").write_text("from . import helpers\n")
    (pkg / "helpers.py").write_text("def check(x):\n    assert x == 1\n")
    (root / "test_plugin.py").write_text(PLUGIN_TEST)
    (root / "requirements.txt").write_text("./myplugin\n")
    async with bundle_cluster(tmp_path) as (c, code):  # its worker's state (pyenvs/) under tmp_path/state
        bundle = await asyncio.to_thread(upload, c.base_url, code, root)
        [t] = await c.submit({"type": "test", "config": {"test_file": "test_plugin.py"}, "bundle": bundle}, key=code)
        done = await c.wait(t, timeout=180)
    assert (done["outcome"] or {}).get("status") == "succeeded", (done["outcome"], output(done).get("stdout_tail"))
    envs = list((tmp_path / "state").glob("pyenvs/*/.dt-complete"))
    owners = {p.lstat().st_uid for p in envs[0].parent.rglob("*")}
    assert owners == {os.geteuid()}, owners  # what the build's step wrote is the worker's, as the rest
