"""How shipped code is confined: bubblewrap (``bwrap``) around the child's command, on an allow-list root.

Why bubblewrap: it is one small setuid-free binary in Debian's packages, needs no daemon and no
image, starts in milliseconds, and builds the child's view of the filesystem from nothing: only
what is bound in exists. The root is **named, not subtracted** (the way Flatpak's runtime and
Bazel's ``linux-sandbox`` build theirs): a host directory is never bound with holes cut in it, so
what an operator keeps where we did not look (a key under ``/etc/<dir>/``, ``/etc/shadow``, the
``state/`` folder of a checkout the package is installed from in editable mode) is absent, not
merely unreadable. :data:`ROOT_TABLE` lists every path a shipped run sees; docs/security.md prints
the same table and a test holds both against a probe run inside the sandbox:

* read-only: the system's programs and libraries (``/usr`` and the merged-``/usr`` links
  ``/bin``, ``/sbin``, ``/lib*``); a few named files of ``/etc`` (:data:`ETC_FILES`: the resolver,
  CA certificates, the dynamic linker's cache, time zone) and a generated ``/etc/passwd`` and
  ``/etc/group`` naming one user; the Python installation running the worker (``sys.base_prefix``,
  ``sys.prefix``); this package's own directory (never the directory above it: in an editable
  install that is the checkout); the task's Python environment and whatever else the caller names
  (``ro``);
* writable: what the caller names (``rw``: the task's scratch directory, its own view of the tree),
  and a ``/tmp`` and a ``/dev/shm`` of its own, each a tmpfs bounded to ``shm_mb`` (the task's
  memory limit, else :data:`DEFAULT_SHM_MB`); the rest of the root, including the directories
  bwrap makes for the binds, is remounted read-only. **The task's directory is one mount at a short
  path**: the folder holding the scratch directory (the worker's ``.../bundles-W/tasks/<task>/``,
  with the tree beside it) is bound once at :data:`TASK_DIR`, and every worker path under it that
  the child is given (its command, working directory, environment: ``HOME`` and ``TMPDIR`` name
  the scratch directory and its ``tmp``) names it there (:meth:`Sandbox.seen`). So the tree,
  ``HOME`` and ``TMPDIR`` are one file system to ``rename(2)`` as a checkout and its temporary
  directory are locally (separate binds made each move between them ``EXDEV``), and a test's
  ``tmp_path`` is as short as a local run's (a socket bound there fits ``AF_UNIX``'s 108 bytes);
* in ``/dev`` only the basic nodes, plus the GPU nodes the caller passes (``devices``);
* its own PID namespace with a fresh ``/proc`` (no ``/proc/<worker pid>/environ`` to read), IPC and
  UTS namespaces, a new session (no terminal injection), ``--die-with-parent``; every mount
  ``nosuid`` and ``no_new_privs`` set (bwrap does both);
* an unprivileged user: a worker running as root starts the child as :data:`TASK_UID` (``nobody``):
  bwrap keeps only ``CAP_SETUID``/``CAP_SETGID`` for ``setpriv``, which switches to that uid and so
  drops them too; the writable paths are handed to that uid (:func:`give`). A root child without
  capabilities could still read every root-owned ``0600`` file bound in by owner permission, and
  ``chmod`` a file of its tree that is a hard link into the blob cache (one over 16 MiB) to write
  through it. A worker
  running as another user runs the child as that user (it cannot switch), without capabilities;
* a scrubbed environment: ``--clearenv``, then only what the caller passes;
* its network (``--task-network``): ``host`` shares the worker's; ``loopback`` a private network
  namespace whose loopback works (a task's own servers, single-node ranks) and reaches nothing
  outside; ``none`` no working interface at all (a nested user and network namespace whose
  loopback is down: every connect fails), the child keeping its uid there.

``Sandbox.wrap`` returns the argv to run instead of the child's; ``mode="none"`` (the operator's
explicit ``--sandbox none``) returns it unchanged. ``available()`` says whether bwrap can make such
a sandbox here (None) or why not. Tasks without a bundle get a deny-list sandbox instead
(:mod:`.confine`).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MODES = ("bwrap", "none")
NETWORKS = ("none", "loopback", "host")
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# The named files and folders of /etc a run needs, bound where they exist; nothing else of /etc is there.
ETC_FILES = (
    "/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/nsswitch.conf", "/etc/gai.conf",  # names
    "/etc/services", "/etc/protocols",  # socket.getservbyname, getprotobyname
    "/etc/ssl/certs", "/etc/pki/tls/certs", "/etc/pki/ca-trust/extracted", "/etc/ssl/openssl.cnf",  # CA certificates
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",  # the dynamic linker's search path
    "/etc/alternatives",  # Debian's links behind /usr/bin/awk, cc, ...
    "/etc/localtime", "/etc/timezone", "/etc/mime.types", "/etc/os-release",
)
GENERATED_ETC = ("/etc/passwd", "/etc/group")
TASK_UID = 65534  # nobody: what a root worker's shipped children run as
TASK_USER = "dt-task"
# Where a sandboxed child sees its task's directory (the scratch directory's parent: the tree, the
# scratch directory and its tmp, HOME and TMPDIR): one mount at a short path. The worker's own
# paths for them (``.../bundles-W/tasks/session-.../scratch/tmp``) put a pytest tmp_path at over
# 120 characters, past the 108 bytes of an AF_UNIX socket's address and wider than a terminal's
# line, where a test that binds a socket there, or reads a path out of an 80-column panel, failed
# only on the worker; and binds of their own made a rename between them fail (EXDEV).
TASK_DIR = Path("/task")
SCRATCH_NAME = "home"  # the scratch directory's name in its task's directory (worker/bundles.py): HOME
HOME_DIR = TASK_DIR / SCRATCH_NAME  # the task user's home in the generated passwd
DEFAULT_SHM_MB = 256  # the /dev/shm of a task without a memory limit
# Run as the child's first command when --task-network none: a user and network namespace of its
# own (loopback down), mapping its own uid/gid so files keep their owner, then exec the command.
# Unbuffered writes: a refused map must fail the start, not vanish in a buffered file's close.
NETLESS = (
    "import ctypes,os,sys\n"
    "u,g=os.getuid(),os.getgid()\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "if libc.unshare(0x10000000|0x40000000)!=0:\n"
    "    sys.exit('sandbox: cannot make a network namespace: '+os.strerror(ctypes.get_errno()))\n"
    "for f,t in (('setgroups','deny'),('uid_map',f'{u} {u} 1'),('gid_map',f'{g} {g} 1')):\n"
    "    fd=os.open('/proc/self/'+f,os.O_WRONLY)\n"
    "    try: os.write(fd,t.encode())\n"
    "    except OSError as e: sys.exit(f'sandbox: cannot keep uid {u} in the network namespace ({f}): {e}')\n"
    "    finally: os.close(fd)\n"
    "os.execvp(sys.argv[1],sys.argv[1:])\n"
)
# Where setpriv is missing: the same switch in the interpreter that is there anyway.
SETUID = ("import os,sys\nos.setgroups([]);os.setgid(int(sys.argv[1]));os.setuid(int(sys.argv[1]))\n"
          "os.execvp(sys.argv[2],sys.argv[2:])\n")

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the distributed_testing package itself
PACKAGE_PARENT = PACKAGE_DIR.parent  # where `import distributed_testing` finds it (PYTHONPATH of children)

# (path, access, what): every path a shipped run sees; docs/security.md prints this table and
# tests/integration/bundles/test_sandbox_root.py holds it against the docs and a probe.
ROOT_TABLE = (
    ("/usr, /bin, /sbin, /lib, /lib32, /lib64", "read-only", "the system's programs and libraries"),
    ("/etc: " + ", ".join(p.removeprefix("/etc/") for p in ETC_FILES), "read-only",
     "the resolver, CA certificates, the dynamic linker's cache, time zone (those that exist)"),
    ("/etc/passwd, /etc/group", "read-only", f"generated: root and the task's user ({TASK_USER}, uid {TASK_UID})"),
    ("the worker's Python (sys.base_prefix, sys.prefix)", "read-only", "the interpreter, the standard library, "
     "the worker's installed packages"),
    ("this package's directory (distributed_testing/)", "read-only", "the children's own code; never the "
     "directory above it (an editable install's checkout)"),
    (f"{TASK_DIR}/tree: the task's tree", "writable view", "the bundle: fresh directories and copies of the files (each dated "
     "2000-01-01), its own to change (on a root worker a file over 16 MiB is a link into the blob cache it reads "
     "but cannot change); a pytest session's also holds the byte code its key's last session of the same tree and "
     "environment compiled (bundles/bytecode.py)"),
    ("the task's Python environment", "read-only", "built from its requirements (pyenv)"),
    (f"{HOME_DIR}: the scratch directory", "read-write", f"HOME, its tmp TMPDIR (on disk); one mount with the "
     f"tree ({TASK_DIR}: a rename between them works, as locally); removed after the task"),
    ("/tmp, /dev/shm", "read-write", f"a tmpfs each, its own, bounded by the task's memory limit (else "
     f"{DEFAULT_SHM_MB} MiB) and counted in it"),
    ("/dev", "read-only", "null, zero, full, random, urandom, tty, pts; the GPU nodes of a GPU task"),
    ("/proc", "read-only", "its own PID namespace: none of the worker's processes"),
)


@functools.cache
def _code_dirs() -> list[Path]:
    """The worker's Python and this package, each by name; the package's parent only when that is
    the Python's own site directory (never an editable install's checkout)."""
    dirs = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    if not any(PACKAGE_DIR.is_relative_to(d) for d in dirs):
        dirs.add(PACKAGE_DIR)
    return sorted(dirs)


def _etc_dirs() -> list[str]:
    """:data:`ETC_FILES` and the configuration folder of a Debian system Python (``/etc/python3.11``)."""
    v = sys.version_info
    return [*ETC_FILES, f"/etc/python{v.major}.{v.minor}", f"/etc/python{v.major}"] if sys.base_prefix == "/usr" \
        else list(ETC_FILES)


@functools.cache
def generated_etc() -> Path:
    """A private folder (made once per process) holding the generated ``passwd`` and ``group``."""
    d = Path(tempfile.mkdtemp(prefix="dt-sandbox-etc-"))
    uid = TASK_UID if os.geteuid() == 0 else os.geteuid()
    gid = TASK_UID if os.geteuid() == 0 else os.getegid()
    (d / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                              f"{TASK_USER}:x:{uid}:{gid}:shipped task:{HOME_DIR}:/bin/sh\n")
    (d / "group").write_text(f"root:x:0:\n{TASK_USER}:x:{gid}:\n")
    for f in d.iterdir():
        f.chmod(0o644)
    d.chmod(0o755)
    return d


def task_uid() -> int | None:
    """The uid shipped children switch to: :data:`TASK_UID` for a root worker, else None (they keep
    the worker's, which cannot switch)."""
    return TASK_UID if os.geteuid() == 0 else None


def give(paths: Iterable[Path]) -> None:
    """Hand the writable ``paths`` to :func:`task_uid` (nothing for a worker that is not root): each
    directory under them, and each file with one link. A file with more (a tree's hard link into
    the blob cache) stays the worker's, read-only to the task: chowning it would let the task
    ``chmod`` it and write the blob that other tasks' trees are built from. Directories also get
    ``o+x``: bwrap enters the working directory as root without capabilities, before the switch.
    Nothing is done through a link: the paths may hold what the submitter's code left there (a
    ``./dir`` package's build runs in the scratch directory before the task), and a link to a host
    directory, followed, made that directory 0777."""
    uid = task_uid()
    if uid is None:
        return
    for top in paths:
        if not top.exists():
            continue
        _give_dir(top, uid)
        for dirpath, dirnames, filenames in os.walk(top):  # never into a link
            for name in dirnames:  # a link to a directory is listed here too: _give_dir passes it by
                _give_dir(os.path.join(dirpath, name), uid)
            for name in filenames:
                p = os.path.join(dirpath, name)
                if os.lstat(p).st_nlink == 1:
                    os.lchown(p, uid, uid)


def take_back(path: Path) -> None:
    """Make what :func:`give` handed to the task's user the worker's again (nothing for a worker
    that is not root): a Python environment built by a sandboxed pip and then shared read-only by
    later tasks must not stay writable by uid 65534, which other processes on the host may run as.
    Call it once nothing of the task runs any more; links are changed, not followed."""
    if task_uid() is None or not path.exists():
        return
    uid, gid = os.geteuid(), os.getegid()
    os.lchown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _give_dir(path: str | Path, uid: int) -> None:
    """Chown and ``o+x`` the directory ``path`` through a descriptor opened without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link: its target is not the task's
            return
        raise
    try:
        os.fchown(fd, uid, uid)
        os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | 0o011)
    finally:
        os.close(fd)


def gpu_devices() -> list[str]:
    """The GPU device nodes of this machine (``/dev/nvidia*``, ``/dev/dri``, ROCm's ``/dev/kfd``)
    that a sandboxed or confined child binds into its otherwise fresh ``/dev`` to reach the GPU
    its ``CUDA_VISIBLE_DEVICES`` names."""
    return sorted(str(p) for p in [*Path("/dev").glob("nvidia*"), Path("/dev/dri"), Path("/dev/kfd")] if p.exists())


# The variables that choose which GPU a child sees; a sandboxed child's scrubbed environment
# keeps the worker's (its --gpu choice, say), or it would see every GPU bound in.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def gpu_environ(env: Mapping[str, str]) -> dict[str, str]:
    """The :data:`GPU_VARIABLES` set in ``env``: what a sandboxed child carries over."""
    return {k: env[k] for k in GPU_VARIABLES if k in env}


@dataclass(frozen=True)
class Sandbox:
    mode: str = "bwrap"
    network: str = "loopback"
    bwrap: str = "bwrap"

    def wrap(self, argv: Sequence[str], *, ro: Sequence[Path], rw: Sequence[Path], cwd: Path,
             env: Mapping[str, str], devices: Sequence[str] = (), shm_mb: int | None = None,
             scratch: Path | None = None) -> list[str]:
        """The command that runs ``argv`` confined (see the module docstring); ``devices`` are
        device nodes bound into its ``/dev`` (a benchmark's GPU, :func:`gpu_devices`), ``shm_mb``
        bounds its ``/dev/shm``. Hands ``rw`` to the task's user (:func:`give`). ``scratch``: the
        task's scratch directory (one of ``rw``), whose parent the child sees at :data:`TASK_DIR`:
        each path under it in ``argv``, ``cwd``, ``env``, ``ro`` and ``rw`` names it there
        (:meth:`seen`), and the rest of ``rw`` is bound where the worker has it. A worker whose own
        Python or package lies under :data:`TASK_DIR` keeps its paths (the child then sees each
        writable path where the worker does, a bind each)."""
        if self.mode == "none":
            return list(argv)
        uid = task_uid()
        cmd = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
        if uid is not None:  # kept only for the switch below, which drops them
            cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if self.network != "host":
            cmd.append("--unshare-net")
        size = str((shm_mb or DEFAULT_SHM_MB) * 1024 * 1024)
        cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
                "--perms", "1777", "--size", size, "--tmpfs", "/tmp"]  # before the binds: one under /tmp goes in it
        for d in SYSTEM:
            cmd += ["--ro-bind-try", d, d]
        top = _task_dir(scratch)
        if top is not None and any(Path(p).is_relative_to(TASK_DIR) for p in ro):  # it would hide them
            top = None
        seen = _Seen(top)
        etc_files = [Path(f) for f in _etc_dirs() if os.path.exists(f)]
        readable = [(p, seen(p)) for p in [*_code_dirs(), *(Path(p) for p in ro)]]
        writable = [Path(p) for p in rw]
        own = [p for p in writable if seen(p) == p]  # bound where the worker has them
        dests = [*etc_files, *map(Path, GENERATED_ETC), *(d for _, d in readable), *own,
                 *([TASK_DIR] if top is not None else [])]
        for parent in _parents(dests):
            cmd += ["--perms", "0755", "--dir", str(parent)]  # bwrap would make them 0700: the task could not pass
        for path in etc_files:
            cmd += ["--ro-bind", str(path), str(path)]
        etc = generated_etc()
        for name in GENERATED_ETC:
            cmd += ["--ro-bind", str(etc / Path(name).name), name]
        give(writable)
        if top is not None:  # before the binds under it (the task's plugins, read-only)
            if uid is not None:
                top.chmod(top.stat().st_mode & 0o7777 | 0o011)  # the task's user passes through, makes nothing
            cmd += ["--bind", str(top), str(TASK_DIR)]
        for src, dest in readable:
            cmd += ["--ro-bind", str(src), str(dest)]
        for p in own:
            cmd += ["--bind", str(p), str(p)]
        for d in devices:
            cmd += ["--dev-bind-try", d, d]
        # the tmpfs bwrap builds the root on (and the directories it made for the binds above) is
        # read-only too: nothing but the writable binds and /dev/shm takes a write
        cmd += ["--remount-ro", "/", "--chdir", str(seen(Path(cwd))), "--clearenv"]
        for k, v in env.items():
            cmd += ["--setenv", k, seen.text(v)]
        cmd.append("--")
        if uid is not None:
            setpriv = shutil.which("setpriv")
            cmd += ([setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if setpriv
                    else [sys.executable, "-c", SETUID, str(uid)])
        if self.network == "none":
            cmd += [sys.executable, "-c", NETLESS]
        return cmd + [seen.text(a) for a in argv]

    def seen(self, path: Path, scratch: Path | None) -> Path:
        """Where the child that :meth:`wrap` made with ``scratch`` sees the worker's ``path``: under
        :data:`TASK_DIR` for a path in the task's directory, else ``path`` (also with no sandbox)."""
        return path if self.mode == "none" else _Seen(_task_dir(scratch))(path)


def _task_dir(scratch: Path | None) -> Path | None:
    """The task's directory (``scratch``'s parent) that the child sees at :data:`TASK_DIR`; None when
    there is none, or when the worker's own Python or package lies there (it is bound where it is)."""
    if scratch is None:
        return None
    top = Path(scratch).parent
    if top == Path(top.anchor) or any(d.is_relative_to(TASK_DIR) or TASK_DIR.is_relative_to(d)
                                      for d in (top, *_code_dirs())):
        return None
    return top


class _Seen:
    """Maps the worker's paths under ``top`` (a task's directory, by its name or its resolved name:
    callers pass both) to :data:`TASK_DIR`, for a path (:meth:`__call__`) and within a command's
    argument or a variable's value (:meth:`text`: each occurrence that is the directory's whole
    name: a ``PYTHONPATH``, an ``--option=PATH``)."""

    def __init__(self, top: Path | None) -> None:
        self.tops = [] if top is None else sorted({top, top.resolve()}, key=lambda t: -len(str(t)))

    def __call__(self, path: Path) -> Path:
        for top in self.tops:
            if path.is_relative_to(top):
                return TASK_DIR / path.relative_to(top)
        return path

    def text(self, value: str) -> str:
        for top in self.tops:
            value = re.sub(r"(?<![^:;=,\s\"'])" + re.escape(str(top)) + r"(?![^/:;=,\s\"'])", str(TASK_DIR), value)
        return value


def _parents(binds: Sequence[Path]) -> list[Path]:
    """The directories above ``binds`` that the sandbox must make (shallowest first): not ``/``,
    ``/tmp`` (a tmpfs of its own) or a system directory, nor one inside another bind."""
    taken = [Path(d) for d in SYSTEM] + list(binds)
    out: set[Path] = set()
    for b in binds:
        for d in b.parents:
            if d in (Path("/"), Path("/tmp")) or any(d == t or d.is_relative_to(t) for t in taken):
                continue
            out.add(d)
    return sorted(out, key=lambda d: (len(d.parts), str(d)))


def available(bwrap: str = "bwrap") -> str | None:
    """None when bwrap can make this module's sandbox here (run once: the same command a task
    gets, around ``true``); otherwise why not (for the refusal at start)."""
    path = shutil.which(bwrap)
    if path is None:
        return f"{bwrap} is not installed (Debian: apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="dt-sandbox-probe-") as scratch:
        argv = Sandbox(bwrap=path).wrap(["true"], ro=[], rw=[Path(scratch)], cwd=Path(scratch),
                                        env={"PATH": "/usr/bin:/bin"})
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{bwrap} cannot run: {exc}"
    if done.returncode != 0:
        return f"{bwrap} cannot make a sandbox here: {done.stderr.strip() or f'exit code {done.returncode}'}"
    return None


def task_environ(extra: Mapping[str, str], scratch: Path, python: Path | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed child: a fixed minimum, then the operator's extras
    (``extra``: the worker's pytest environment settings), never the worker's own variables.
    ``python``: the interpreter of the task's own Python environment (``worker/pyenv.py``), which
    is then activated as the submitter's was where pytest ran (a shell's ``activate``, tox, ``uv
    run``): its scripts directory first on ``PATH``, ``VIRTUAL_ENV`` naming it. A test that runs
    a console script of a distribution it ships with (python-dotenv's CLI tests run ``dotenv``)
    finds that one, not none or the system's."""
    (scratch / "tmp").mkdir(exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(scratch),
           "TMPDIR": str(scratch / "tmp"), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
           "USER": TASK_USER, "LOGNAME": TASK_USER}
    env.update(extra)
    if python is not None:  # not resolved: the link's place is the environment's (pyenv.PythonEnv.python)
        env["PATH"] = os.pathsep.join([str(python.parent), *filter(None, [env.get("PATH")])])
        env["VIRTUAL_ENV"] = str(python.parent.parent)
    return env
