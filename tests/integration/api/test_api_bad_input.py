"""REST inputs found by fuzzing (tests/fuzz) that used to get a 500, a dropped store or a
non-JSON answer, against a real coordinator on a DuckDB file."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from distributed_testing.protocol import messages as m
from distributed_testing.testing import Cluster, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, workers=0, db_path=str(tmp_path / "c.duckdb"), max_frame_bytes=4096) as c:
        yield c


async def raw(c: Cluster, method: str, path: str, data: bytes | None = None) -> tuple[int, str, Any]:
    headers = {"Authorization": f"Bearer {c.admin_key}"}
    async with c.http.request(method, c.base_url + path, data=data, headers=headers) as r:
        return r.status, r.content_type, msgspec.json.decode(await r.read())  # strict JSON


@pytest.mark.parametrize(("path", "body"), [
    ("/api/v1/tasks", b'{"type": [], "config": {"name": "noop"}}'),  # was TypeError: unhashable list
    ("/api/v1/tasks", b"[" * 3000),  # was RecursionError
    ("/api/v1/keys", b"[" * 3000),
    ("/api/v1/tasks", b'{"type":"custom","config":{"name":"x","parameters":{"n":123456789012345678901234567890}}}'),
    ("/api/v1/keys", b'{"role": "viewer", "expires_in_s": 1' + b"0" * 400 + b"}"),  # was OverflowError
    ("/api/v1/keys", b'{"role": "viewer", "expires_in_s": NaN}'),
])
async def test_bad_bodies_are_400_json(cluster: Cluster, path: str, body: bytes) -> None:
    status, ctype, doc = await raw(cluster, "POST", path, body)
    assert (status, ctype, doc["error"]) == (400, "application/json", "ValidationError"), doc
    assert cluster.runtime.state.tasks == {}
    await cluster.runtime.store.checkpoint()  # nothing unstorable reached the store


@pytest.mark.parametrize("query", ["offset=9223372036854775708", "limit=99999999999999999999", "batch_size=1" + "0" * 30,
                                   "limit=-1"])
async def test_results_filters_beyond_64_bits_are_400(cluster: Cluster, query: str) -> None:
    status, _, doc = await raw(cluster, "GET", f"/api/v1/results?{query}")  # was a 500 StoreError from DuckDB
    assert status == 400 and doc["error"] == "ValidationError", doc


@pytest.mark.parametrize(("query", "field"), [("until=nan", "until"), ("since=-inf", "since"), ("colour=red", "colour"),
                                              ("batch_size=eight", "batch_size")])
async def test_results_filters_are_named_when_bad(cluster: Cluster, query: str, field: str) -> None:
    # NaN was accepted before, and DuckDB and PostgreSQL order it above every number where Python
    # compares it false: until=nan matched every result in SQL and none in memory.
    status, _, doc = await raw(cluster, "GET", f"/api/v1/results?{query}")
    assert status == 400 and doc["error"] == "ValidationError", doc
    assert field in str(doc), doc


@pytest.mark.parametrize(("path", "field", "allowed"), [
    ("/api/v1/results?status=succeded", "status", "'succeeded', 'timed_out'"),
    ("/api/v1/tasks?state=finished", "state", "'pending', 'running'"),
])
async def test_a_mistyped_state_filter_is_400_saying_what_it_may_be(cluster: Cluster, path: str, field: str,
                                                                    allowed: str) -> None:
    # dt results --status succeded answered an empty table (exit 0), as if nothing had succeeded
    status, _, doc = await raw(cluster, "GET", path)
    assert status == 400 and doc["errors"][0]["field"] == field, doc
    assert "must be one of" in doc["errors"][0]["error"] and allowed in doc["errors"][0]["error"], doc
    status, _, doc = await raw(cluster, "GET", path.split("=")[0] + "=cancelled")
    assert status == 200, doc


@pytest.mark.parametrize(("method", "path", "data", "status", "error"), [
    ("GET", "/api/v1/nothing-here", None, 404, "NotFound"),
    ("PUT", "/api/v1/tasks", None, 405, "MethodNotAllowed"),
    ("POST", "/api/v1/tasks", b"[" + b" " * 5000 + b"]", 413, "RequestEntityTooLarge"),
    ("GET", "/ws/worker", None, 400, "BadRequest"),  # a worker key, but no WebSocket upgrade
])
async def test_aiohttp_errors_are_json_too(cluster: Cluster, method: str, path: str, data: bytes | None, status: int,
                                           error: str) -> None:
    key = await cluster.create_key("worker") if path == "/ws/worker" else cluster.admin_key
    headers = {"Authorization": f"Bearer {key}"}
    async with cluster.http.request(method, cluster.base_url + path, data=data, headers=headers) as r:
        assert (r.status, r.content_type) == (status, "application/json"), await r.text()
        doc = json.loads(await r.read())
        assert doc["error"] == error and doc["message"], doc
        if status == 405:
            assert "POST" in r.headers["Allow"]


async def test_responses_stay_strict_json_whatever_a_worker_reports(cluster: Cluster) -> None:
    async with raw_worker(cluster.base_url, await cluster.create_key("worker"), "odd", autoping=False) as (ws, _):
        ch = ws._dt_channel  # type: ignore[attr-defined]
        hb = m.Heartbeat(state="ready", running=[], cpu_percent=float("nan"), memory_percent=float("inf"), free_slots=1)
        await ws.send_bytes(ch.seal(hb, time.time()))
        await wait_for(lambda: cluster.runtime.state.workers["odd"].load.get("memory_percent") == float("inf"),
                       what="the heartbeat")
        status, _, doc = await raw(cluster, "GET", "/api/v1/workers")  # json.dumps wrote NaN and Infinity
        assert status == 200
        assert doc["workers"][0]["load"] == {"cpu_percent": None, "memory_percent": None}
