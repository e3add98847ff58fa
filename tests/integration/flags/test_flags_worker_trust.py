"""What a submitter can make a worker run: the attacks of issue 16 performed over real sockets
against a real coordinator and real workers, and the flags that let an operator allow more
(``--allow-model-modules``, ``--allow-test-options``, ``--api-key-file`` and their variables).

Every attack asserts its effect is absent (the marker file never appears, the victim file keeps
its content, the key is nowhere in the child's environment or command line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flags_support import ROOT, Procs, StartWorker, worker_config

from distributed_testing.errors import ConfigError, ExecutionError
from distributed_testing.testing import Cluster, hidden_accelerators, run_cluster, wait_for
from distributed_testing.worker.executors.base import TaskContext

pytestmark = pytest.mark.timeout(120)

FAST_BENCH = {"warmup": 1, "iterations": 2, "min_duration_s": 0, "batch_sizes": [1]}


async def cli(c: Cluster, *argv: str) -> list[str]:
    return ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"), *argv]


def os_system_task(marker: Path) -> dict[str, Any]:
    return {"type": "benchmark", "config": {"model": "os:system", "model_config": {"command": f"touch {marker}"},
                                            "input_shape": [1], **FAST_BENCH}}


# ----------------------------------------------------------------------- --allow-model-modules


@pytest.mark.asyncio
async def test_os_system_model_is_refused_at_submit_and_never_runs(tmp_path: Path,
                                                                  start_cli_worker: StartWorker) -> None:
    marker = tmp_path / "pwned"
    async with run_cluster(tmp_path, workers=0) as c:
        submitter = await c.create_key("submitter")
        await start_cli_worker(c, await cli(c, "--worker-id", "plain"))
        status, body = await c.request("POST", "/api/v1/tasks", json=os_system_task(marker), key=submitter)
        assert status == 400, body
        text = json.dumps(body)
        assert "os:system" in text and "no connected worker allows module 'os'" in text
        assert "--allow-model-modules" in text
        status, body = await c.request("GET", "/api/v1/tasks")
        assert body["tasks"] == []
    assert not marker.exists()


@pytest.mark.asyncio
async def test_the_worker_and_its_benchmark_child_refuse_a_model_module_it_does_not_allow(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    """Defence in depth: a coordinator that sent such a task anyway (an older one, or one an
    attacker runs) still gets an error, and the benchmark child refuses it by itself."""
    marker = tmp_path / "pwned"
    task = os_system_task(marker)
    async with run_cluster(tmp_path, workers=0) as c:
        agent = await start_cli_worker(c, await cli(c, "--worker-id", "plain", "--allow-model-modules", "mypkg"))
        ctx = TaskContext(task_id="t", attempt=1, type="benchmark", config=task["config"],
                          allow_model_modules=agent.config.allow_model_modules)
        with pytest.raises(ExecutionError, match="does not allow importing module 'os'"):
            await agent.executors["benchmark"].run(ctx)
    request = json.dumps({"id": 1, "configs": [task["config"]]}) + "\n"
    child = subprocess.run([sys.executable, "-m", "distributed_testing.bench.child", "--allow-model-modules", "mypkg"],
                           input=request, capture_output=True, text=True, timeout=90, cwd=tmp_path)
    (entry,) = json.loads(child.stdout.splitlines()[0])["results"]
    assert "does not allow importing module 'os'" in entry["error"]["message"]
    assert not marker.exists()


ZOO = """
import torch


class Tiny(torch.nn.Module):
    input_shape = (4,)

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x)


def make(dump=None):
    if dump:  # what the benchmark child's environment holds
        import json
        import os
        with open(dump, "w") as f:
            json.dump(dict(os.environ), f)
    return Tiny()
