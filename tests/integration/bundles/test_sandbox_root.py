"""What a shipped run sees is what docs/security.md says it sees, and nothing else of the host.

A probe runs in the bundle sandbox (real bwrap) and lists its root and its ``/etc``: every entry is
one that ``ROOT_TABLE`` (printed in docs/security.md, held equal here) accounts for. A key kept in a
directory under ``/etc`` and ``/etc/shadow`` are absent; an editable install's checkout shows only
the package; a root worker's child runs as uid 65534, also with ``--task-network none``, and cannot
read a root-owned ``0600`` file bound in; ``/tmp`` and ``/dev/shm`` are bounded by the task's memory
limit. Over a real worker, a shipped test writes beside itself and into ``.hypothesis/``, rewrites,
``chmod``s and ``touch``es a shipped file, and the next task of the same bundle finds the tree as
shipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster
from distributed_testing.worker import sandbox as sb

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(sb.available() is not None, reason=f"no sandbox here: {sb.available()}")]
ROOT = os.geteuid() == 0
DOCS = Path(__file__).resolve().parents[3] / "docs" / "security.md"

LIST = """
import json, os, sys
out = {"uid": os.getuid(), "root": sorted(os.listdir("/")), "etc": sorted(os.listdir("/etc")), "reads": {}}
for p in sys.argv[1:]:
    try:
        open(p, "rb").read()
        out["reads"][p] = "read"
    except OSError as exc:
        out["reads"][p] = type(exc).__name__
parent = os.path.dirname(os.path.dirname(os.path.abspath(__import__("distributed_testing").__file__)))
out["package_parent"] = sorted(os.listdir(parent))
print(json.dumps(out))
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dt-root-probe-") as d:
        path = Path(d) / "scratch"
        path.mkdir()
        yield path


def probe(scratch: Path, *reads: str, network: str = "loopback", ro: list[Path] | None = None) -> dict:
    env = sb.task_environ({}, scratch)
    argv = sb.Sandbox(network=network).wrap([sys.executable, "-c", LIST, *reads], ro=ro or [], rw=[scratch],
                                            cwd=scratch, env=env, scratch=scratch)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out: dict = json.loads(done.stdout)
    return out


def test_the_docs_print_the_root_table_of_the_code() -> None:
    text = DOCS.read_text()
    block = re.search(r"<!-- root-table.*?-->\n(.*?)<!-- /root-table -->", text, re.S)
    assert block is not None, "docs/security.md lost its root table"
    rows = [tuple(c.strip() for c in line.strip().strip("|").split("|"))
            for line in block.group(1).splitlines()[2:] if line.strip()]
    assert rows == [tuple(r) for r in sb.ROOT_TABLE]


def test_the_root_holds_what_the_table_names_and_nothing_else(scratch: Path) -> None:
    out = probe(scratch)
    binds = [*sb._code_dirs(), sb.TASK_DIR]
    allowed_top = {Path(d).name for d in sb.SYSTEM} | {"etc", "dev", "proc", "tmp"} | {b.parts[1] for b in binds}
    assert set(out["root"]) <= allowed_top, set(out["root"]) - allowed_top
    etc = {Path(f).relative_to("/etc").parts[0] for f in sb._etc_dirs() if os.path.exists(f)}
    assert set(out["etc"]) == etc | {"passwd", "group"}
    assert "shadow" not in out["etc"]


def test_a_key_in_a_folder_under_etc_and_the_checkout_of_an_editable_install_are_absent(scratch: Path) -> None:
    if not os.access("/etc", os.W_OK):
        pytest.skip("needs to plant a file under /etc")
    with tempfile.TemporaryDirectory(prefix="dt-probe-", dir="/etc") as d:
        key = Path(d) / "worker.key"
        key.write_text("a worker key")
        key.chmod(0o600)
        checkout = [str(p) for p in sb.PACKAGE_PARENT.iterdir() if p.is_file()][:5]
        out = probe(scratch, str(key), "/etc/shadow", *checkout)
    assert out["reads"][str(key)] == "FileNotFoundError"
    assert out["reads"]["/etc/shadow"] == "FileNotFoundError"
    if not any(sb.PACKAGE_DIR.is_relative_to(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)):
        # an editable install: the directory above the package is the checkout, and only the package is there
        assert all(out["reads"][p] == "FileNotFoundError" for p in checkout), out["reads"]
        inside = {Path(p).resolve().relative_to(sb.PACKAGE_PARENT).parts[0] for p in (sys.prefix, sys.base_prefix)
                  if Path(p).resolve().is_relative_to(sb.PACKAGE_PARENT)}
        assert set(out["package_parent"]) == {"distributed_testing"} | inside


