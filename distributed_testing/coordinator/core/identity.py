"""Who may speak for what: a worker id belongs to one key, and a worker reports only on attempts
it was given. Pure: no I/O, no clock.

- A ``worker_id`` is bound to the key that first registered it (``WorkerRow.key_id``, so the
  binding survives restarts). Another key presenting it is refused; the binding is never moved
  silently, not even when the owning key is revoked or expires: an admin releases it
  (``POST /api/v1/workers/{id}/release``) and the next key to register the id takes it.
- Every dispatch appends a history entry ``{"to": "assigned", "attempt": N, "worker_id": W}``
  (a gang's also holds ``"gang": {"members": [...]}``), so whether a worker ever held an
  attempt is answered from the task's own persisted history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import PermissionDenied


def check_owner(worker_id: str, bound_key: str, key_id: str) -> None:
    """Raise ``PermissionDenied`` when ``worker_id`` is bound to a key other than ``key_id``
    (an empty ``bound_key``: not bound yet, or released by an admin)."""
    if bound_key and bound_key != key_id:
        raise PermissionDenied(
            f"worker id {worker_id!r} is bound to another key; a worker id belongs to the key that first "
            "registered it (an admin may release it with `dt workers release`)")


def held(history: Sequence[dict[str, Any]], worker_id: str, attempt: int) -> bool:
    """Whether ``worker_id`` was given ``attempt`` of the task with this ``history`` (as its
    single worker or as a gang member)."""
    for h in reversed(history):
        if h.get("to") == "assigned" and h.get("attempt") == attempt:
            gang = h.get("gang")
            members = gang.get("members", ()) if isinstance(gang, dict) else ()
            return h.get("worker_id") == worker_id or worker_id in members
    return False
