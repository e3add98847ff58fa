"""The HA group on PostgreSQL: membership, the leader lease and its fencing epoch.

Coordinators started on one PostgreSQL database form a group with ONE leader and hot standbys
(docs/architecture.md, "High availability"). PostgreSQL is the arbiter; there is no consensus
protocol of our own. Three tables:

- ``dt_lease``: one row, ``name = 'leader'``: ``holder`` (a member id), ``epoch`` (incremented by
  every takeover), ``expires_at`` (database clock), ``url`` (where clients reach the leader).
- ``dt_members``: one row per member (``member_id``, advertised ``url``, ``role``, ``epoch``,
  ``started_at``, ``last_seen``), upserted every ``MEMBER_BEAT_S``; ``GET /api/v1/cluster``.
- ``dt_secret``: the token-signing secret shared by the members (``--jwt-secret-file`` aside).

The lease (:class:`Lease`):

- *acquire*: ``UPDATE dt_lease SET holder = me, epoch = epoch + 1, expires_at = now + TTL`` where
  the epoch is still the one just read, and either the lease expired, or the holder's database
  session is gone. The second is the fast path after a crash: in the same transaction the new
  holder takes a session-level advisory lock keyed by its epoch (``LOCK_BASE + epoch``), so while
  a holder's lease connection lives, ``pg_try_advisory_lock`` on its epoch fails; when the
  process dies PostgreSQL ends its session and frees the lock at once, and a standby takes over
  without waiting for ``expires_at``. A paused (SIGSTOPped) holder keeps its session and lock:
  then the lease has to expire, and a standby takes over after ``expires_at`` without that lock.
- *renew* every ``RENEW_EVERY_S`` on the same connection, only while unexpired and still ours.
- *holding*: :meth:`Lease.holds` is ``monotonic() < deadline``, where ``deadline`` is the moment
  the last successful acquire/renew was SENT plus ``TTL - MARGIN``. The database set
  ``expires_at`` later than that send, so the holder stops believing it leads at least
  ``LEASE_MARGIN_S`` before any standby may take over. The lease connection closing, a failed
  or late renewal, or the deadline passing ends leadership at once (:class:`LeadershipLost`).

Stores writes are fenced on top of this by the store itself (``PostgresStore.set_fence``: every
write transaction checks the lease row), and the runtime checks :meth:`Lease.holds` before every
send to a worker, every write and every tick (``Runtime.fence``).

Defaults: TTL 5 s, renew every 1 s, margin 1 s, standby poll 0.2 s. A SIGKILLed leader is
replaced within one poll (its session ends with the process); a leader paused or cut off from
the database is replaced after at most 5 s, and stopped acting a second before; a leader's event
loop may stall up to 3 s without losing the lease, which a loaded 2-core machine needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..errors import DTError, StoreError
from ..protocol.timing import LEASE_TTL_S, STANDBY_POLL_S

log = logging.getLogger(__name__)

# LEASE_TTL_S and STANDBY_POLL_S live in protocol/timing.py: the clients' failover bound follows from them
RENEW_EVERY_S = 1.0
LEASE_MARGIN_S = 1.0
MEMBER_BEAT_S = 0.5
MEMBER_STALE_S = 3.0  # a member not seen for this long is shown unhealthy
MEMBER_FORGET_S = 3600.0  # rows of members not seen for this long are deleted by the leader
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0  # giving the lease up and leaving at a stop: a database out of reach does not hold the stop
LOCK_BASE = 0x4454_4C45_0000_0000  # "DTLE": advisory lock key of epoch e is LOCK_BASE + e
SCHEMA_LOCK = LOCK_BASE - 1
SECRET_NAME = "jwt"

# The store creates dt_lease with its schema (store/pgsql.py); the group adds its own tables and
# the lease row ("" holder: nobody).
SCHEMA = """
CREATE TABLE IF NOT EXISTS dt_members (
    member_id text PRIMARY KEY, url text NOT NULL, role text NOT NULL, epoch bigint,
    started_at timestamptz NOT NULL, last_seen timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS dt_secret (name text PRIMARY KEY, secret bytea NOT NULL);
"""
LEASE_ROW = """INSERT INTO dt_lease (name, holder, epoch, expires_at, url) VALUES ('leader', '', 0, '-infinity', '')
               ON CONFLICT (name) DO NOTHING"""
DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)

_READ_LEASE = """SELECT holder, epoch, url, expires_at < clock_timestamp() AS expired
                 FROM dt_lease WHERE name = 'leader'"""
_TAKE = """UPDATE dt_lease SET holder = $1, epoch = epoch + 1, url = $3,
                  expires_at = clock_timestamp() + make_interval(secs => $2)
           WHERE name = 'leader' AND epoch = $4 RETURNING epoch"""
_RENEW = """UPDATE dt_lease SET expires_at = clock_timestamp() + make_interval(secs => $3)
            WHERE name = 'leader' AND holder = $1 AND epoch = $2 AND expires_at > clock_timestamp()
            RETURNING true"""
_RELEASE = """UPDATE dt_lease SET expires_at = '-infinity'
              WHERE name = 'leader' AND holder = $1 AND epoch = $2"""


class LeadershipLost(DTError):
    """This member stopped being the leader (renewal failed or late, lease connection lost,
    replaced): it must stop acting at once; the coordinator starts a new standby term."""


class NotLeader(DTError):
    """A request only the leader can serve reached a standby (or a leader whose lease ran out).
    ``leader``: the URL to use, or None while no member leads; ``path_qs``: the request's path and
    query. Answered 503 naming ``leader`` (``api.error_parts``), never redirected."""

    def __init__(self, leader: str | None, path_qs: str = "", unhealthy: list[str] | None = None) -> None:
        self.leader = leader
        self.path_qs = path_qs
        self.unhealthy = unhealthy or []  # members this one sees silent (Group.silent_urls)
        super().__init__(f"this coordinator is a standby; the leader is {leader}" if leader
                         else "this coordinator is a standby and no leader is known yet; retry shortly")


def is_postgres_url(db_path: str) -> bool:
    """Whether ``--db-path`` names a PostgreSQL database (then the coordinator is a group member)."""
    return db_path.strip().lower().startswith(("postgresql://", "postgres://"))


def default_advertise_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port`` with the bound port; a wildcard bind (0.0.0.0, ::, empty) is
    advertised under this machine's host name, which other machines can resolve."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.getfqdn() or socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def new_member_id() -> str:
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


async def connect(dsn: str) -> asyncpg.Connection:
    """One asyncpg connection to the group's database (no statement cache: one-row statements)."""
    conn: asyncpg.Connection = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S, statement_cache_size=0)
    return conn


