"""The attacks of docs/security.md, "Unauthenticated clients", against a real ``run_coordinator.py``
process: anonymous 16 MiB bodies do not grow its memory; thousands of idle connections neither
make it run out of descriptors nor lock out workers and REST clients for longer than
``--header-timeout``; ``--max-connections`` and ``--auth-fail-limit`` act in the real process."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from distributed_testing.testing import Procs, Rest, raw_worker, start_coordinator_process, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
BIG = 16 * 1024 * 1024 - 1  # the default body limit, less one: the lean front takes it



@contextlib.contextmanager
def children_nofile(limit: int) -> Iterator[None]:
    """Processes started inside inherit a soft RLIMIT_NOFILE of ``limit``; this one keeps its own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def start(procs: Procs, tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], Rest]:
    p, port = start_coordinator_process(procs, tmp / "c.duckdb", args=args, log=tmp / "coordinator.log")
    return p, Rest(f"http://127.0.0.1:{port}", (tmp / "admin.key").read_text().strip(), timeout=10)


def rss(p: subprocess.Popen[bytes]) -> int:
    return int(psutil.Process(p.pid).memory_info().rss)


async def _anonymous_big_body(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Announce a 16 MiB body without credentials and send all of it but its last byte, as fast
    as the server takes it (a server that buffers bodies now holds 16 MiB for this connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: {BIG}\r\n\r\n".encode())
    chunk = b" " * (1 << 20)
    with contextlib.suppress(ConnectionError):
        for i in range(0, BIG - 1, len(chunk)):
            writer.write(chunk[: BIG - 1 - i])
            await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """The response's head, or b"" when the connection was reset or closed without one."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, TimeoutError):
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return b""


def test_sixty_anonymous_16_mib_bodies_do_not_grow_the_coordinator(procs: Procs, tmp_path: Path) -> None:
    p, rest = start(procs, tmp_path)
    rest.ok("GET", "/api/v1/workers")  # warm: the first requests' allocations are not the attack's
    before = rss(p)
    port = int(rest.base_url.rsplit(":", 1)[1])

    async def attack() -> tuple[int, list[bytes]]:
        conns = await asyncio.gather(*(_anonymous_big_body(port) for _ in range(60)))
        during = rss(p)  # every body is in flight: a server buffering them holds ~1 GiB now
        answers = list(await asyncio.gather(*(_answer(r) for r, _ in conns)))
        for _, w in conns:
            w.close()
        return during, answers

    during, answers = asyncio.run(attack())
    grown = during - before
    assert p.poll() is None
    assert grown < 60 * BIG // 10, f"RSS grew by {grown >> 20} MiB for 60 anonymous 16 MiB bodies"
    answered = [a for a in answers if a]
    assert answered and all(a.startswith(b"HTTP/1.1 401 Unauthorized\r\n") for a in answered), answered[:1]
    rest.ok("GET", "/api/v1/workers")


def _open_idle(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        out.append(s)
    return out


def _answer_or_eof(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := s.recv(4096):
            data += chunk
    return data


def test_idle_connections_cannot_exhaust_the_descriptors(procs: Procs, tmp_path: Path) -> None:
    """A coordinator allowed 256 descriptors, 600 idle connections: the ones over its derived cap
    are refused at once, the process stays up and never runs out of descriptors, and once the
    idle ones time out a worker registers and a REST call succeeds."""
    with children_nofile(256):
        p, rest = start(procs, tmp_path, "--header-timeout", "1")
    worker_key = rest.create_key("worker")
    port = int(rest.base_url.rsplit(":", 1)[1])
    idle = _open_idle(port, 600)
    try:
        answers = [_answer_or_eof(s, 15) for s in idle]
    finally:
        for s in idle:
            s.close()
    assert p.poll() is None
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
    assert len(refused) >= 600 - 256, f"only {len(refused)} of 600 refused"
    assert all(a == b"" or a.startswith(b"HTTP/1.1 503 ") for a in answers)  # the rest: closed after 1 s
    wait_until(lambda: rest.request("GET", "/api/v1/workers")[0] == 200, 20, "REST to answer again")

    async def register() -> None:
        async with raw_worker(rest.base_url, worker_key, "after-the-flood"):
            pass

    asyncio.run(register())
    text = (tmp_path / "coordinator.log").read_text()
    assert "Too many open files" not in text and "out of system resource" not in text
    assert "refused a connection" in text and "(--max-connections)" in text  # logged, rate-limited
    assert text.count("refused a connection") < 20


def test_max_connections_and_auth_fail_limit_flags_act_in_the_process(procs: Procs, tmp_path: Path) -> None:
    p, rest = start(procs, tmp_path, "--max-connections", "5", "--header-timeout", "30",
                    "--auth-fail-limit", "2", "--auth-fail-window", "30")
    port = int(rest.base_url.rsplit(":", 1)[1])
    idle = _open_idle(port, 5)
    try:
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert _answer_or_eof(extra, 10).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        extra.close()
    finally:
        for s in idle:
            s.close()
    wait_until(lambda: rest.request("GET", "/api/v1/workers")[0] == 200, 20, "room again once they closed")
    bad = Rest(rest.base_url, rest.key[:-1] + ("A" if rest.key[-1] != "A" else "B"))
    assert [bad.request("GET", "/api/v1/tasks")[0] for _ in range(3)] == [401, 401, 429]
    assert rest.request("GET", "/api/v1/tasks")[0] == 429  # this address, for the rest of the window
    assert p.poll() is None
    assert "2 failed authentications within 30s" in (tmp_path / "coordinator.log").read_text()
