"""The plugin's task documents go to the coordinator in requests under its frame limit: a run whose
documents add up past 16 MiB (a suite of 150,000 tests, or test names that hold their data, as
python-multipart's) was refused whole with 413 and no test ran; each request now carries at most
``SUBMIT_BYTES``, and every task of the run is there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distributed_testing.client import ApiClient
from distributed_testing.plugin.fleet import SUBMIT_BYTES, Fleet, submit_batches
from distributed_testing.testing import run_cluster

pytestmark = [pytest.mark.timeout(120)]


def test_batches_keep_the_order_and_stay_under_the_limit() -> None:
    docs = [{"task_id": f"t{i}", "pad": "x" * (i * 10)} for i in range(50)]
    batches = submit_batches(docs, limit=600)
    assert [d for b in batches for d in b] == docs
    assert all(len(b) == 1 or sum(len(str(d)) for d in b) < 700 for b in batches) and len(batches) > 5
    assert submit_batches([{"pad": "y" * 1000}], limit=100) == [[{"pad": "y" * 1000}]]  # one over it goes alone
    assert submit_batches([]) == []


@pytest.mark.asyncio
async def test_a_run_of_more_than_16_mib_of_task_documents_is_submitted_whole(tmp_path: Path) -> None:
    ids = [f"tests/test_data.py::test_{j}_" + "x" * 100 for j in range(30_000)]  # about 3.5 MB a document
    docs = [{"task_id": f"pytest-big-{i}", "type": "test", "config": {"test_file": "tests/test_data.py",
                                                                     "tests": ids}} for i in range(6)]
    assert len(submit_batches(docs)) == 6 and SUBMIT_BYTES < 16 * 1024 * 1024 < sum(len(str(d)) for d in docs)
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("submitter")
        await asyncio.to_thread(Fleet(ApiClient(c.base_url, key)).submit, docs)
        for d in docs:
            status, body = await c.request("GET", f"/api/v1/tasks/{d['task_id']}", key=key)
            assert status == 200 and len(body["spec"]["config"]["tests"]) == 30_000, (status, str(body)[:300])
