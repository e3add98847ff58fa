"""What one API key may keep queued: tasks (queued plus running) and stored payload bytes.

``--max-queued-per-key`` and ``--max-payload-mb-per-key`` (docs/security.md, "Quotas"). A
submission that would take its key past either is refused whole, before anything changes, with
``RateLimited`` (429, ``Retry-After: RETRY_AFTER_S``): the key may submit again once some of its
tasks finish. A task counts from its acceptance until it reaches a terminal state; its payload is
what its spec costs the coordinator's memory (:func:`payload_size`): its size as JSON plus
``VALUE_BYTES`` for every value in it, so a spec of many tiny objects weighs what it holds, not
its few bytes of text. Resubmissions of a task already known cost nothing.

The counts live in the leader's memory and are rebuilt from the active tasks it restores at start
or takeover, so in an HA group they hold group-wide: only the leader accepts submissions.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from ...errors import RateLimited, TooLarge

RETRY_AFTER_S = 5.0
MIB = 1024 * 1024
# What one JSON value (an object, array, string, number, each object member's value) may cost in
# memory beyond its JSON text: a spec is held as a struct and as a dict, so a one-key object
# (8 bytes of JSON, `{"a":1},`) is two 184-byte dicts; an empty one (`{},`) two 64-byte dicts and
# their list slots. Without it 63 MiB of `[{}, {}, ...]` took a coordinator from 179 MiB to 3.4 GiB
# (issue 40; the measured cost per value shape: docs/security.md, "Quotas").
VALUE_BYTES = 192
_CONTAINERS = (dict, list)


def payload_size(spec: dict[str, Any], json_bytes: int | None = None) -> int:
    """What a task's spec weighs against its key's payload quota, in bytes: its size as JSON plus
    ``VALUE_BYTES`` for each value it holds (:func:`count_values`), an upper bound on what its
    objects take in memory whatever their shape. ``json_bytes``: that size, when the caller has
    just encoded the spec (``tasks.spec.spec_digest_and_size``)."""
    size = len(msgspec.json.encode(spec)) if json_bytes is None else json_bytes
    return size + VALUE_BYTES * count_values(spec)


def count_values(doc: dict[str, Any] | list[Any]) -> int:
    """How many values ``doc`` holds at any depth (members of objects, items of arrays). Recursive:
    a spec's nesting is bounded at submit (``tasks/spec.py``, MAX_NESTING)."""
    n = len(doc)
    for v in doc.values() if doc.__class__ is dict else doc:
        if v.__class__ in _CONTAINERS and v:
            n += count_values(v)
    return n


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB // 10 else f"{n} bytes"


class KeyQuota:
    """Active tasks and payload bytes per key; 0 for a cap turns it off."""

    def __init__(self, max_tasks: int = 0, max_bytes: int = 0) -> None:
        if max_tasks < 0 or max_bytes < 0:
            raise ValueError(f"caps must be >= 0, got {max_tasks}, {max_bytes}")
        self.max_tasks = max_tasks
        self.max_bytes = max_bytes
        self._tasks: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()

    def check(self, key: str | None, sizes: Iterable[int]) -> None:
        """RateLimited when ``key`` may not add tasks of these payload ``sizes`` now."""
        if key is None:
            return
        sizes = list(sizes)
        if self.max_tasks and len(sizes) > self.max_tasks:  # no wait makes room for it: not a 429
            raise TooLarge([{"field": "(body)", "error": f"{len(sizes)} tasks in one submission are over the quota "
                             f"of {self.max_tasks} per key (--max-queued-per-key) by themselves: submit them in parts "
                             f"of at most {self.max_tasks}"}])
        if self.max_bytes and sizes and max(sizes) > self.max_bytes:
            raise TooLarge([{"field": "(body)", "error": f"a task whose spec weighs {_size(max(sizes))} (its JSON plus "
                             f"{VALUE_BYTES} bytes per value it holds, what it costs in memory) is over the quota of "
                             f"{_size(self.max_bytes)} per key (--max-payload-mb-per-key) by itself"}])
        if self.max_bytes and sum(sizes) > self.max_bytes:
            raise TooLarge([{"field": "(body)", "error": f"{_size(sum(sizes))} of task payload in one submission (its "
                             f"JSON plus {VALUE_BYTES} bytes per value, what it costs in memory) is over the quota of "
                             f"{_size(self.max_bytes)} per key (--max-payload-mb-per-key) by itself: submit it in "
                             "parts"}])
        if self.max_tasks and self._tasks[key] + len(sizes) > self.max_tasks:
            raise RateLimited(f"key {key} has {self._tasks[key]} tasks queued or running; {len(sizes)} more would pass "
                              f"its quota of {self.max_tasks} (--max-queued-per-key): retry once some finish",
                              RETRY_AFTER_S)
        added = sum(sizes)
        if self.max_bytes and self._bytes[key] + added > self.max_bytes:
            raise RateLimited(f"key {key} has {_size(self._bytes[key])} of task payload queued or running; "
                              f"{_size(added)} more would pass its quota of {_size(self.max_bytes)} "
                              "(--max-payload-mb-per-key): retry once some finish", RETRY_AFTER_S)

    def add(self, key: str | None, size: int) -> None:
        if key is not None:
            self._tasks[key] += 1
            self._bytes[key] += size

    def remove(self, key: str | None, size: int) -> None:
        if key is None:
            return
        self._tasks[key] -= 1
        self._bytes[key] -= size
        if self._tasks[key] <= 0:
            del self._tasks[key], self._bytes[key]

    def usage(self, key: str) -> tuple[int, int]:
        """(active tasks, payload bytes) of ``key``."""
        return self._tasks.get(key, 0), self._bytes.get(key, 0)
