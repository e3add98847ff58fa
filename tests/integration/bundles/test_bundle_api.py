"""Bundles through a real coordinator: upload only what is missing, digests checked on arrival,
caps answered 413 naming the largest files, one copy per blob, the --allow-code gate on every
upload route and on submit, retention, and placement on --accept-bundles workers only."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.bundles.upload import UploadError, upload_with_stats
from distributed_testing.testing import Cluster, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


async def upload(c: Cluster, key: str, root: Path):  # type: ignore[no-untyped-def]
    return await asyncio.to_thread(upload_with_stats, c.base_url, key, root)


async def raw(c: Cluster, method: str, path: str, key: str, body: bytes = b"") -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with c.http.request(method, c.base_url + path, data=body, headers=headers) as r:
        return r.status, await r.read()


async def test_only_missing_blobs_are_uploaded_and_stored_once(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        key = await c.create_key("submitter", allow_code=True)
        tree = make_tree(tmp_path / "t", {f"pkg/m{i}.py": f"X = {i}\n" for i in range(20)} | {"same1.txt": "dup",
                                                                                             "same2.txt": "dup"})
        cold = await upload(c, key, tree)
        assert (cold.files, cold.blobs_sent) == (22, 21)  # two files, one blob
        assert cold.bytes_sent == cold.total_bytes - 3
        again = await upload(c, key, tree)
        assert (again.digest, again.blobs_sent, again.bytes_sent) == (cold.digest, 0, 0)
        (tree / "pkg" / "m3.py").write_text("X = 'changed'\n")
        one = await upload(c, key, tree)
        assert (one.blobs_sent, one.bytes_sent) == (1, len("X = 'changed'\n"))
        assert one.digest != cold.digest
        status, data = await raw(c, "GET", f"/api/v1/bundles/{one.digest}", key)  # its uploader reads it back
        assert status == 200 and {f.path for f in mf.decode(data).files} >= {"pkg/m3.py", "same2.txt"}
        d = hashlib.sha256(b"X = 'changed'\n").hexdigest()
        assert await raw(c, "GET", f"/api/v1/blobs/{d}", key) == (200, b"X = 'changed'\n")


async def test_blobs_live_beside_a_duckdb_store_once_each_even_when_uploaded_at_once(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, db_path=str(tmp_path / "coord.duckdb")) as c:
        key = await c.create_key("submitter", allow_code=True)
        data = b"payload" * 1000
        d = hashlib.sha256(data).hexdigest()
        answers = await asyncio.gather(*(raw(c, "PUT", f"/api/v1/blobs/{d}", key, data) for _ in range(8)))
        assert sorted(s for s, _ in answers)[-1] in (200, 201) and {s for s, _ in answers} <= {200, 201}
        stored = [p for p in (tmp_path / "coord.duckdb.blobs").glob("??/*") if p.is_file()]
        assert [p.name for p in stored] == [d] and stored[0].read_bytes() == data
        assert await c.runtime.blobs.usage(key.split("_")[1]) == len(data)  # held once, counted once


def records(*blobs: tuple[str, bytes]) -> bytes:
    return b"".join(d.encode() + len(b).to_bytes(8, "big") + b for d, b in blobs)


async def test_a_batch_of_blobs_is_stored_all_or_none_each_digest_checked(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, db_path=str(tmp_path / "coord.duckdb")) as c:
        key = await c.create_key("submitter", allow_code=True)
        good = [(hashlib.sha256(b).hexdigest(), b) for b in (b"one", b"two", b"")]
        status, body = await raw(c, "POST", "/api/v1/blobs", key, records(*good[:1], ("0" * 64, b"liar"), *good[1:]))
        assert status == 400 and b"0" * 64 in body
        assert await c.runtime.blobs.missing([d for d, _ in good]) == [d for d, _ in good]  # none stored
        status, body = await raw(c, "POST", "/api/v1/blobs", key, records(*good)[:-3])
        assert status == 400 and b"record at byte" in body
        status, body = await raw(c, "POST", "/api/v1/blobs", key, records(*good, good[0]))
        assert status == 200 and json.loads(body) == {"stored": 4, "created": 3}
        assert await c.runtime.blobs.missing([d for d, _ in good]) == []
        assert all((tmp_path / "coord.duckdb.blobs" / d[:2] / d).read_bytes() == b for d, b in good)
        status, body = await raw(c, "POST", "/api/v1/blobs", key, records(*good))
        assert status == 200 and json.loads(body)["created"] == 0


async def test_a_digest_mismatch_is_400_and_a_bad_manifest_names_what_is_wrong(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("submitter", allow_code=True)
        status, body = await raw(c, "PUT", f"/api/v1/blobs/{'0' * 64}", key, b"not that")
        assert status == 400 and b"SHA-256" in body
        missing = hashlib.sha256(b"never sent").hexdigest()
        m = mf.encode(mf.Manifest([mf.FileEntry("a.py", missing, 10)]))
        status, body = await raw(c, "PUT", f"/api/v1/bundles/{hashlib.sha256(m).hexdigest()}", key, m)
        assert status == 400 and missing.encode() in body and b"a.py" in body
        bad = mf.encode(mf.Manifest([mf.FileEntry("../etc/passwd", missing, 10)]))
        status, body = await raw(c, "PUT", f"/api/v1/bundles/{hashlib.sha256(bad).hexdigest()}", key, bad)
        assert status == 400 and b"relative" in body


async def test_caps_answer_413_naming_the_largest_files(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=0, max_bundle_mb=0.05, max_bundle_file_mb=0.04) as c:
        key = await c.create_key("submitter", allow_code=True)
        tree = make_tree(tmp_path / "t", {"big.bin": "x" * 30_000, "big2.bin": "y" * 30_000, "small.py": "1"})
        with pytest.raises(UploadError) as info:
            await upload(c, key, tree)
        assert info.value.status == 413 and "big.bin" in str(info.value) and "--max-bundle-mb" in str(info.value)
        (tree / "big2.bin").unlink()
        (tree / "big.bin").write_text("z" * 50_000)
        with pytest.raises(UploadError) as info:
            await upload(c, key, tree)
        assert info.value.status == 413 and "--max-bundle-file-mb" in str(info.value)


async def test_only_an_allow_code_key_may_upload_or_submit_a_bundle(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        code_key = await c.create_key("submitter", allow_code=True)
        digest = (await upload(c, code_key, make_tree(tmp_path / "t", {"test_x.py": "def test_x(): pass\n"}))).digest
        blob = hashlib.sha256(b"def test_x(): pass\n").hexdigest()
        plain = await c.create_key("submitter")
        keys = {"plain submitter": plain, "viewer": await c.create_key("viewer"), "worker": await c.create_key("worker"),
                "admin without --allow-code": c.admin_key}
        for who, key in keys.items():
            for method, path, body in (("POST", "/api/v1/blobs/missing", b'{"digests": []}'),
                                       ("PUT", f"/api/v1/blobs/{blob}", b"def test_x(): pass\n"),
                                       ("PUT", f"/api/v1/bundles/{digest}", b"{}")):
                status, answer = await raw(c, method, path, key, body)
                assert status == 403, (who, path, answer)
            status, answer = await c.request("POST", "/api/v1/tasks", key=key, json={
                "type": "test", "config": {"test_file": "test_x.py"}, "bundle": digest})
            assert status == 403, (who, answer)
        assert (await raw(c, "PUT", f"/api/v1/blobs/{blob}", ""))[0] == 401
        assert (await raw(c, "GET", f"/api/v1/blobs/{blob}", keys["viewer"]))[0] == 403
        status, answer = await c.request("POST", "/api/v1/tasks", key=plain, json={
            "type": "test", "config": {"test_file": "test_x.py"}, "bundle": digest})
        assert "--allow-code" in answer["message"]
        status, answer = await c.request("POST", "/api/v1/keys", json={"role": "viewer", "allow_code": True})
        assert status == 400 and "allow_code" in str(answer)
        status, answer = await c.request("POST", "/api/v1/tasks", key=code_key, json={
            "type": "test", "config": {"test_file": "test_x.py"}, "bundle": "ab" * 32})
        assert status == 400 and "not uploaded" in str(answer)


async def test_what_a_task_names_in_its_bundle_must_be_there_at_submit(tmp_path: Path) -> None:
    """A test file or a handler's module the bundle lacks is a 400 naming the field, for the whole
    submission (nothing of it accepted), not a task that fails on a worker later."""
    async with run_cluster(tmp_path / "c", workers=0) as c:
        key = await c.create_key("submitter", allow_code=True)
        tree = {"tests/test_a.py": "def test_a(): pass\n", "tools/check.py": "def run(p, ctx): return {}\n",
                "probe.py": ""}
        digest = (await upload(c, key, make_tree(tmp_path / "t", tree))).digest
        good = [{"type": "test", "config": {"test_file": f}, "bundle": digest}
                for f in ("tests/test_a.py", "tests/test_a.py::test_a", "tests", "tests/", ".")]
        good += [{"type": "custom", "config": {"name": n}, "bundle": digest} for n in ("tools.check:run", "probe:run")]
        bad = [{"type": "test", "config": {"test_file": "tests/test_b.py::test_b"}, "bundle": digest},
               {"type": "custom", "config": {"name": "noop"}, "bundle": digest},
               {"type": "custom", "config": {"name": "os:system"}, "bundle": digest}]
        status, body = await c.request("POST", "/api/v1/tasks", key=key, json=[*good, *bad])
        assert status == 400, body
        errors = {e["field"]: e["error"] for e in body["errors"]}
        n = len(good)
        assert set(errors) == {f"[{n}].config.test_file", f"[{n + 1}].config.name", f"[{n + 2}].config.name"}
        assert errors[f"[{n}].config.test_file"] == ("'tests/test_b.py' is not in the bundle (3 file(s); its test "
                                                     "files: tests/test_a.py)")
        assert "names its handler as 'module:function'" in errors[f"[{n + 1}].config.name"]
        assert "module 'os' is not in the bundle (its top-level modules: probe, tests, tools)" in errors[f"[{n + 2}].config.name"]
        status, body = await c.request("POST", "/api/v1/tasks", key=key, json=bad[0])
        assert status == 400 and body["errors"][0]["field"] == "config.test_file"
        assert (await c.request("GET", "/api/v1/tasks"))[1]["tasks"] == []
        assert len(await c.submit(good, key=key)) == n


async def test_a_bundle_task_waits_for_an_accept_bundles_worker_and_says_so(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=1) as c:
        key = await c.create_key("submitter", allow_code=True)
        digest = (await upload(c, key, make_tree(tmp_path / "t", {"test_x.py": "def test_x(): pass\n"}))).digest
        [tid] = await c.submit({"type": "test", "config": {"test_file": "test_x.py"}, "bundle": digest}, key=key)

        async def reason() -> str:
            return str((await c.request("GET", f"/api/v1/tasks/{tid}"))[1].get("pending_reason") or "")
        await asyncio.sleep(0)
        text = ""
        for _ in range(50):
            text = await reason()
            if "--accept-bundles" in text:
                break
            await asyncio.sleep(0.1)
        assert "--accept-bundles" in text and "w0" in text


@pytest.mark.slow
async def test_retention_deletes_unused_blobs_and_keeps_those_of_unfinished_tasks(tmp_path: Path) -> None:
    async with run_cluster(tmp_path / "c", workers=0, bundle_retention_s=1.0) as c:
        key = await c.create_key("submitter", allow_code=True)
        kept = (await upload(c, key, make_tree(tmp_path / "kept", {"test_k.py": "K = 1\n"}))).digest
        await c.submit({"type": "test", "config": {"test_file": "test_k.py"}, "bundle": kept}, key=key)
        gone = (await upload(c, key, make_tree(tmp_path / "gone", {"test_g.py": "G = 1\n"}))).digest
        blobs = c.runtime.blobs
        await wait_for(lambda: gone not in getattr(blobs, "blobs", {}), timeout=20, what="the unused bundle to go")
        assert kept in getattr(blobs, "blobs", {})
        assert hashlib.sha256(b"K = 1\n").hexdigest() in getattr(blobs, "blobs", {})


async def test_on_postgresql_the_blobs_live_in_the_database(pg_url: str) -> None:
    """Every HA member reads the same table; concurrent stores of one digest keep one row."""
    from distributed_testing.coordinator.store.blobs import OverQuota
    from distributed_testing.coordinator.store.pgblobs import PgBlobs
    from distributed_testing.coordinator.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    try:
        blobs, other = PgBlobs(store), PgBlobs(store)
        data = b"A = 1\n"
        d = hashlib.sha256(data).hexdigest()
        created = await asyncio.gather(*(b.put(d, data, 100.0) for b in (blobs, other) for _ in range(4)))
        assert created.count(True) == 1
        assert await other.get(d) == data and await other.missing([d, "0" * 64]) == ["0" * 64]
        assert await blobs.put(d, data, 100.0, "k1", limit=10, bundle=True) is False  # held by k1 now, as a bundle
        with pytest.raises(OverQuota):  # 6 bytes held, 6 more would pass 10
            await other.put_many([(hashlib.sha256(b"B = 2\n").hexdigest(), b"B = 2\n")], 100.0, "k1", limit=10)
        assert (await other.usage("k1"), await other.holders(d), await other.missing([d], "k2")) == (6, {"k1": True}, [d])
        assert await other.sizes([d, "0" * 64], "k1") == {d: 6}
        await blobs.touch([d], 200.0)
        assert await other.sweep(150.0) == 0 and await other.sweep(250.0) == 1
        assert await blobs.get(d) is None and await blobs.holders(d) == {} and await blobs.usage("k1") == 0
    finally:
        await store.close()


async def test_on_postgresql_a_batch_is_one_upsert(pg_url: str) -> None:
    from distributed_testing.coordinator.store.pgblobs import PgBlobs
    from distributed_testing.coordinator.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    try:
        blobs = PgBlobs(store)
        items = [(hashlib.sha256(b).hexdigest(), b) for b in (b"a", b"b")]
        assert await blobs.put_many(items, 100.0) == 2
        assert await blobs.put_many(items, 200.0) == 0
        assert await blobs.get(items[1][0]) == b"b" and await blobs.sweep(150.0) == 0
    finally:
        await store.close()