async def ensure_schema(conn: asyncpg.Connection) -> None:
    """Create the group's tables, and the lease row once the store created ``dt_lease``; safe when
    members start at once."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        await conn.execute(SCHEMA)
        if await conn.fetchval("SELECT to_regclass('dt_lease') IS NOT NULL"):
            await conn.execute(LEASE_ROW)


async def load_or_create_secret(conn: asyncpg.Connection, generate: Callable[[], bytes]) -> bytes:
    """The group's token-signing secret: created once by whichever member comes first."""
    await conn.execute("INSERT INTO dt_secret (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                       SECRET_NAME, generate())
    secret: bytes = await conn.fetchval("SELECT secret FROM dt_secret WHERE name = $1", SECRET_NAME)
    return secret


async def rotate_secret(dsn: str, secret: bytes) -> None:
    """Replace the group's token-signing secret and tell the members (``NOTIFY dt_keys``: they
    reload keys and secret within a second)."""
    conn = await connect(dsn)
    try:
        await ensure_schema(conn)
        async with conn.transaction():
            await conn.execute("INSERT INTO dt_secret (name, secret) VALUES ($1, $2) ON CONFLICT (name) "
                               "DO UPDATE SET secret = EXCLUDED.secret", SECRET_NAME, secret)
            await conn.execute("NOTIFY dt_keys, 'secret'")
    finally:
        await conn.close()


class _Busy(Exception):
    """The new epoch's advisory lock was taken: give the lease back (roll back)."""


class Lease:
    """The leader lease on one dedicated connection (see the module docstring)."""

    def __init__(self, conn: asyncpg.Connection, member_id: str, url: str, *, ttl_s: float = LEASE_TTL_S,
                 margin_s: float = LEASE_MARGIN_S, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < margin_s < ttl_s:
            raise ValueError("the lease margin must be > 0 and below its TTL")
        self.conn = conn
        self.member_id = member_id
        self.url = url
        self.ttl_s = ttl_s
        self.margin_s = margin_s
        self.clock = clock
        self.epoch: int | None = None
        self.deadline = -math.inf
        self.lost = asyncio.Event()
        self.lost_reason = ""
        conn.add_termination_listener(self._connection_closed)

    def holds(self) -> bool:
        """Whether this member may act as the leader now: one monotonic comparison."""
        return self.clock() < self.deadline

    def _lose(self, reason: str) -> None:
        self.deadline = -math.inf
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    def _connection_closed(self, _conn: Any) -> None:
        if self.epoch is not None:
            self._lose("the lease's database connection closed")

    async def observe(self) -> LeaseRow:
        row = await self.conn.fetchrow(_READ_LEASE)
        assert row is not None, "the lease row is created with the schema"
        return _lease_row(row)

    async def try_acquire(self) -> int | None:
        """Take the lease if it expired or its holder's session is gone; the new epoch, or None."""
        seen = await self.observe()
        fast = False
        if not seen.expired and seen.holder:
            if not await self.conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_BASE + seen.epoch):
                return None  # its holder's session is alive: wait for it to expire
            await self.conn.fetchval("SELECT pg_advisory_unlock($1)", LOCK_BASE + seen.epoch)
            fast = True
        sent = self.clock()
        try:
            async with self.conn.transaction():
                epoch = await self.conn.fetchval(_TAKE, self.member_id, self.ttl_s, self.url, seen.epoch)
                if epoch is None:
                    return None  # another member took it first
                if not await self.conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_BASE + epoch):
                    raise _Busy
        except _Busy:
            return None
        self.epoch = int(epoch)
        self.deadline = sent + self.ttl_s - self.margin_s
        log.warning("took the leader lease, epoch %d (previous holder %s, epoch %d, %s)", self.epoch, seen.holder,
                    seen.epoch, "its database session ended" if fast else "its lease expired or was released")
        return self.epoch

    async def renew(self) -> None:
        """Extend the lease; LeadershipLost if it is no longer ours or the renewal came too late."""
        left = self.deadline - self.clock()
        if left <= 0:
            self._lose("the lease deadline passed before a renewal")
            raise LeadershipLost(self.lost_reason)
        sent = self.clock()
        try:
            async with asyncio.timeout(left):
                ok = await self.conn.fetchval(_RENEW, self.member_id, self.epoch, self.ttl_s)
        except TimeoutError:
            self._lose("renewing the lease took longer than what was left of it")
            raise LeadershipLost(self.lost_reason) from None
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            self._lose(f"renewing the lease failed: {exc}")
            raise LeadershipLost(self.lost_reason) from exc
        if not ok:
            self._lose("the lease was taken over or expired")
            raise LeadershipLost(self.lost_reason)
        if self.holds():  # still ours when it was sent: move the deadline on
            self.deadline = sent + self.ttl_s - self.margin_s

    async def hold(self) -> None:
        """Renew every ``RENEW_EVERY_S`` until leadership is lost (raises LeadershipLost)."""
        while True:
            waiter = asyncio.ensure_future(self.lost.wait())
            try:
                await asyncio.wait([waiter], timeout=max(0.0, min(RENEW_EVERY_S, self.deadline - self.clock())))
            finally:
                waiter.cancel()
            if self.lost.is_set():
                raise LeadershipLost(self.lost_reason)
            await self.renew()

    async def release(self) -> None:
        """Give the lease up (a graceful stop): a standby takes over at its next poll. Call only
        once this member stopped acting."""
        if self.epoch is None:
            return
        self._lose("released")
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
            await self.conn.execute(_RELEASE, self.member_id, self.epoch, timeout=CLOSE_TIMEOUT_S)


