"""Which coordinator the worker's next connection attempt goes to (pure: no I/O; time is passed in).

The candidates are the group's members as ``client.Members`` keeps them: the URLs of
``--coordinator`` (comma-separated) in their order, plus every member a member's
``GET /api/v1/cluster`` listed (``learn``; after a registration with ``--high-availability``, and
whenever a standby names a leader not yet known). Each attempt takes the next candidate in turn,
except that a leader named by a standby's answer (``redirect``) is tried first when it is a member
(``refusal`` says why not otherwise: the worker key goes only to members, never from https to
http) and has not just failed: a paused leader keeps its lease for a TTL and the standbys keep
naming it, so a member whose session or attempt just failed comes after every other one
(``client.RECENT_FAILURE_S``). A *round* is complete when every candidate failed once since the
last successful session (``round_complete``): the worker in HA mode pauses only between rounds,
never between candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..client import Members, canonical


class Candidates:
    def __init__(self, configured: Sequence[str]) -> None:
        self.members = Members(configured)
        if not self.members.urls:
            raise ValueError("at least one coordinator URL")
        self.current = self.members.urls[0]
        self._next_leader: str | None = None
        self._started = False
        self._failed: set[str] = set()

    @property
    def urls(self) -> list[str]:
        return self.members.urls

    def next(self, now: float = 0.0) -> str:
        """The URL of the next attempt (it becomes ``current``): a pending leader, else the first
        member after ``current`` not failed in this round, those failed just now last."""
        if self._next_leader is not None:
            url, self._next_leader = self._next_leader, None
        elif not self._started:
            url = self.members.order(now)[0]
        else:
            ring = self.urls[self.urls.index(self.current) + 1:] + self.urls[: self.urls.index(self.current) + 1] \
                if self.current in self.urls else self.urls
            order = self.members.order(now, ring[0])
            url = next((u for u in order if u not in self._failed), order[0])
        self._started = True
        self.current = url
        return url

    def failed(self, url: str, now: float = 0.0, *, alive: bool = False) -> None:
        """An attempt on ``url`` failed; ``alive``: it answered (a standby without a leader to
        name), so it is not counted as just failed."""
        self._failed.add(canonical(url))
        if not alive:
            self.members.failed(url, now)

    def lost(self, url: str, now: float) -> None:
        """An established session with ``url`` ended: it comes last for a while."""
        self.members.failed(url, now)

    def round_complete(self, now: float = 0.0) -> bool:
        """Every candidate failed at least once since the last session or failed just now (and
        no leader is pending)."""
        return self._next_leader is None and all(u in self._failed or self.members.recently_failed(u, now)
                                                 for u in self.urls)

    def new_round(self) -> None:
        """After the pause between rounds: every candidate may be tried again."""
        self._failed.clear()

    def connected(self, url: str) -> None:
        """A session was established on ``url``: the failures so far no longer count."""
        self._failed.clear()
        self.members.succeeded(url)
        self.current = canonical(url)

    def refusal(self, source: str, leader: str, *, membership: bool = True) -> str | None:
        """Why the worker key must not follow ``source``'s pointer to ``leader`` (None: it may)."""
        return self.members.refusal(source, leader, membership=membership)

    def redirect(self, leader: str, now: float = 0.0, *, seen_alive: bool = False) -> bool:
        """A standby named ``leader``, a member (``refusal`` is None): the next attempt goes there,
        unless it failed just now (False: it waits its turn) and the standby did not vouch for it
        (``seen_alive``: the standby named it and does not see it silent; a member that failed
        and came back may lead again, as after a pause and then a kill of the next leader)."""
        if self.members.recently_failed(leader, now) and not seen_alive:
            return False
        self._next_leader = canonical(leader)
        self._failed.discard(self._next_leader)
        return True

    def learn(self, view: dict[str, Any], source: str | None = None) -> list[str]:
        """Take the members of a ``GET /api/v1/cluster`` answer from ``source`` (``current`` by
        default) as candidates; returns the new ones."""
        return self.members.learn(view, source or self.current)
