"""``POST /api/v1/tasks`` through the coordinator's lean HTTP front (``coordinator/fast_http.py``)
answers exactly as aiohttp's handler does, and everything it does not take reaches aiohttp with
not a byte lost, over real sockets. The request parser is checked on its own first."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.coordinator import fast_http
from distributed_testing.coordinator.fast_http import FastProtocol, parse_request
from distributed_testing.testing import Cluster, run_cluster

pytestmark = pytest.mark.timeout(60)

LIMIT = 1000


def _head(*lines: str) -> bytearray:
    return bytearray(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def _post(body: bytes, *extra: str, target: str = "/api/v1/tasks") -> bytearray:
    return _head(f"POST {target} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra) + body


# ------------------------------------------------------------------ parser


def test_a_plain_submission_is_taken_with_its_first_query_values() -> None:
    buf = _post(b'{"a": 1}', "Authorization: Bearer k", target="/api/v1/tasks?wait=5&wait=9&x=%20y")
    parsed = parse_request(buf + b"POST next", LIMIT)
    assert isinstance(parsed, tuple)
    req, used = parsed
    assert used == len(buf) and req.body == b'{"a": 1}' and req.authorization == "Bearer k"
    assert req.query == {"wait": "5", "x": " y"} and not req.close


def test_connection_close_is_honoured() -> None:
    parsed = parse_request(_post(b"{}", "Connection: Close"), LIMIT)
    assert isinstance(parsed, tuple) and parsed[0].close


@pytest.mark.parametrize("cut", [0, 5, 30, -1])
def test_an_incomplete_request_waits_for_more(cut: int) -> None:
    buf = _post(b'{"a": 1}')
    assert parse_request(buf[: len(buf) + cut if cut < 0 else cut], LIMIT) is None


@pytest.mark.parametrize(
    "buf",
    [
        _head("GET /api/v1/tasks HTTP/1.1", "Host: x"),
        _head("POST /api/v1/tasks/ HTTP/1.1", "Content-Length: 0"),
        _head("POST /api/v1/keys HTTP/1.1", "Content-Length: 0"),
        _head("POST /api/v1/tasks HTTP/1.0", "Content-Length: 0"),
        _head("POST /api/v1/tasks HTTP/1.1", "Transfer-Encoding: chunked"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 2", "Expect: 100-continue"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 0", "Upgrade: websocket"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 0", "Connection: Upgrade"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 1", "Content-Length: 1"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: +1"),
        _head("POST /api/v1/tasks HTTP/1.1"),  # no length: aiohttp answers
        _head("POST /api/v1/tasks HTTP/1.1", f"Content-Length: {LIMIT + 1}"),  # aiohttp answers 413
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 0", " folded"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length : 0"),
        _head("POST /api/v1/tasks HTTP/1.1", "X: a\nContent-Length: 5", "Content-Length: 0"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 0", "X: \x00"),
        _head("POST /api/v1/tasks?a=%ff HTTP/1.1", "Content-Length: 0"),
        _head("POST /api/v1/tasks?wait=\t1 HTTP/1.1", "Host: x", "Content-Length: 0"),
        _head("POST /api/v1/tasks HTTP/1.1", "Host: x", "Host: y", "Content-Length: 0"),
        _head("POST /api/v1/tasks HTTP/1.1", "Content-Length: 0"),  # no Host
        _head("POST /api/v1/tasks HTTP/1.1", "Host: x", "Content-Length: 2", "Content-Encoding: gzip"),
        _head("POST /api/v1/tasks HTTP/1.1", "Host: x", "Content-Length: " + "0" * 4400 + "5"),
        _head("POST /api/v1/tasks HTTP/1.1", "Host: x", "Content-Length: 0", *(f"X-{i}: y" for i in range(101))),
        bytearray(b"POST /api/v1/tasks HTTP/1.1\r\nX: " + b"y" * 9000),  # a head beyond the limit
    ],
    ids=lambda b: bytes(b[:60]).decode("latin-1").replace("\r\n", " | "),
)
def test_anything_else_goes_to_aiohttp(buf: bytearray) -> None:
    assert parse_request(buf, LIMIT) is False


# ------------------------------------------------------------------ over sockets


async def _exchange(cluster: Cluster, raw: bytes, answers: int = 1) -> list[tuple[int, dict[str, str], Any]]:
    """Send ``raw`` on a new connection (one byte at a time when ``answers`` is 1) and read
    ``answers`` responses: (status, lower-cased headers, JSON body)."""
    host, port = cluster.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        if answers == 1:
            for i in range(len(raw)):
                writer.write(raw[i : i + 1])
                await writer.drain()
        else:
            writer.write(raw)
        out = []
        for _ in range(answers):
            status_line = await reader.readuntil(b"\r\n")
            headers: dict[str, str] = {}
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers["content-length"]))
            out.append((int(status_line.split()[1]), headers, json.loads(body)))
        return out
    finally:
        writer.close()


def _fast(body: bytes, auth: str, target: str = "/api/v1/tasks") -> bytes:
    return bytes(_post(body, f"Authorization: {auth}", "Content-Type: application/json", target=target))


def _chunked(body: bytes, auth: str, target: str = "/api/v1/tasks") -> bytes:
    """The same request with a chunked body, which the lean front hands to aiohttp."""
    head = _head(f"POST {target} HTTP/1.1", "Host: x", f"Authorization: {auth}", "Content-Type: application/json",
                 "Transfer-Encoding: chunked")
    return bytes(head) + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


@pytest.fixture
def fast_answers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per request the lean front answered itself: through its handler, or refused from
    its head alone when its body had not all arrived yet (which of the two depends on how the
    bytes came in: a CI run saw one of the refused requests' head arrive before its body)."""
    seen: list[int] = []
    real, refuse = FastProtocol._answer, FastProtocol._refuse

    async def counting(self: FastProtocol, req: Any) -> None:
        seen.append(1)
        await real(self, req)

    def refusing(self: FastProtocol, exc: Any) -> None:
        seen.append(1)
        refuse(self, exc)

    monkeypatch.setattr(FastProtocol, "_answer", counting)
    monkeypatch.setattr(FastProtocol, "_refuse", refusing)
    return seen


