"""Tie a process's life to its parent's (Linux ``PR_SET_PDEATHSIG``) so nothing is orphaned.

torch's elastic agent starts every rank in its own session, so killing the agent's process group
does not reach them. The launcher therefore starts the agent through this module's exec shim
(``python -m distributed_testing.training.deathsig SIGNAL -- command ...``): the agent receives
``SIGTERM`` (and stops its ranks) if the launcher dies, and each rank asks for ``SIGKILL`` if the
agent dies. The death signal survives ``execv`` and fires when the parent *thread* that forked
exits; the launcher forks from the thread that also waits for the child, so that is the same.
On other systems this is a no-op and the launcher's own process-tree kill is the only guard.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: signal.Signals, expected_parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits.

    Returns False where unsupported (not Linux). If ``expected_parent`` is given and the parent
    already changed (it died before the call), raises ``ProcessLookupError``.
    """
    if not sys.platform.startswith("linux"):
        logger.debug("parent death signal unsupported on %s", sys.platform)
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if expected_parent is not None and os.getppid() != expected_parent:
        raise ProcessLookupError(f"parent {expected_parent} exited before the death signal was set")
    return True


def main(argv: list[str]) -> None:
    """``SIGNAL -- command args...``: set the death signal, then exec the command."""
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m distributed_testing.training.deathsig SIGNAL -- command ...")
    parent = os.getppid()
    set_parent_death_signal(signal.Signals[argv[0]], expected_parent=parent)
    os.execv(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