"""


@pytest.mark.asyncio
async def test_allow_model_modules_runs_a_user_model_from_an_allowed_module_only(
        tmp_path: Path, start_cli_worker: StartWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "modules" / "dt_trust_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "zoo.py").write_text(ZOO)
    (tmp_path / "modules" / "dt_trust_modelsx.py").write_text(ZOO)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "modules"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DT_API_KEY", "dtk_not_for_children")
    dump = tmp_path / "bench-env.json"
    async with run_cluster(tmp_path, workers=0) as c:
        # --sandbox none: the model dumps its environment beside the test, a write the deny-list
        # confinement refuses (tests/integration/bundles/test_confinement.py covers that)
        await start_cli_worker(c, await cli(c, "--worker-id", "zoo", "--allow-model-modules", "dt_trust_models",
                                            "--sandbox", "none"))
        (tid,) = await c.submit({"type": "benchmark", "config": {
            "model": "dt_trust_models.zoo:make", "model_config": {"dump": str(dump)}, **FAST_BENCH}})
        task = await c.wait(tid, 90)
        assert task["state"] == "succeeded", task["outcome"]
        assert task["worker_id"] == "zoo"
        assert "DT_API_KEY" not in json.loads(dump.read_text())  # nor in the benchmark child
        # a prefix matches on dotted boundaries only
        status, body = await c.request("POST", "/api/v1/tasks",
                                       json={"type": "benchmark", "config": {"model": "dt_trust_modelsx:make"}})
        assert status == 400 and "no connected worker allows module 'dt_trust_modelsx'" in json.dumps(body)


def test_allow_model_modules_variable_and_flag_precedence() -> None:
    assert worker_config([], {"DT_ALLOW_MODEL_MODULES": "a.b,c"}).allow_model_modules == ("a.b", "c")
    flagged = worker_config(["--allow-model-modules", "x"], {"DT_ALLOW_MODEL_MODULES": "a.b"})
    assert flagged.allow_model_modules == ("x",)
    assert worker_config([], {}).allow_model_modules == ()
    with pytest.raises(ConfigError, match="DT_ALLOW_MODEL_MODULES: 'a-b' is not a dotted module name"):
        worker_config([], {"DT_ALLOW_MODEL_MODULES": "a-b"})


# ------------------------------------------------------------------ test_args, --allow-test-options

EVIL_TEST = """
from pathlib import Path


def test_evil():
    Path({marker!r}).write_text("ran")
"""

CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--batch-size", default="1")
"""

OK_TEST = """
def test_batch_size(request):
    assert request.config.getoption("--batch-size") == "4"
"""


def make_tree(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(root, outside dir, marker the evil test writes, victim file)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    marker, victim = tmp_path / "evil-ran", tmp_path / "victim.txt"
    (outside / "test_evil.py").write_text(EVIL_TEST.format(marker=str(marker)))
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_ok.py").write_text(OK_TEST)
    (root / "link").symlink_to(outside, target_is_directory=True)
    victim.write_text("precious")
    return root, outside, marker, victim


def task_with_args(*args: str) -> dict[str, Any]:
    return {"type": "test", "config": {"test_file": "test_ok.py", "test_args": list(args)}}


@pytest.mark.asyncio
async def test_test_args_cannot_escape_the_test_root_or_write_files(tmp_path: Path,
                                                                   start_cli_worker: StartWorker) -> None:
    root, outside, marker, victim = make_tree(tmp_path)
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "tests", "--test-root", str(root)))
        # refused at submit: no worker would run them
        for args in (["../outside/test_evil.py"], [f"@{victim}"]):
            status, body = await c.request("POST", "/api/v1/tasks", json=task_with_args("--batch-size", "4", *args))
            assert status == 400 and "config.test_args" in json.dumps(body), (args, body)
        # refused by the worker, which knows its root and what it allows
        attacks = {
            "absolute": ([str(outside / "test_evil.py")], "outside the test root"),
            "symlink": (["link/test_evil.py"], "outside the test root"),
            "node id": ([f"{outside / 'test_evil.py'}::test_evil"], "outside the test root"),
            "after a conftest flag": (["--batch-size", str(outside / "test_evil.py")], "outside the test root"),
            "debug file": ([f"--debug={victim}"], "--allow-test-options --debug"),
            "rootdir": ([f"--rootdir={outside}", "link"], "outside the test root"),
            "plugin": (["-p", "test_evil"], "--allow-test-options -p"),
            "ini override": (["-o", f"cache_dir={outside}"], "--allow-test-options -o"),
        }
        ids = {name: (await c.submit(task_with_args(*args)))[0] for name, (args, _) in attacks.items()}
        for name, tid in ids.items():
            task = await c.wait(tid, 60)
            assert task["state"] in ("failed", "error"), (name, task)
            assert attacks[name][1] in (task["outcome"]["error"] or ""), (name, task["outcome"])
        # a conftest option with its value still works
        (ok,) = await c.submit(task_with_args("--batch-size", "4", "-q", "-k", "batch"))
        task = await c.wait(ok, 60)
        assert task["state"] == "succeeded", task["outcome"]
    assert not marker.exists()
    assert victim.read_text() == "precious"


