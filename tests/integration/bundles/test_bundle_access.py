"""Quotas and ownership of bundle blobs (issue 40), on one real ``run_coordinator.py`` process with a
DuckDB file, ``--max-blob-mb-per-key 1`` and ``--max-bundle-mb 5``: uploads stream to disk as they
arrive, a key past its stored bytes gets 413 naming the flag, a manifest's declared sizes must be
its blobs', a manifest stored through ``PUT /blobs`` is no bundle, and blobs and bundles are read
only by the key that uploaded them, admins, and a worker that holds a task naming them."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.protocol import messages as m
from distributed_testing.testing import Procs, Rest, next_message, raw_worker, start_coordinator_process, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
KIB = 1024


@dataclass
class Coordinator:
    base: str
    port: int
    admin: Rest
    blobs: Path  # the DuckDB store's blob directory

    def key(self, role: str = "submitter", allow_code: bool = True) -> str:
        body = {"role": role, **({"allow_code": True} if allow_code else {})}
        return str(self.admin.ok("POST", "/api/v1/keys", json=body)["key"])

    def call(self, method: str, path: str, key: str, body: Any = b"", **headers: str) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = json.dumps(body).encode() if not isinstance(body, bytes | list) else body
            conn.request(method, path, body=data, headers={"Authorization": f"Bearer {key}", **headers},
                         encode_chunked=isinstance(body, list))
            r = conn.getresponse()
            raw = r.read()
            return r.status, json.loads(raw) if r.getheader("Content-Type", "").startswith("application/json") else raw
        finally:
            conn.close()

    def put_blob(self, key: str, data: bytes) -> tuple[int, Any]:
        return self.call("PUT", f"/api/v1/blobs/{hashlib.sha256(data).hexdigest()}", key, data)

    def put_bundle(self, key: str, files: dict[str, bytes],
                   declared: dict[str, int] | None = None) -> tuple[str, tuple[int, Any]]:
        """Upload ``files`` and their manifest (sizes as ``declared`` where given); (digest, answer)."""
        for data in files.values():
            assert self.put_blob(key, data)[0] in (200, 201)
        sizes = {p: len(b) for p, b in files.items()} | (declared or {})
        body = mf.encode(mf.Manifest([mf.FileEntry(p, hashlib.sha256(b).hexdigest(), sizes[p])
                                      for p, b in files.items()]))
        d = hashlib.sha256(body).hexdigest()
        return d, self.call("PUT", f"/api/v1/bundles/{d}", key, body)


@pytest.fixture(scope="module")
def coord(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    tmp = tmp_path_factory.mktemp("access")
    procs = Procs(tmp, cwd=ROOT)
    try:
        _p, port = start_coordinator_process(procs, tmp / "c.duckdb", args=[
            "--max-blob-mb-per-key", "1", "--max-bundle-mb", "5"])
        base = f"http://127.0.0.1:{port}"
        yield Coordinator(base, port, Rest(base, (tmp / "admin.key").read_text().strip()), tmp / "c.duckdb.blobs")
    finally:
        procs.close()


def test_an_upload_is_written_to_disk_as_it_arrives(coord: Coordinator) -> None:
    """Before, a blob was read whole into memory (eight 99 MB uploads at once: 178 -> 1,310 MiB)."""
    key = coord.key()
    data = os.urandom(900 * KIB)
    d = hashlib.sha256(data).hexdigest()
    with socket.create_connection(("127.0.0.1", coord.port), timeout=30) as sock:
        sock.sendall(f"PUT /api/v1/blobs/{d} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data[:600 * KIB])

        def staged() -> int:
            return sum(p.stat().st_size for p in (coord.blobs / d[:2]).glob(".tmp-*"))
        wait_until(lambda: (coord.blobs / d[:2]).is_dir() and staged() == 600 * KIB, timeout=20,
                   what="the first 600 KiB of the body on disk while the rest is not sent")
        sock.sendall(data[600 * KIB:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]
    assert (coord.blobs / d[:2] / d).read_bytes() == data and not list((coord.blobs / d[:2]).glob(".tmp-*"))


def test_a_key_past_its_stored_bytes_gets_413_naming_the_flag(coord: Coordinator) -> None:
    """Before, blobs counted against no quota: a key with a 1 MiB payload quota stored 121 MB."""
    key, other = coord.key(), coord.key()
    first, second = os.urandom(600 * KIB), os.urandom(600 * KIB)
    assert coord.put_blob(key, first)[0] == 201
    status, body = coord.put_blob(key, second)  # declared length: refused before the body is read
    assert status == 413 and "--max-blob-mb-per-key" in str(body) and "holds 0.6 MiB" in str(body)
    d = hashlib.sha256(second).hexdigest()
    status, body = coord.call("PUT", f"/api/v1/blobs/{d}", key, [second[:300 * KIB], second[300 * KIB:]])
    assert status == 413 and "--max-blob-mb-per-key" in str(body)  # chunked: refused as it is stored
    batch = d.encode() + len(second).to_bytes(8, "big") + second
    status, body = coord.call("POST", "/api/v1/blobs", key, batch)
    assert status == 413 and "--max-blob-mb-per-key" in str(body)
    assert coord.put_blob(key, first)[0] == 200  # what it holds already costs nothing more
    assert coord.put_blob(other, first)[0] == 200  # another key: stored once already, now held (and counted) by both
    status, body = coord.put_blob(other, second)
    assert status == 413 and "holds 0.6 MiB" in str(body)


def test_a_manifest_must_declare_its_blobs_sizes(coord: Coordinator) -> None:
    """Before, a manifest declaring 180 bytes under a 5 MiB --max-bundle-mb expanded to 99.6 MB."""
    key = coord.key()
    _d, (status, body) = coord.put_bundle(key, {"big.bin": b"y" * 5000, "ok.py": b"X = 1\n"}, {"big.bin": 10})
    assert status == 400 and body["errors"] == [{"field": "manifest.files[big.bin].size", "error": (
        f"declares 10 bytes; its blob {hashlib.sha256(b'y' * 5000).hexdigest()} has 5000")}]


def test_a_task_names_only_a_bundle_the_manifest_route_accepted_for_its_key(coord: Coordinator) -> None:
    """Before, a manifest stored through PUT /blobs (none of the manifest route's checks) was
    accepted as a task's bundle, and so was another key's bundle."""
    key, thief = coord.key(), coord.key()
    test = b"def test_x(): pass\n"
    assert coord.put_blob(key, test)[0] == 201
    manifest = mf.encode(mf.Manifest([mf.FileEntry("test_x.py", hashlib.sha256(test).hexdigest(), 1)]))  # lies
    assert coord.put_blob(key, manifest)[0] == 201
    task = {"type": "test", "config": {"test_file": "test_x.py"}, "bundle": hashlib.sha256(manifest).hexdigest(),
            "requirements": {"tags": ["nowhere"]}}
    status, body = coord.call("POST", "/api/v1/tasks", key, task)
    assert status == 400 and "not uploaded by this key through PUT /api/v1/bundles" in str(body)
    d, (status, _) = coord.put_bundle(key, {"test_x.py": test})
    assert status == 201
    assert coord.call("POST", "/api/v1/tasks", key, {**task, "bundle": d})[0] == 201
    status, body = coord.call("POST", "/api/v1/tasks", thief, {**task, "bundle": d})
    assert status == 400 and "not uploaded by this key" in str(body)
    assert coord.call("POST", "/api/v1/tasks", coord.admin.key, {**task, "bundle": d})[0] == 403  # no --allow-code


@pytest.mark.asyncio
async def test_blobs_are_read_by_their_uploader_admins_and_the_workers_running_them(coord: Coordinator) -> None:
    """Before, any submitter key (even without --allow-code) and any worker key read every blob."""
    owner = coord.key()
    code = b"def run(params, ctx):\n    return {}\n"
    blob = hashlib.sha256(code).hexdigest()
    d, (status, _) = coord.put_bundle(owner, {"probe.py": code})
    assert status == 201
    reads = {"blob": f"/api/v1/blobs/{blob}", "bundle": f"/api/v1/bundles/{d}"}
    for path in reads.values():
        assert coord.call("GET", path, owner)[0] == 200
        assert coord.call("GET", path, coord.admin.key)[0] == 200
        assert coord.call("GET", path, coord.key("viewer", allow_code=False))[0] == 403  # the role lacks bundles:read
        for stranger in (coord.key(allow_code=False), coord.key(), coord.key("worker", allow_code=False)):
            status, body = coord.call("GET", path, stranger)
            assert status == 404 and "this key may read" in body["message"]  # as for a digest never stored
    status, body = coord.call("POST", "/api/v1/blobs/missing", coord.key(), {"digests": [blob, d]})
    assert body == {"missing": [blob, d]}  # another key's uploads are neither told of nor reused
    assert coord.call("GET", f"/api/v1/bundles/{blob}", owner)[0] == 404  # a plain blob is no bundle
    worker_key = coord.key("worker", allow_code=False)
    async with raw_worker(coord.base, worker_key, "reader", autoping=False, tags=["reader"],
                          accept_bundles=True) as (ws, _):
        assert coord.call("GET", reads["blob"], worker_key)[0] == 404
        status, body = coord.call("POST", "/api/v1/tasks", owner, {
            "type": "custom", "config": {"name": "probe:run"}, "bundle": d, "requirements": {"tags": ["reader"]}})
        assert status == 201, body
        assign = await next_message(ws, m.AssignTasks)
        assert assign.tasks[0].bundle == d
        assert coord.call("GET", reads["bundle"], worker_key)[0] == 200  # it holds a task naming them
        assert coord.call("GET", reads["blob"], worker_key) == (200, code)
        assert coord.call("GET", reads["blob"], coord.key("worker", allow_code=False))[0] == 404