@pytest.mark.skipif(not ROOT, reason="a worker not running as root cannot switch its children's user")
@pytest.mark.parametrize("network", ["loopback", "none"])
def test_a_root_workers_child_runs_as_an_unprivileged_user(scratch: Path, network: str, tmp_path: Path) -> None:
    secret_dir = tmp_path / "ro"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("root's")
    (secret_dir / "secret").chmod(0o600)
    out = probe(scratch, str(secret_dir / "secret"), network=network, ro=[secret_dir])
    assert out["uid"] == sb.TASK_UID
    assert out["reads"][str(secret_dir / "secret")] == "PermissionError"


SHM = """
import os
for where in ("/dev/shm/fill", "/tmp/fill"):
    try:
        with open(where, "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1 << 20))
                f.flush()
        print(where, "unbounded")
    except OSError as exc:
        print(where, exc.errno)
"""


def test_tmp_and_dev_shm_are_bounded_by_the_memory_limit(scratch: Path) -> None:
    argv = sb.Sandbox().wrap([sys.executable, "-c", SHM], ro=[], rw=[scratch], cwd=scratch,
                             env=sb.task_environ({}, scratch), shm_mb=8)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["/dev/shm/fill", "28", "/tmp/fill", "28"], done  # 28: ENOSPC


def test_what_a_child_keeps_in_its_own_dev_shm_counts_as_its_memory(scratch: Path) -> None:
    """A file in a sandbox's /dev/shm is memory no RSS shows: the memory watch counts it."""
    from distributed_testing.worker.executors.proc import process_tree_rss

    code = "import time\nopen('/dev/shm/x', 'wb').write(b'x' * (48 << 20))\nprint('written', flush=True)\ntime.sleep(60)"
    argv = sb.Sandbox().wrap([sys.executable, "-c", code], ro=[], rw=[scratch], cwd=scratch,
                             env=sb.task_environ({}, scratch), shm_mb=64)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
        assert process_tree_rss(proc.pid) >= 48 << 20
    finally:
        proc.kill()
        proc.wait()


WRITER = """import os, pathlib

def test_writes_beside_itself():
    here = pathlib.Path(__file__).parent
    assert not (here / "report.html").exists() and not (here / ".hypothesis").exists(), "an earlier task's files"
    assert (here / "data.txt").read_text() == "shipped", "an earlier task's change"
    (here / "report.html").write_text("<html/>")
    (here / ".hypothesis" / "examples").mkdir(parents=True)
    (here / ".hypothesis" / "examples" / "db").write_text("x")
    os.replace(here / "report.html", here / "renamed.html")
    (here / "data.txt").write_text("changed in place")  # a suite rewriting its own fixture (tomlkit)
    os.utime(here / "data.txt", (1, 1))  # touching a template to test a cache by mtime (jinja2)
    os.chmod(here / "data.txt", 0o600)
    assert (here / "data.txt").read_text() == "changed in place" and os.stat(here / "data.txt").st_mtime == 1
"""


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_shipped_test_writes_its_tree_and_the_next_task_finds_it_as_shipped(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "test_writer.py").write_text(WRITER)
    (bundle / "data.txt").write_text("shipped")
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        digest = await asyncio.to_thread(upload, c.base_url, code, bundle)
        done = []
        for _ in range(2):  # one after the other, on the same kept tree
            [tid] = await c.submit({"type": "test", "config": {"test_file": "test_writer.py"}, "bundle": digest},
                                   key=code)
            done.append(await c.wait(tid, timeout=90))
    for d in done:
        assert (d["outcome"] or {}).get("status") == "succeeded", (d.get("result") or {}).get("output")
    kept = [p for p in (tmp_path / "state").glob("bundles-*/trees/*/data.txt")]
    assert [p.read_text() for p in kept] == ["shipped"]
    assert not list((tmp_path / "state").glob("bundles-*/trees/*/renamed.html"))


SHORT = """
import json, os, pwd, socket, tempfile
d = tempfile.mkdtemp(prefix="pytest-of-dt-task-" + "x" * 40)  # where a test's tmp_path would be, and deeper
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(d, "server.sock"))  # 108 bytes at most: a long scratch path refused it
open(os.path.join(os.environ["TMPDIR"], "left.txt"), "w").write("in tmp")
open(os.path.join(os.path.expanduser("~"), "home.txt"), "w").write("in home")
print(json.dumps({"home": os.environ["HOME"], "tmpdir": os.environ["TMPDIR"], "gettempdir": tempfile.gettempdir(),
                  "pw_dir": pwd.getpwuid(os.getuid()).pw_dir, "cwd": os.getcwd()}))
"""


