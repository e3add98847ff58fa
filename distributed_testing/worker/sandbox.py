"""How a task child is confined: bubblewrap (``bwrap``) around the child's command.

Why bubblewrap: it is one small setuid-free binary in Debian's packages, needs no daemon and no
image, starts in milliseconds, and builds the child's view of the filesystem from nothing: only
what is bound in exists. So the worker's key and token files, its state directory, outbox, TLS
files and every other task's directory are not hidden by permissions (a worker running as root
would pass those checks) but absent. The child gets:

* read-only: the system directories (``/usr``, ``/bin``, ``/lib*``, ``/etc``), the Python
  installation running the worker (``sys.prefix``, ``sys.base_prefix``) and the directory holding
  this package, and the task's bundle tree (``ro``);
* writable: its own scratch directory only (``rw``; ``TMPDIR`` and ``HOME`` point into it); the
  rest of its root, including the directories bwrap makes for the binds, is remounted read-only;
* in ``/dev`` only the basic nodes, plus the GPU nodes a benchmark child is given (``devices``);
* its own PID namespace with a fresh ``/proc`` (no ``/proc/<worker pid>/environ`` to read), IPC and
  UTS namespaces, a new session (no terminal injection), ``--die-with-parent``;
* no capabilities (``--cap-drop ALL``): bwrap started by root keeps them all by default, and a
  child holding ``CAP_SYS_ADMIN`` and ``CAP_MKNOD`` could make a disk's device node and mount it;
* a scrubbed environment: ``--clearenv``, then only what the caller passes;
* its network (``--task-network``): ``host`` shares the worker's; ``loopback`` a private network
  namespace whose loopback works (a task's own servers, single-node ranks) and reaches nothing
  outside; ``none`` no working interface at all (a nested user and network namespace whose
  loopback is down: every connect fails).

``Sandbox.wrap`` returns the argv to run instead of the child's; ``mode="none"`` (the operator's
explicit ``--sandbox none``) returns it unchanged. ``available()`` says whether bwrap can make a
sandbox here (None) or why not. Tasks without a bundle get a deny-list sandbox instead
(:mod:`.confine`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MODES = ("bwrap", "none")
NETWORKS = ("none", "loopback", "host")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
# Run as the child's first command when --task-network none: a user and network namespace of its
# own (loopback down), mapping its own uid/gid so files keep their owner, then exec the command.
NETLESS = (
    "import ctypes,os,sys\n"
    "u,g=os.getuid(),os.getgid()\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "if libc.unshare(0x10000000|0x40000000)!=0:\n"
    "    sys.exit('sandbox: cannot make a network namespace: '+os.strerror(ctypes.get_errno()))\n"
    "open('/proc/self/setgroups','w').write('deny')\n"
    "open('/proc/self/uid_map','w').write(f'{u} {u} 1')\n"
    "open('/proc/self/gid_map','w').write(f'{g} {g} 1')\n"
    "os.execvp(sys.argv[1],sys.argv[1:])\n"
)


PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding the distributed_testing package


def _code_dirs() -> list[Path]:
    return sorted({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), PACKAGE_PARENT})


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
             env: Mapping[str, str], devices: Sequence[str] = ()) -> list[str]:
        """The command that runs ``argv`` confined (see the module docstring); ``devices`` are
        device nodes bound into its ``/dev`` (a benchmark's GPU, :func:`gpu_devices`)."""
        if self.mode == "none":
            return list(argv)
        cmd = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev"]
        if self.network != "host":
            cmd.append("--unshare-net")
        for d in _SYSTEM:
            cmd += ["--ro-bind-try", d, d]
        for p in [*_code_dirs(), *ro]:
            cmd += ["--ro-bind", str(p), str(p)]
        for p in rw:
            cmd += ["--bind", str(p), str(p)]
        for d in devices:
            cmd += ["--dev-bind-try", d, d]
        # the tmpfs bwrap builds the root on (and the directories it made for the binds above) is
        # read-only too: nothing but the scratch directory and /tmp takes a write
        cmd += ["--remount-ro", "/", "--chdir", str(cwd), "--clearenv"]
        for k, v in env.items():
            cmd += ["--setenv", k, v]
        cmd.append("--")
        if self.network == "none":
            cmd += [sys.executable, "-c", NETLESS]
        return cmd + list(argv)


def available(bwrap: str = "bwrap") -> str | None:
    """None when bwrap can make a sandbox here; otherwise why not (for the refusal at start)."""
    path = shutil.which(bwrap)
    if path is None:
        return f"{bwrap} is not installed (Debian: apt-get install bubblewrap)"
    probe = [path, "--unshare-pid", "--unshare-net", "--proc", "/proc", "--dev", "/dev"]
    for d in _SYSTEM:
        probe += ["--ro-bind-try", d, d]
    try:
        done = subprocess.run([*probe, "--", "true"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} cannot run: {exc}"
    if done.returncode != 0:
        return f"{bwrap} cannot make a sandbox here: {done.stderr.strip() or f'exit code {done.returncode}'}"
    return None


def task_environ(extra: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """The whole environment of a sandboxed child: a fixed minimum, then the operator's extras
    (``extra``: the worker's pytest environment settings), never the worker's own variables."""
    (scratch / "tmp").mkdir(exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(scratch),
           "TMPDIR": str(scratch / "tmp"), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
    env.update(extra)
    return env
