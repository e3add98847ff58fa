"""``--max-queued-per-key`` and ``--max-payload-mb-per-key`` (and their DT_* variables) in the real
``run_coordinator.py``: a key past either gets 429 with ``Retry-After`` and may submit again once
its tasks end; other keys keep their own allowance; the defaults leave a big CI submission alone."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.testing import Procs, Rest, start_coordinator_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def queued(i: int, blob: str = "") -> dict[str, Any]:
    return {"task_id": f"q{i}", "type": "custom", "config": {"name": "noop", "parameters": {"i": i, "blob": blob}},
            "requirements": {"tags": ["nowhere"]}}


def post(base: str, key: str, doc: Any) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(base + "/api/v1/tasks", data=json.dumps(doc).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def start(procs: Procs, tmp: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[str, Rest]:
    procs.cwd = ROOT  # the launcher's directory
    _p, port = start_coordinator_process(procs, tmp / "c.duckdb", args=["--db-path", "memory://",
                                         "--admin-key-file", str(tmp / "admin.key"), *args], env=env)
    base = f"http://127.0.0.1:{port}"
    return base, Rest(base, (tmp / "admin.key").read_text().strip())


def test_max_queued_per_key_refuses_with_429_until_tasks_end(procs: Procs, tmp_path: Path) -> None:
    base, admin = start(procs, tmp_path, ["--max-queued-per-key", "3"])
    key = admin.create_key("submitter")
    status, _, body = post(base, key, [queued(i) for i in range(3)])
    assert status == 201, body
    status, headers, body = post(base, key, queued(3))
    assert status == 429 and body["error"] == "RateLimited" and "--max-queued-per-key" in body["message"]
    assert int(headers["Retry-After"]) >= 1
    assert post(base, key, [queued(i) for i in range(3)])[0] == 200  # resubmitting the same three costs nothing
    assert post(base, admin.key, queued(100))[0] == 201  # another key has its own allowance
    admin.ok("POST", "/api/v1/tasks/q0/cancel")  # one task ended frees one place
    assert post(base, key, queued(4))[0] == 201
    status, headers, body = post(base, key, [queued(i) for i in range(10, 14)])  # over the quota by itself
    assert status == 413 and "submit them in parts of at most 3" in str(body) and "Retry-After" not in headers


def test_payload_quota_and_variables(procs: Procs, tmp_path: Path) -> None:
    base, admin = start(procs, tmp_path, [], env={"DT_MAX_PAYLOAD_MB_PER_KEY": "1", "DT_MAX_QUEUED_PER_KEY": "20"})
    key = admin.create_key("submitter")
    blob = "x" * 400_000
    assert post(base, key, [queued(0, blob), queued(1, blob)])[0] == 201
    status, headers, body = post(base, key, queued(2, blob))
    assert status == 429 and "--max-payload-mb-per-key" in body["message"] and headers.get("Retry-After")
    assert post(base, key, [queued(10 + i) for i in range(17)])[0] == 201  # 19 tasks: under the task quota
    status, _, body = post(base, key, [queued(200), queued(201)])
    assert status == 429 and "--max-queued-per-key" in body["message"]
    status, _, body = post(base, admin.key, [queued(300 + i, blob) for i in range(3)])  # 1.2 MB > 1 MiB by itself
    assert status == 413 and "--max-payload-mb-per-key" in str(body)


def test_the_defaults_take_a_big_ci_submission_and_weigh_tiny_objects_by_their_memory(procs: Procs,
                                                                                      tmp_path: Path) -> None:
    """A spec's payload is what it costs in memory, not its JSON bytes (issue 40: 63 MiB of
    ``[{}, {}, ...]`` took a coordinator from 179 MiB to 3.4 GiB under the default quota)."""
    base, admin = start(procs, tmp_path, [])
    key = admin.create_key("submitter")
    status, _, body = post(base, key, [queued(i, "y" * 1000) for i in range(2000)])
    assert status == 201 and len(body["tasks"]) == 2000
    tiny = [{"type": "custom", "config": {"name": "noop", "parameters": {"p": [{}] * 100_000}},
             "requirements": {"tags": ["nowhere"]}, "task_id": f"tiny{i}"} for i in range(4)]
    tiny_key = admin.create_key("submitter")
    assert post(base, tiny_key, tiny[:3])[0] == 201  # 300 KB of JSON, about 58 MiB in memory
    status, headers, body = post(base, tiny_key, tiny[3])
    assert status == 429 and "--max-payload-mb-per-key" in body["message"] and headers.get("Retry-After")
    status, _, body = post(base, admin.key, {**tiny[0], "task_id": "huge", "config": {
        "name": "noop", "parameters": {"p": [{}] * 400_000}}})  # 1.2 MB of JSON, about 74 MiB in memory
    assert status == 413 and "by itself" in str(body) and "--max-payload-mb-per-key" in str(body)


@pytest.mark.parametrize("flag", ["--max-queued-per-key", "--max-payload-mb-per-key", "--max-blob-mb-per-key"])
def test_a_negative_quota_is_refused_at_start(flag: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "run_coordinator.py"), "--db-path", "memory://", flag, "-1"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and flag in out.stderr