def _task(tmp_path: Path) -> tuple[Path, Path]:
    """A task's directory as a worker lays it out, deep in its state folder: the tree and the scratch directory."""
    top = tmp_path / ("state-" + "d" * 60) / "bundles-w1" / "tasks" / "session-0123456789abcdef"
    (top / "tree").mkdir(parents=True)
    (top / sb.SCRATCH_NAME).mkdir()
    return top / "tree", top / sb.SCRATCH_NAME


def test_a_child_sees_its_task_directory_at_a_short_path_and_writes_land_in_it(tmp_path: Path) -> None:
    """A worker's task directory lies deep in its state folder; the child sees it at /task (HOME
    /task/home, TMPDIR /task/home/tmp: a local run's lengths), so a socket bound in a tmp_path fits
    AF_UNIX's 108 bytes and a path in a test's output does not wrap where it does not locally."""
    tree, scratch = _task(tmp_path)
    env = sb.task_environ({}, scratch)
    assert env["TMPDIR"] == str(scratch / "tmp")  # the worker's own path for it, which the sandbox shows short
    argv = sb.Sandbox().wrap([sys.executable, "-c", SHORT], ro=[], rw=[tree, scratch], cwd=tree, env=env,
                             scratch=scratch)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"home": "/task/home", "tmpdir": "/task/home/tmp", "gettempdir": "/task/home/tmp",
                    "pw_dir": "/task/home", "cwd": "/task/tree"}
    assert sb.Sandbox().seen(tree, scratch) == Path("/task/tree") and sb.Sandbox("none").seen(tree, scratch) == tree
    assert (scratch / "tmp" / "left.txt").read_text() == "in tmp"  # on disk, in the scratch directory
    assert (scratch / "home.txt").read_text() == "in home"


MOVES = """
import os, pathlib, tempfile
home, tmp = pathlib.Path.home(), pathlib.Path(tempfile.gettempdir())
os.rename("data.txt", tmp / "data.txt")  # the tree into TMPDIR, as a test moves a file into its tmp_path
os.replace(tmp / "data.txt", home / "data.txt")  # TMPDIR into HOME
(home / "data.txt").rename("back.txt")  # HOME into the tree
"""


def test_a_rename_between_the_tree_home_and_tmpdir_works_as_on_one_local_file_system(tmp_path: Path) -> None:
    """environs' test_read_env_return_path_if_env_not_found renames a file of its tree into its tmp_path:
    locally one file system; in the sandbox the tree and TMPDIR were two binds, and rename(2) between two
    mounts fails with EXDEV ("Invalid cross-device link"). Now they are one mount."""
    tree, scratch = _task(tmp_path)
    (tree / "data.txt").write_text("moved")
    argv = sb.Sandbox().wrap([sys.executable, "-c", MOVES], ro=[], rw=[tree, scratch], cwd=tree,
                             env=sb.task_environ({}, scratch), scratch=scratch)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (tree / "back.txt").read_text() == "moved" and not (tree / "data.txt").exists()


def test_a_worker_whose_own_paths_lie_where_the_task_directory_would_keeps_its_own(scratch: Path) -> None:
    """A bind under /task (a worker's environments there, say) would be hidden by the task's directory:
    then the child sees each writable path where the worker does, as before."""
    env = sb.task_environ({}, scratch)
    argv = sb.Sandbox().wrap(["true"], ro=[sb.TASK_DIR / "dt-state"], rw=[scratch], cwd=scratch, env=env,
                             scratch=scratch)
    triples = [argv[i:i + 3] for i in range(len(argv))]
    assert ["--bind", str(scratch), str(scratch)] in triples, argv
    assert ["--bind", str(scratch.parent), str(sb.TASK_DIR)] not in triples, argv
    assert argv[argv.index("HOME") + 1] == str(scratch) and argv[argv.index("TMPDIR") + 1] == str(scratch / "tmp")


def test_a_task_directory_reached_through_a_link_is_one_mount_by_either_name(tmp_path: Path) -> None:
    """A worker's state folder behind a link (``/home`` a link to ``/data/home``, say): the scratch directory
    comes by the link's name and the tree resolved, and both are still the one mount at /task."""
    tree, scratch = _task(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    scratch = tmp_path / "link" / scratch.relative_to(tmp_path / "real")
    (tree / "data.txt").write_text("moved")
    argv = sb.Sandbox().wrap([sys.executable, "-c", MOVES], ro=[], rw=[tree.resolve(), scratch], cwd=tree.resolve(),
                             env=sb.task_environ({}, scratch), scratch=scratch)
    assert ["--bind", str(tree.resolve()), str(tree.resolve())] not in [argv[i:i + 3] for i in range(len(argv))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (tree / "back.txt").read_text() == "moved"
    assert sb.Sandbox().seen(tree.resolve(), scratch) == Path("/task/tree")
