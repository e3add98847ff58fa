"""What a worker's registration says about it that follows from its settings. Pure: no I/O."""

from __future__ import annotations

from typing import get_args

from ...protocol import messages as m

TASK_NETWORKS: tuple[m.TaskNetwork, ...] = get_args(m.TaskNetwork)


def shipped_network(sandbox: str, task_network: str) -> m.TaskNetwork:
    """The network a task with shipped code gets on this worker (``Register.task_network``): its
    ``--task-network``, except under ``--sandbox none``, where such a task runs unconfined on the
    host's network. ValueError naming the flag for a network it does not know."""
    if sandbox == "none":
        return "host"
    for known in TASK_NETWORKS:
        if task_network == known:
            return known
    raise ValueError(f"--task-network {task_network!r}: expected one of {', '.join(TASK_NETWORKS)}")
