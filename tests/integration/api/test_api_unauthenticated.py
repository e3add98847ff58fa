"""Unauthenticated clients cannot exhaust the coordinator, over real sockets (docs/security.md,
"Unauthenticated clients"): credentials are judged from the head before any body is read,
connections without a complete head are closed after ``header_timeout_s``, connections beyond
``max_connections`` and worker sessions beyond ``max_worker_sessions`` are refused at once,
failed authentications are throttled per address, an unknown key and a wrong secret get the same
bytes, and bodies that are not UTF-8 or not what their ``Content-Encoding`` says get 400 JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from distributed_testing.testing import Cluster, run_cluster, wait_for

pytestmark = pytest.mark.timeout(90)
BIG = 16 * 1024 * 1024 - 1  # the default body limit, less one: the lean front takes it


def _addr(cluster: Cluster) -> tuple[str, int]:
    host, port = cluster.base_url.removeprefix("http://").split(":")
    return host, int(port)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readuntil(b"\r\n")
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def _head_only(cluster: Cluster, head: bytes, local: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """Send just ``head`` (announcing a body that is never sent) and read the answer; the server
    must then close the connection without waiting for the body."""
    reader, writer = await asyncio.open_connection(*_addr(cluster), local_addr=(local, 0) if local else None)
    try:
        writer.write(head)
        answer = await asyncio.wait_for(_read_response(reader), 10)
        if answer[1].get("connection") == "close":
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, not waiting for 16 MiB
        return answer
    finally:
        writer.close()


def _big_post(target: str, *extra: str) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: x", "Content-Type: application/json", f"Content-Length: {BIG}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _bad_key(cluster: Cluster) -> str:
    """The admin key with its secret changed: a key id that exists, a wrong secret."""
    key = cluster.admin_key
    return key[:-1] + ("A" if key[-1] != "A" else "B")


# ------------------------------------------------------------------ credentials before the body


@pytest.mark.asyncio
async def test_an_anonymous_big_body_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        for what, head in [
            ("lean front, no credentials", _big_post("/api/v1/tasks")),
            ("lean front, wrong secret", _big_post("/api/v1/tasks", f"Authorization: Bearer {_bad_key(c)}")),
            ("lean front, a JWT that is not one", _big_post("/api/v1/tasks", "Authorization: Bearer abc.def.ghi")),
            ("aiohttp, chunked", _big_post("/api/v1/tasks", "Transfer-Encoding: chunked").replace(
                f"Content-Length: {BIG}\r\n".encode(), b"")),
            ("aiohttp, another route", _big_post("/api/v1/keys")),
            ("aiohttp, 100-continue", _big_post("/api/v1/keys", "Expect: 100-continue")),
        ]:
            status, headers, body = await _head_only(c, head)
            assert status == 401, (what, status, body)
            assert headers["content-type"] == "application/json; charset=utf-8", what
            assert json.loads(body)["error"] == "AuthError", what
        viewer = await c.create_key("viewer")
        status, _, body = await _head_only(c, _big_post("/api/v1/tasks", f"Authorization: Bearer {viewer}"))
        assert status == 403, body  # a valid key without tasks:submit: refused before its body too


@pytest.mark.asyncio
async def test_an_authorized_submission_still_gets_its_body_read(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        body = json.dumps({"type": "custom", "config": {"name": "noop"}}).encode()
        head = (f"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {c.admin_key}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        reader, writer = await asyncio.open_connection(*_addr(c))
        try:
            writer.write(head)
            await writer.drain()
            with pytest.raises(TimeoutError):  # nothing is answered before the body is in
                await asyncio.wait_for(reader.readuntil(b"\r\n"), 0.3)
            writer.write(body)
            status, _, answer = await asyncio.wait_for(_read_response(reader), 10)
            assert status == 201 and json.loads(answer)["tasks"][0]["created"] is True
        finally:
            writer.close()


# ------------------------------------------------------------------ idle connections


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    return await asyncio.wait_for(reader.read(), seconds)


@pytest.mark.asyncio
async def test_connections_without_a_complete_head_are_closed_after_the_header_timeout(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, header_timeout_s=0.5) as c:
        addr = _addr(c)
        silent = await asyncio.open_connection(*addr)
        partial = await asyncio.open_connection(*addr)
        partial[1].write(b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\n")
        trickle = await asyncio.open_connection(*addr)
        kept_alive = await asyncio.open_connection(*addr)  # answered by aiohttp, then idle
        kept_alive[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = await asyncio.wait_for(_read_response(kept_alive[0]), 10)
        assert status == 200
        slow_second = await asyncio.open_connection(*addr)  # aiohttp's, then a head one byte at a time
        slow_second[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(_read_response(slow_second[0]), 10)
        started = time.monotonic()

        async def drip(writer: asyncio.StreamWriter, data: bytes) -> None:
            with contextlib.suppress(ConnectionError):
                for i in range(len(data)):  # a byte every 50 ms: never a whole head
                    writer.write(data[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(0.05)

        drips = [asyncio.create_task(drip(w, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"y" * 400))
                 for w in (trickle[1], slow_second[1])]
        try:
            for reader, writer in (silent, partial, trickle, kept_alive, slow_second):
                assert await _closed_within(reader, 10) == b""  # EOF: the coordinator closed it
                writer.close()
        finally:
            for d in drips:
                d.cancel()
        assert time.monotonic() - started < 8  # seconds, not the hour of aiohttp's keep-alive default


@pytest.mark.asyncio
async def test_the_header_timeout_cuts_neither_worker_sessions_nor_long_polls(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1, header_timeout_s=0.3) as c:
        session = c.runtime.sessions["w0"]
        task = {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 1.5}}}
        for target in ("/api/v1/tasks?wait=10", "/api/v1/tasks?wait=10&x=1"):  # lean front, then again
            status, body = await c.request("POST", target, json=task)
            assert status == 201 and body["tasks"][0]["state"] == "succeeded", body  # waited 1.5 s > 0.3 s
        (tid,) = await c.submit(task)
        got = await c.wait(tid)  # aiohttp's GET ?wait, also longer than the timeout
        assert got["state"] == "succeeded", got
        assert c.runtime.sessions["w0"] is session and session.closing is None  # the same session throughout


# ------------------------------------------------------------------ connection caps


async def _open_idle(addr: tuple[str, int], n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    return [await asyncio.open_connection(*addr) for _ in range(n)]


@pytest.mark.asyncio
async def test_connections_beyond_the_cap_are_refused_at_accept_and_service_resumes(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1, max_connections=20, header_timeout_s=1.0) as c:
        idle = await _open_idle(_addr(c), 60)
        answers = await asyncio.gather(*(_closed_within(r, 10) for r, _ in idle))
        for _, w in idle:
            w.close()
        refused = [a for a in answers if a]
        assert len(refused) >= 40, f"{len(refused)} of 60 refused at a cap of 20"
        assert all(a.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"Retry-After: 1" in a for a in refused)
        assert json.loads(refused[0].partition(b"\r\n\r\n")[2])["error"] == "Unavailable"
        assert c.runtime.sessions["w0"].closing is None  # the registered worker kept its session
        status, body = await c.request("GET", "/api/v1/workers")  # the idle ones timed out: room again
        assert status == 200 and [w["state"] for w in body["workers"]] == ["ready"]
        await c.add_worker()  # and a new worker registers


@pytest.mark.asyncio
async def test_worker_sessions_beyond_their_cap_get_503_at_the_handshake(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1, max_worker_sessions=1) as c:
        key = await c.create_key("worker")
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await c.http.ws_connect(c.base_url + "/ws/worker", headers={"Authorization": f"Bearer {key}"})
        assert info.value.status == 503 and info.value.headers is not None
        assert info.value.headers.get("Retry-After") == "5"
        assert list(c.runtime.sessions) == ["w0"]
        c.agents[0].stop()
        await wait_for(lambda: not c.runtime.sessions, what="the first worker to leave")
        await c.add_worker()  # its place is free again


# ------------------------------------------------------------------ failed authentication


def _loopback_alias() -> str | None:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return "127.0.0.2"
    except OSError:
        return None


@pytest.mark.asyncio
async def test_an_address_with_too_many_failed_authentications_gets_429(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, auth_fail_limit=3, auth_fail_window_s=2.0) as c:
        for i in range(3):  # through the lean front and aiohttp alike
            status, body = await c.request(*(("POST", "/api/v1/tasks") if i % 2 else ("GET", "/api/v1/tasks")),
                                           key=_bad_key(c), json={})
            assert status == 401, body
        for method, path in (("POST", "/api/v1/tasks"), ("GET", "/api/v1/workers"), ("GET", "/ws/worker")):
            async with c.http.request(method, c.base_url + path, json={} if method == "POST" else None,
                                      headers={"Authorization": f"Bearer {c.admin_key}"}) as r:
                assert r.status == 429, (path, r.status)  # even a valid key, from this address, for now
                assert 1 <= int(r.headers["Retry-After"]) <= 2
                assert (await r.json())["error"] == "RateLimited"
        status, _ = await c.request("GET", "/healthz", key="")
        assert status == 200  # a route without credentials is not throttled
        alias = _loopback_alias()
        if alias is not None:  # another address is not affected
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(alias, 0))) as other:
                async with other.get(c.base_url + "/api/v1/workers",
                                     headers={"Authorization": f"Bearer {c.admin_key}"}) as r:
                    assert r.status == 200

        async def allowed_again() -> bool:
            return (await c.request("GET", "/api/v1/workers"))[0] == 200

        deadline = time.monotonic() + 10
        while not await allowed_again():  # once the failures leave the 2 s window
            assert time.monotonic() < deadline, "still refused 10 s after the window"
            await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_the_auth_fail_limit_zero_turns_throttling_off(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, auth_fail_limit=0) as c:
        for _ in range(30):
            assert (await c.request("GET", "/api/v1/tasks", key=_bad_key(c)))[0] == 401
        assert (await c.request("GET", "/api/v1/tasks"))[0] == 200


@pytest.mark.asyncio
async def test_a_request_without_credentials_is_not_counted_as_a_failed_guess(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, auth_fail_limit=2) as c:
        for _ in range(10):
            assert (await c.request("GET", "/api/v1/tasks", key=""))[0] == 401
        assert (await c.request("GET", "/api/v1/tasks"))[0] == 200


async def _raw_answer(cluster: Cluster, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*_addr(cluster))
    try:
        writer.write(raw)
        status, headers, body = await asyncio.wait_for(_read_response(reader), 10)
        kept = "".join(f"{k}: {v}\n" for k, v in sorted(headers.items()) if k != "date")
        return f"{status}\n{kept}".encode() + body
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_an_unknown_key_and_a_wrong_secret_get_byte_identical_answers(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        known_id = c.admin_key.split("_")[1]
        unknown = c.admin_key.replace(known_id, "zz" + known_id[2:] if not known_id.startswith("zz") else "yy" + known_id[2:])
        body = b'{"type": "custom", "config": {"name": "noop"}}'
        for target, extra in (("POST /api/v1/tasks", f"Content-Length: {len(body)}\r\n"),  # the lean front
                              ("POST /api/v1/tasks", "Transfer-Encoding: chunked\r\n"),  # aiohttp
                              ("GET /api/v1/workers", ""),
                              ("GET /ws/worker", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                                                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")):
            payload = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if "chunked" in extra
                       else body if "Length" in extra else b"")
            answers = [await _raw_answer(c, f"{target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n{extra}\r\n"
                                         .encode() + payload) for key in (unknown, _bad_key(c))]
            assert answers[0] == answers[1], target
            assert answers[0].startswith(b"401\n") and b'"message":"invalid API key"' in answers[0], answers[0]


# ------------------------------------------------------------------ undecodable bodies


def _post(target: str, body: bytes, key: str, *extra: str, chunked: bool = False) -> bytes:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = "\r\n".join([f"POST {target} HTTP/1.1", "Host: x", f"Authorization: Bearer {key}",
                        "Content-Type: application/json", framing, *extra]) + "\r\n\r\n"
    return head.encode() + (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if chunked and body else
                            b"0\r\n\r\n" if chunked else body)


@pytest.mark.asyncio
async def test_bodies_that_are_not_utf8_or_not_their_content_encoding_get_400_json(tmp_path: Path) -> None:
    not_utf8 = b'{"type": "custom", "config": {"name": "\xff\xfe"}}'
    key_not_utf8 = b'{"role": "viewer", "name": "\xc3\x28"}'
    cases: list[tuple[str, str, bytes, tuple[str, ...], bool, str]] = [
        ("lean front", "/api/v1/tasks", not_utf8, (), False, "UTF-8"),
        ("aiohttp, chunked", "/api/v1/tasks", not_utf8, (), True, "UTF-8"),
        ("another route", "/api/v1/keys", key_not_utf8, (), False, "UTF-8"),
        ("gzip that is not", "/api/v1/tasks", b"plainly not gzip", ("Content-Encoding: gzip",), False, "gzip"),
        ("deflate that is not", "/api/v1/keys", b"\x00\x01 nor deflate", ("Content-Encoding: deflate",), False,
         "deflate"),
        ("truncated gzip", "/api/v1/tasks", zlib.compress(b'{"type": "custom"}')[:6], ("Content-Encoding: gzip",),
         True, "gzip"),
        ("blob query, gzip that is not", "/api/v1/blobs/missing", b"plainly not gzip", ("Content-Encoding: gzip",),
         False, "gzip"),
        ("blob batch, gzip that is not", "/api/v1/blobs", b"plainly not gzip", ("Content-Encoding: gzip",), False,
         "gzip"),
    ]
    async with run_cluster(tmp_path, workers=0) as c:
        status, made = await c.request("POST", "/api/v1/keys", json={"role": "submitter", "allow_code": True})
        assert status == 201, made
        for what, target, body, extra, chunked, names in cases:
            reader, writer = await asyncio.open_connection(*_addr(c))
            key = made["key"] if target.startswith("/api/v1/blobs") else c.admin_key  # may ship code
            try:
                writer.write(_post(target, body, key, *extra, chunked=chunked))
                status, headers, answer = await asyncio.wait_for(_read_response(reader), 10)
            finally:
                writer.close()
            assert status == 400, (what, status, answer)
            assert headers["content-type"] == "application/json; charset=utf-8", what
            doc: dict[str, Any] = json.loads(answer)
            assert doc["error"] == "ValidationError" and doc["errors"][0]["field"] == "(body)", (what, doc)
            assert names in doc["message"], (what, doc)
        status, _ = await c.request("GET", "/api/v1/tasks")
        assert status == 200  # and the coordinator serves on


@pytest.mark.asyncio
async def test_a_compressed_body_that_no_handler_reads_is_never_an_unhandled_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A body that is not what its ``Content-Encoding`` says, on a request answered without
    reading it (refused credentials, an unknown task, a dashboard sign-in without a form): the
    answer is the route's own, the connection ends after it, and nothing is logged as an
    error. aiohttp used to read such a body after the answer and log the decoding error with its
    traceback, for anyone, credentials or not."""
    cases = [("anonymous", "/api/v1/keys", "not-a-key", 401), ("unknown task", "/api/v1/tasks/nope/cancel", None, 404),
             ("dashboard sign-in", "/dashboard/login", None, 401)]
    async with run_cluster(tmp_path, workers=0, dashboard=True) as c:
        with caplog.at_level(logging.ERROR):
            for what, target, key, want in cases:
                reader, writer = await asyncio.open_connection(*_addr(c))
                try:
                    writer.write(_post(target, b"plainly not gzip", key or c.admin_key, "Content-Encoding: gzip"))
                    status, headers, _ = await asyncio.wait_for(_read_response(reader), 10)
                    assert (status, headers.get("connection")) == (want, "close"), what
                    assert await asyncio.wait_for(reader.read(), 10) == b"", what  # closed after the answer
                finally:
                    writer.close()
            await asyncio.sleep(0.2)  # what aiohttp would have logged after the answer
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, errors