@dataclass(frozen=True)
class LeaseRow:
    holder: str | None  # None: nobody
    epoch: int
    url: str | None
    expired: bool


def _lease_row(row: Any) -> LeaseRow:
    return LeaseRow(holder=row["holder"] or None, epoch=int(row["epoch"]), url=row["url"] or None,
                    expired=bool(row["expired"]))


@dataclass(frozen=True)
class Member:
    member_id: str
    url: str
    role: str  # "leader" / "standby", as the lease says (not as the row claims)
    epoch: int | None
    age_s: float  # since its last heartbeat
    started_at: float

    @property
    def healthy(self) -> bool:
        return self.age_s < MEMBER_STALE_S


class Group:
    """This coordinator's membership: the lease, the member heartbeat, the cached cluster view.

    ``run(on_elected)`` connects, registers, waits as a standby until it holds the lease, awaits
    ``on_elected(epoch)`` (restore and start serving), then holds the lease; it raises
    :class:`LeadershipLost` when that ends. ``leading`` is what the HTTP layer asks."""

    def __init__(self, dsn: str, url: str, member_id: str | None = None, *,
                 ttl_s: float = LEASE_TTL_S, margin_s: float = LEASE_MARGIN_S) -> None:
        self.dsn = dsn
        self.url = url
        self.member_id = member_id or new_member_id()
        self.ttl_s = ttl_s
        self.margin_s = margin_s
        self.lease: Lease | None = None
        self.elected = False  # on_elected finished: the runtime serves as leader
        self.known = LeaseRow(None, 0, None, True)
        self.members: list[Member] = []
        self._started_at = time.time()
        self._lease_conn: asyncpg.Connection | None = None
        self._beat_conn: asyncpg.Connection | None = None
        self._beat_lock = asyncio.Lock()
        # set once this term knows its place: it leads, or it looked at the lease and stands by
        self.settled = asyncio.Event()

    @property
    def leading(self) -> bool:
        return self.elected and self.lease is not None and self.lease.holds()

    @property
    def took_lease(self) -> bool:
        """This term took the lease (it leads, is taking over, or lost it): its keys are its own."""
        return self.lease is not None and self.lease.epoch is not None

    @property
    def epoch(self) -> int | None:
        return self.lease.epoch if self.lease is not None and self.leading else None

    @property
    def leader_url(self) -> str | None:
        """Where clients should go: this member while it leads, else the unexpired lease's URL."""
        if self.leading:
            return self.url
        if self.known.expired or self.known.holder == self.member_id:
            return None
        return self.known.url

    def silent_urls(self) -> list[str]:
        """The URLs of members not seen for ``MEMBER_STALE_S`` (a URL whose freshest row is
        healthy is not: a member restarted there has a new id, its old row lingers a while)."""
        healthy = {m.url.rstrip("/") for m in self.members if m.healthy}
        return sorted({m.url for m in self.members if m.url.rstrip("/") not in healthy})

    def view(self) -> dict[str, Any]:
        """``GET /api/v1/cluster``."""
        return {"leader": self.leader_url, "epoch": self.known.epoch if not self.known.expired else None,
                "self": self.member_id,
                "members": [{"member_id": m.member_id, "url": m.url, "role": m.role, "epoch": m.epoch,
                             "last_seen_age_s": round(m.age_s, 3), "healthy": m.healthy, "started_at": m.started_at}
                            for m in self.members]}

    async def connect(self) -> None:
        """Open the lease and membership connections and create the group's tables if missing;
        StoreError when the database cannot be reached."""
        try:
            self._lease_conn = await connect(self.dsn)
            self._beat_conn = await connect(self.dsn)
            await ensure_schema(self._lease_conn)
        except DB_ERRORS as exc:
            raise StoreError(f"the group cannot use its database: {exc}") from exc

    async def secret(self, generate: Callable[[], bytes]) -> bytes:
        """The group's token-signing secret (created by the first member to ask), on a connection
        of its own (the membership one may be in use)."""
        try:
            conn = await connect(self.dsn)
            try:
                return await load_or_create_secret(conn, generate)
            finally:
                await conn.close()
        except DB_ERRORS as exc:
            raise StoreError(f"reading the group's token-signing secret failed: {exc}") from exc

    async def run(self, on_elected: Callable[[int], Awaitable[None]]) -> None:
        """Register, stand by until this member holds the lease, take over, hold it. Raises
        LeadershipLost when the leadership ends. ``url`` must be set (the port bound) first."""
        assert self._lease_conn is not None, "connect() first"
        lease = self.lease = Lease(self._lease_conn, self.member_id, self.url, ttl_s=self.ttl_s,
                                   margin_s=self.margin_s)
        beats = asyncio.create_task(self._beat_loop(), name="group-members")
        try:
            epoch = await self._stand_by()
            lease = self.lease
            assert lease is not None
            self.known = LeaseRow(self.member_id, epoch, self.url, False)
            with contextlib.suppress(*DB_ERRORS):
                await self._beat()  # the cluster view says so at once
            try:
                await on_elected(epoch)
            except (*DB_ERRORS, StoreError) as exc:  # the database went away meanwhile: stand by again
                raise LeadershipLost(f"taking over failed: {exc}") from exc
            if not lease.holds():
                raise LeadershipLost("the lease ran out while taking over")
            self.elected = True
            self.settled.set()
            log.warning("leading the group as %s at %s (epoch %d)", self.member_id, self.url, epoch)
            await lease.hold()
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats

    async def _stand_by(self) -> int:
        """Poll the lease until this member takes it; a lost connection is replaced (a standby
        holds nothing a new connection could not)."""
        while True:
            lease = self.lease
            assert lease is not None
            try:
                if (epoch := await lease.try_acquire()) is not None:
                    return epoch
                self.known = await lease.observe()
                self.settled.set()
            except DB_ERRORS as exc:
                log.warning("standby: checking the lease failed (%s); reconnecting", exc)
                await asyncio.sleep(1.0)
                with contextlib.suppress(*DB_ERRORS):
                    await self._reconnect_lease()
                continue
            await asyncio.sleep(STANDBY_POLL_S)

    async def _reconnect_lease(self) -> None:
        old = self._lease_conn
        self._lease_conn = None
        if old is not None:
            old.terminate()
        self._lease_conn = await connect(self.dsn)
        self.lease = Lease(self._lease_conn, self.member_id, self.url, ttl_s=self.ttl_s, margin_s=self.margin_s)

    async def _beat_loop(self) -> None:
        while True:
            try:
                if self._beat_conn is None or self._beat_conn.is_closed():
                    self._beat_conn = await connect(self.dsn)
                await self._beat()
            except DB_ERRORS as exc:
                log.warning("member heartbeat failed: %s", exc)
            await asyncio.sleep(MEMBER_BEAT_S)

    async def _beat(self) -> None:
        async with self._beat_lock:  # the loop's and the one at election share the connection
            await self._beat_once()

    async def _beat_once(self) -> None:
        conn = self._beat_conn
        assert conn is not None
        role = "leader" if self.leading else "standby"
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO dt_members (member_id, url, role, epoch, started_at, last_seen) "
                "VALUES ($1, $2, $3, $4, to_timestamp($5), clock_timestamp()) ON CONFLICT (member_id) DO UPDATE "
                "SET url = EXCLUDED.url, role = EXCLUDED.role, epoch = EXCLUDED.epoch, last_seen = clock_timestamp()",
                self.member_id, self.url, role, self.epoch, self._started_at)
            # a member restarted at this URL has a new id: its old row goes once it is stale, or the
            # cluster view would show the URL unhealthy (and standbys would not forward to it)
            await conn.execute("DELETE FROM dt_members WHERE url = $1 AND member_id <> $2 "
                               "AND last_seen < clock_timestamp() - make_interval(secs => $3)",
                               self.url, self.member_id, MEMBER_STALE_S)
            if self.leading:
                await conn.execute("DELETE FROM dt_members WHERE last_seen < clock_timestamp() - make_interval(secs => $1)",
                                   MEMBER_FORGET_S)
            rows = await conn.fetch(
                "SELECT m.member_id, m.url, m.epoch, extract(epoch FROM clock_timestamp() - m.last_seen) AS age, "
                "extract(epoch FROM m.started_at) AS started_at, "
                "(l.holder = m.member_id AND l.expires_at > clock_timestamp()) AS leads "
                "FROM dt_members m LEFT JOIN dt_lease l ON l.name = 'leader' ORDER BY m.started_at, m.member_id")
            known = await conn.fetchrow(_READ_LEASE)
        self.members = [Member(r["member_id"], r["url"], "leader" if r["leads"] else "standby", r["epoch"],
                               float(r["age"]), float(r["started_at"])) for r in rows]
        if known is not None and not self.leading:
            self.known = _lease_row(known)

    async def close(self, *, leave: bool = True) -> None:
        """Drop this member's row, then release the lease if held (call once nothing acts any
        more), close both connections. The row goes first: the standby that takes the lease reads
        the member list as it takes over, and with the row still there its cluster view named the
        member that had left until its next heartbeat."""
        self.elected = False
        conns = [c for c in (self._beat_conn, self._lease_conn) if c is not None]
        if leave and self._beat_conn is not None:
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
                await self._beat_conn.execute("DELETE FROM dt_members WHERE member_id = $1", self.member_id,
                                              timeout=CLOSE_TIMEOUT_S)
        if self.lease is not None:
            await self.lease.release()
        for c in conns:
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await c.close(timeout=2.0)
        self._beat_conn = self._lease_conn = None