@pytest.mark.asyncio
async def test_answers_match_aiohttps_for_every_outcome(tmp_path: Path, fast_answers: list[int]) -> None:
    async with run_cluster(tmp_path) as cluster:
        admin = f"Bearer {cluster.admin_key}"
        viewer = f"Bearer {await cluster.create_key('viewer')}"
        task = {"type": "custom", "config": {"name": "noop"}}
        cases: list[tuple[str, bytes, str, str]] = [
            ("no credentials", b"{}", "", "/api/v1/tasks"),
            ("a bad key", b"{}", "Bearer dtk_nope_nope", "/api/v1/tasks"),
            ("a viewer", json.dumps(task).encode(), viewer, "/api/v1/tasks"),
            ("bad JSON", b"{not json", admin, "/api/v1/tasks"),
            ("an invalid task", b'{"type": "nope"}', admin, "/api/v1/tasks"),
            ("a bad wait", json.dumps(task).encode(), admin, "/api/v1/tasks?wait=x"),
        ]
        for what, body, auth, target in cases:
            (fast,) = await _exchange(cluster, _fast(body, auth, target))
            (slow,) = await _exchange(cluster, _chunked(body, auth, target))
            assert fast[0] == slow[0] and fast[2] == slow[2], what
            assert fast[0] >= 400 and fast[1]["content-type"] == "application/json; charset=utf-8", what
            assert fast[1].get("www-authenticate") == slow[1].get("www-authenticate"), what

        for n, raw in enumerate((_fast, _chunked)):
            doc = {**task, "task_id": f"same-{n}"}
            (created,) = await _exchange(cluster, raw(json.dumps(doc).encode(), admin, "/api/v1/tasks?wait=10"))
            (again,) = await _exchange(cluster, raw(json.dumps(doc).encode(), admin))
            (other,) = await _exchange(cluster, raw(json.dumps({**doc, "priority": 3}).encode(), admin))
            assert created[0] == 201 and created[2]["tasks"][0]["state"] == "succeeded"
            assert created[2]["tasks"][0]["outcome"]["status"] == "succeeded"
            assert again[0] == 200 and again[2]["tasks"][0]["created"] is False
            assert other[0] == 409 and other[2]["error"] == "Conflict"
        assert len(fast_answers) == len(cases) + 3  # the Content-Length ones; aiohttp took the chunked ones