@pytest.mark.asyncio
async def test_allow_test_options_lets_the_operator_permit_a_guarded_option(tmp_path: Path,
                                                                          start_cli_worker: StartWorker) -> None:
    root, _, _, _ = make_tree(tmp_path)
    debug_log = root / "pytestdebug.log"
    async with run_cluster(tmp_path, workers=0) as c:
        # --sandbox none: in the deny-list confinement the test root is read-only and an allowed
        # option that writes a file can write only under the task's TMPDIR
        await start_cli_worker(c, await cli(c, "--worker-id", "dbg", "--test-root", str(root),
                                            "--allow-test-options=debug", "--sandbox", "none"))
        (tid,) = await c.submit(task_with_args("--batch-size", "4", f"--debug={debug_log.name}"))
        task = await c.wait(tid, 60)
        assert task["state"] == "succeeded", task["outcome"]
        (other,) = await c.submit(task_with_args("-p", "no:warnings"))
        refused = await c.wait(other, 60)
        assert "--allow-test-options -p" in (refused["outcome"]["error"] or "")
    assert debug_log.exists() and debug_log.stat().st_size > 0


def test_allow_test_options_variable_and_flag_precedence() -> None:
    assert worker_config([], {"DT_ALLOW_TEST_OPTIONS": "junitxml,-p"}).allow_test_options == ("--junitxml", "-p")
    assert worker_config(["--allow-test-options=--debug"], {"DT_ALLOW_TEST_OPTIONS": "-p"}).allow_test_options == (
        "--debug",)
    with pytest.raises(ConfigError, match="--allow-test-options: '-k' is not a guarded pytest option"):
        worker_config(["--allow-test-options=-k"], {})


# ---------------------------------------------------------------- credentials, --api-key-file

DUMP_TEST = """
import json
import os
from pathlib import Path


def test_dump():
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().decode(errors="replace")
    Path({out!r}).write_text(json.dumps({{"env": dict(os.environ), "argv": argv}}))
"""


@pytest.mark.asyncio
async def test_task_children_never_see_the_worker_key(tmp_path: Path, procs: Procs) -> None:
    root = tmp_path / "root"
    root.mkdir()
    dump = tmp_path / "dump.json"
    (root / "test_dump.py").write_text(DUMP_TEST.format(out=str(dump)))
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("worker")
        key_file = tmp_path / "worker.key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        worker = procs.start(
            [str(ROOT / "run_worker_example.py"), "--coordinator", c.base_url, "--api-key-file", str(key_file),
             "--worker-id", "proc", "--test-root", str(root), "--reconnect-interval", "0.1",
             "--sandbox", "none"],  # the test dumps what it sees beside the root: confined, it could not
            tmp_path / "worker.log",
            # the key also sits in variables the operator set: by name and under another name
            env={"DT_API_KEY": key, "KEY_COPY_FOR_SCRIPTS": key, "DT_WORKER_NAME": "proc", **hidden_accelerators(tmp_path)})
        await wait_for(lambda: "proc" in c.runtime.sessions or worker.poll() is not None, timeout=90,
                       what="the worker process to register")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        with open(f"/proc/{worker.pid}/cmdline", "rb") as f:
            assert key.encode() not in f.read()  # --api-key-file keeps it out of ps
        (tid,) = await c.submit({"type": "test", "config": {"test_file": "test_dump.py"}})
        task = await c.wait(tid, 60)
        assert task["state"] == "succeeded", task["outcome"]
    seen = json.loads(dump.read_text())
    assert key not in json.dumps(seen)
    assert "DT_API_KEY" not in seen["env"] and "KEY_COPY_FOR_SCRIPTS" not in seen["env"]
    assert seen["env"].get("DT_WORKER_NAME") == "proc"  # other variables are kept


def test_api_key_file_and_its_variable(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text("  dtk_abc_def \n")
    assert worker_config(["--api-key-file", str(key_file)], {}).api_key == "dtk_abc_def"
    assert worker_config([], {"DT_API_KEY_FILE": str(key_file)}).api_key == "dtk_abc_def"
    assert worker_config([], {"DT_API_KEY_FILE": str(key_file), "DT_API_KEY": "dtk_env_x"}).api_key == "dtk_env_x"
    assert worker_config(["--api-key-file", str(key_file)], {"DT_API_KEY": "dtk_env_x"}).api_key == "dtk_abc_def"
    with pytest.raises(ConfigError, match="--api-key and --api-key-file: give one"):
        worker_config(["--api-key", "k", "--api-key-file", str(key_file)], {})
    with pytest.raises(ConfigError, match="DT_API_KEY_FILE: .*missing"):
        worker_config([], {"DT_API_KEY_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="--api-key-file: .* is empty"):
        worker_config(["--api-key-file", str(tmp_path / "empty")], {})
