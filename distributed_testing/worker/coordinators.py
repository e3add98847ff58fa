"""Which coordinator the worker's next connection attempt goes to (pure: no I/O, no clock).

The candidates are the URLs of ``--coordinator`` (comma-separated) in their order, plus, with
``--high-availability``, every member that ``GET /api/v1/cluster`` listed (``learn``). Each
attempt takes the next candidate in turn, except that a leader named by a standby's answer
(``redirect``, always) or by the cluster view (``learn``) is tried first. A *round* is complete
when every candidate failed once since the last successful session (``round_complete``): the
worker in HA mode pauses only between rounds, never between candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class Candidates:
    def __init__(self, configured: Sequence[str]) -> None:
        if not configured:
            raise ValueError("at least one coordinator URL")
        self.urls: list[str] = list(dict.fromkeys(configured))
        self.current = self.urls[0]
        self._next_leader: str | None = None
        self._cursor = -1  # the first attempt takes urls[0]
        self._failed: set[str] = set()

    def next(self) -> str:
        """The URL of the next attempt (it becomes ``current``)."""
        if self._next_leader is not None:
            url, self._next_leader = self._next_leader, None
        else:
            self._cursor = (self._cursor + 1) % len(self.urls)
            url = self.urls[self._cursor]
        self.current = url
        return url

    def failed(self, url: str) -> None:
        self._failed.add(url)

    def round_complete(self) -> bool:
        """Every candidate failed at least once since the last session (and no leader is pending)."""
        return self._next_leader is None and self._failed.issuperset(self.urls)

    def new_round(self) -> None:
        """After the pause between rounds: every candidate may be tried again."""
        self._failed.clear()

    def connected(self, url: str) -> None:
        """A session was established on ``url``: the failures so far no longer count."""
        self._failed.clear()
        self.current = url
        if url in self.urls:
            self._cursor = self.urls.index(url)

    def redirect(self, leader: str) -> None:
        """A standby named the leader: the next attempt goes there (a new URL joins the candidates)."""
        self._next_leader = leader
        self._failed.discard(leader)
        self._add([leader])

    def learn(self, view: dict[str, Any]) -> list[str]:
        """Take the members of a ``GET /api/v1/cluster`` answer as candidates; returns the new ones."""
        members = view.get("members")
        urls = [m["url"] for m in members if isinstance(m, dict) and isinstance(m.get("url"), str)] \
            if isinstance(members, list) else []
        return self._add(urls)

    def _add(self, urls: Iterable[str]) -> list[str]:
        new = [u for u in dict.fromkeys(u.rstrip("/") for u in urls)
               if u.startswith(("http://", "https://")) and u not in self.urls]
        self.urls.extend(new)
        return new