@pytest.mark.asyncio
async def test_pipelined_requests_are_answered_in_order_across_the_hand_over(
    tmp_path: Path, fast_answers: list[int]
) -> None:
    async with run_cluster(tmp_path) as cluster:
        admin = f"Bearer {cluster.admin_key}"
        first = _fast(b'{"task_id": "p1", "type": "custom", "config": {"name": "noop"}}', admin, "/api/v1/tasks?wait=10")
        second = _fast(b'{"task_id": "p2", "type": "custom", "config": {"name": "noop"}}', admin)
        get = b"GET /api/v1/tasks/p1 HTTP/1.1\r\nHost: x\r\nAuthorization: " + admin.encode() + b"\r\n\r\n"
        answers = await _exchange(cluster, first + second + get + second, answers=4)
        assert [a[0] for a in answers] == [201, 201, 200, 200]
        assert len(fast_answers) == 2  # the last POST came after the hand-over: aiohttp's
        assert answers[0][2]["tasks"][0]["state"] == "succeeded"
        assert answers[2][2]["task_id"] == "p1"  # aiohttp's answer, after both of ours
        assert answers[3][2]["tasks"][0] == {"task_id": "p2", "created": False, "state": answers[3][2]["tasks"][0]["state"]}


@pytest.mark.asyncio
async def test_connection_close_and_oversized_bodies(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, max_frame_bytes=4096) as cluster:
        admin = f"Bearer {cluster.admin_key}"
        big = b'{"type": "custom", "config": {"name": "noop", "parameters": {"x": "' + b"y" * 5000 + b'"}}}'
        (too_big,) = await _exchange(cluster, _fast(big, admin))
        assert too_big[0] == 413 and "error" in too_big[2]  # aiohttp's limit, in the API's JSON shape

        raw = _fast(b'{"type": "custom", "config": {"name": "noop"}}', admin).replace(
            b"Host: x", b"Host: x\r\nConnection: close")
        host, port = cluster.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw)
        data = await asyncio.wait_for(reader.read(), 10)  # returns at EOF: the server closed
        writer.close()
        assert data.startswith(b"HTTP/1.1 201 Created\r\n") and b"\r\nConnection: close\r\n" in data


@pytest.mark.asyncio
async def test_a_half_closed_connection_gets_its_answer_then_eof(tmp_path: Path) -> None:
    async with run_cluster(tmp_path) as cluster:
        host, port = cluster.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_fast(b'{"type": "custom", "config": {"name": "noop"}}', f"Bearer {cluster.admin_key}",
                           "/api/v1/tasks?wait=10"))
        writer.write_eof()  # as `curl` or a script that sends and shuts its side down
        data = await asyncio.wait_for(reader.read(), 10)  # returns at EOF: the server closed after answering
        writer.close()
        assert data.startswith(b"HTTP/1.1 201 Created\r\n") and b'"state":"succeeded"' in data


@pytest.mark.asyncio
async def test_a_client_that_never_reads_cannot_grow_the_buffers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined requests from a client that reads no answer: the coordinator stops reading
    instead of buffering them (its read buffer stays near the app's body limit)."""
    largest = [0]
    real = FastProtocol.data_received

    def watching(self: FastProtocol, data: bytes) -> None:
        real(self, data)
        largest[0] = max(largest[0], len(self._buf))

    monkeypatch.setattr(FastProtocol, "data_received", watching)
    async with run_cluster(tmp_path, max_frame_bytes=4096) as cluster:
        host, port = cluster.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        one = _fast(b"{}", "Bearer dtk_nope_nope")  # a cheap 401 each
        chunk = one * 2000
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3):
                while True:
                    writer.write(chunk)
                    await writer.drain()  # blocks once the coordinator stops reading
        writer.transport.abort()
        assert 0 < largest[0] < 4096 + 2 * 8190 + 2**20  # the limit plus at most one socket read


@pytest.mark.asyncio
async def test_silent_and_stalled_connections_are_closed(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, header_timeout_s=0.3) as cluster:
        host, port = cluster.base_url.removeprefix("http://").split(":")
        silent = await asyncio.open_connection(host, int(port))
        stalled = await asyncio.open_connection(host, int(port))
        stalled[1].write(b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Len")
        for reader, writer in (silent, stalled):
            assert await asyncio.wait_for(reader.read(), 10) == b""  # EOF: the server closed it
            writer.close()


@pytest.mark.asyncio
async def test_a_handler_that_raises_gets_aiohttps_plain_500_and_the_connection_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(fast_http.submission, "submit", broken)
    async with run_cluster(tmp_path) as cluster:
        host, port = cluster.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_fast(b"{}", f"Bearer {cluster.admin_key}"))
        data = await asyncio.wait_for(reader.read(), 10)  # EOF after the answer
        writer.close()
        assert data.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
        assert b"Content-Type: text/plain; charset=utf-8\r\n" in data and b"Connection: close\r\n" in data
