"""Each test's ``-v`` line comes as soon as the test ends on its worker, while its chunk's task
still runs, and exactly once: a real coordinator, a real worker serving the run's chunks from a
pytest session, and the plugin in a pytest process of its own. A chunk's second test waits for a
file this test creates only once it has read the first test's line from the plugin's output; a
live stream cut mid-run (the reports route failing) loses and repeats no test; a worker's
``reports`` for a task it does not hold, or for one that no pytest session serves, are refused;
past the bound on all attempts' kept tests they are dropped; a worker key may not read the route."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.protocol import messages as m
from distributed_testing.testing import next_message, raw_worker, run_cluster
from distributed_testing.testing.suites import plugin_args

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


def _suite(root: Path, second: str) -> None:
    """Nine tests: ``test_1``'s body is ``second``; ``test_3`` fails, ``test_5`` is skipped."""
    body = ["import pathlib, time\n\nimport pytest\n", "def test_0():\n    pass\n",
            f"def test_1():\n{second}\n", "def test_2():\n    pass\n",
            "def test_3():\n    assert 6 * 7 == 43\n", "def test_4():\n    pass\n",
            "@pytest.mark.skip(reason='not today')\ndef test_5():\n    pass\n"]
    body += [f"def test_{i}():\n    pass\n" for i in range(6, 9)]
    root.mkdir()
    (root / "test_live.py").write_text("\n\n".join(body))


async def _plugin(root: Path, url: str, key: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-v", "--rootdir", str(root),
        "--dt-coordinator", url, "--dt-no-env", str(root), cwd=root, env={**os.environ, "DT_API_KEY": key},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


def _test_lines(out: str) -> dict[str, list[str]]:
    """Each test's ``-v`` outcome lines (``[w1] [ 11%] PASSED test_live.py::test_0``)."""
    lines: dict[str, list[str]] = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 2 and words[-2] in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::test_" in words[-1]:
            lines.setdefault(words[-1], []).append(words[-2])
    return lines


def _exactly_once(out: str) -> None:
    lines = _test_lines(out)
    want = {f"test_live.py::test_{i}": ["FAILED" if i == 3 else "SKIPPED" if i == 5 else "PASSED"] for i in range(9)}
    assert lines == want, out
    assert "1 failed, 7 passed, 1 skipped" in out, out


async def test_a_tests_line_comes_while_its_chunk_still_runs(tmp_path: Path) -> None:
    go = tmp_path / "go"
    suite = tmp_path / "suite"
    _suite(suite, f"    go = pathlib.Path({str(go)!r})\n    for _ in range(1200):\n        if go.exists():\n"
                  "            return\n        time.sleep(0.05)\n    raise AssertionError('test_0 was not reported live')")
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", accept_bundles=True, sandbox="none")
        key = await c.create_key("submitter", allow_code=True)
        proc = await _plugin(suite, c.base_url, key)
        assert proc.stdout is not None
        read = ""
        while "PASSED test_live.py::test_0" not in read:  # the line ends when the next one starts, as xdist's
            more = (await proc.stdout.read(4096)).decode()
            assert more, read
            read += more
        go.touch()  # test_1, in test_0's chunk, has waited for this: the chunk was running
        out = read + (await proc.stdout.read()).decode()
        code = await proc.wait()
        tasks = (await c.request("GET", "/api/v1/tasks"))[1]["tasks"]
        configs = [(await c.request("GET", f"/api/v1/tasks/{t['task_id']}"))[1]["spec"]["config"]
                   for t in tasks if t["task_id"].startswith("pytest-")]
        chunks = [[cfg["test_file"], *cfg.get("tests", [])] for cfg in configs]
    assert code == 1, out
    _exactly_once(out)
    assert any({"test_live.py::test_0", "test_live.py::test_1"} <= set(tests) for tests in chunks), chunks
    assert "[w1] [ 11%] PASSED test_live.py::test_0" in read, read  # the worker named, as xdist's [gw0]


async def test_a_live_stream_cut_mid_run_loses_and_repeats_no_test(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    _suite(suite, "    time.sleep(1.5)")  # test_0's report is streamed and read meanwhile
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", accept_bundles=True, sandbox="none")
        key = await c.create_key("submitter", allow_code=True)
        real = c.runtime.reports.get
        served: list[str] = []

        def cut(task_id: str) -> Any:  # the route fails (HTTP 500) once it served a test
            if served:
                raise RuntimeError("the live stream is cut")
            kept = real(task_id)
            if kept is not None and kept.tests:
                served.append(task_id)
            return kept

        c.runtime.reports.get = cut  # type: ignore[method-assign]
        proc = await _plugin(suite, c.base_url, key)
        out = (await proc.communicate())[0].decode()
    assert proc.returncode == 1, out
    assert served, out  # a test came live before the cut
    _exactly_once(out)


RERUN_CONFTEST = """
import pytest
from _pytest.runner import runtestprotocol


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):  # pytest-rerunfailures' way, once: a start per run
    for last in (False, True):
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        failed = next((r for r in reports if r.failed), None)
        for r in reports:
            if r is failed and not last:
                r.outcome = "rerun"
                item.ihook.pytest_runtest_logreport(report=r)
                break
            item.ihook.pytest_runtest_logreport(report=r)
        if failed is None or last:
            break
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
"""


async def test_a_test_rerun_in_its_chunk_is_reported_once_with_its_final_outcome(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(RERUN_CONFTEST)
    body = ["import time\n", "def test_1():\n    time.sleep(1.5)\n    assert 6 * 7 == 43\n", "def test_2():\n    time.sleep(1.5)\n"]
    body += [f"def test_{i}():\n    pass\n" for i in range(24) if i not in (1, 2)]  # chunks of three: 0-2, ...
    # each run of test_1 and test_2 lasts longer than a flush (worker) and a page (plugin): each test's
    # entry is read live on its own, before the next one ends
    (suite / "test_live.py").write_text("\n\n".join(body))
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", accept_bundles=True, sandbox="none")
        key = await c.create_key("submitter", allow_code=True)
        real, streamed = c.runtime.reports.put, list[str]()

        def put(task_id: str, attempt: int, tree: str, first: int, tests: list[dict[str, Any]]) -> None:
            streamed.extend(t["nodeid"] for t in tests)
            real(task_id, attempt, tree, first, tests)

        c.runtime.reports.put = put  # type: ignore[method-assign]
        proc = await _plugin(suite, c.base_url, key)
        out = (await proc.communicate())[0].decode()
    assert proc.returncode == 1, out  # the rerun's failure is the run's
    assert _test_lines(out) == {f"test_live.py::test_{i}": ["FAILED" if i == 1 else "PASSED"] for i in range(24)}, out
    assert out.count("RERUN test_live.py::test_1") == 1, out
    assert out.count("_ test_1 _") == 1 and "1 failed, 23 passed, 1 rerun" in out, out
    assert streamed.count("test_live.py::test_1") == 1, streamed  # streamed live once, when it was over


async def test_reports_for_a_task_another_worker_holds_are_refused_and_a_worker_may_not_read_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "t.py").write_text("def test_a():\n    pass\n")
    async with run_cluster(tmp_path, workers=0) as c:
        key_a, key_b = await c.create_key("worker"), await c.create_key("worker")
        async with raw_worker(c.base_url, key_a, "wa", autoping=False, accept_bundles=True) as (a, _), \
                raw_worker(c.base_url, key_b, "wb", autoping=False, accept_bundles=True) as (b, _):
            shipper = await c.create_key("submitter", allow_code=True)
            bundle = await asyncio.to_thread(upload, c.base_url, shipper, tree)
            [tid] = await c.submit({"type": "test", "bundle": bundle, "config": {"test_file": "t.py", "session": "r"}},
                                   key=shipper)
            mine = c.runtime.state.tasks[tid].worker_id == "wa"
            assign = await next_message(a if mine else b, m.AssignTasks)
            holder, other = (a, b) if mine else (b, a)
            ref = m.TaskRef(tid, assign.tasks[0].attempt)
            entry = {"nodeid": "t.py::test_a", "outcome": "passed", "duration_s": 0.0, "message": None,
                     "reports": [{"nodeid": "t.py::test_a", "when": "call", "outcome": "passed"}]}

            async def send(ws: Any, msg: m.Message) -> None:
                await ws.send_bytes(ws._dt_channel.seal(msg, time.time()))

            [plain] = await c.submit({"type": "custom", "config": {"name": "noop"}})  # no session serves it
            plain_ref = m.TaskRef(plain, (await next_message(other, m.AssignTasks)).tasks[0].attempt)
            await send(other, m.TaskReports([m.ReportsChunk(plain_ref, 0, "/tree", [entry])]))
            refused = await next_message(other, m.ErrorMsg)
            assert refused.code == "reports_refused" and "no pytest session serves" in refused.detail, refused
            assert c.runtime.reports.get(plain) is None
            await send(other, m.TaskReports([m.ReportsChunk(ref, 0, "/tree", [entry])]))
            refused = await next_message(other, m.ErrorMsg)
            assert refused.code == "reports_refused" and "another worker" in refused.detail
            await send(holder, m.TaskReports([m.ReportsChunk(m.TaskRef(tid, ref.attempt + 1), 0, "/tree", [entry])]))
            assert (await next_message(holder, m.ErrorMsg)).code == "reports_refused"
            await send(holder, m.TaskReports([m.ReportsChunk(ref, 0, "/tree", [entry])]))
            await send(holder, m.TaskReports([m.ReportsChunk(ref, 0, "/tree", [entry, {**entry, "nodeid": "t.py::b"}])]))
            status, page = await c.request("GET", f"/api/v1/tasks/{tid}/reports", params={"wait": "10"})
            for _ in range(100):  # the second frame is read in its own time
                if page.get("next") == 2:
                    break
                await asyncio.sleep(0.05)
                status, page = await c.request("GET", f"/api/v1/tasks/{tid}/reports")
            assert status == 200 and page["tests"] == [entry, {**entry, "nodeid": "t.py::b"}], page  # a re-send kept once
            assert page["tree"] == "/tree" and page["worker_id"] == ("wa" if mine else "wb") and not page["complete"]
            assert c.runtime.stats["refused_reports"] == 3
            status, page = await c.request("GET", f"/api/v1/tasks/{tid}/reports", params={"after": "1"})
            assert [t["nodeid"] for t in page["tests"]] == ["t.py::b"] and page["next"] == 2

            kept = c.runtime.reports  # the bound on all attempts' kept tests (256 MiB), here no room for one more
            assert kept.bytes == kept.get(tid).bytes > 0  # type: ignore[union-attr]
            kept.total_bytes = kept.bytes + 10
            await send(holder, m.TaskReports([m.ReportsChunk(ref, 2, "/tree", [{**entry, "nodeid": "t.py::c"}])]))
            for _ in range(100):
                if kept.dropped:
                    break
                await asyncio.sleep(0.05)
            assert kept.dropped == 1 and kept.total_bytes - 10 == kept.bytes, kept.dropped
            assert "live test reports dropped" in caplog.text
            status, page = await c.request("GET", f"/api/v1/tasks/{tid}/reports")
            assert page["next"] == 2 and not page["complete"]  # its result will bring it

            status, body = await c.request("GET", f"/api/v1/tasks/{tid}/reports", key=key_a)  # a worker's key
            assert status == 403, body
            status, body = await c.request("GET", f"/api/v1/tasks/{tid}/reports", params={"after": "-1"})
            assert status == 400 and body["errors"][0]["field"] == "after"
            status, body = await c.request("GET", f"/api/v1/tasks/{tid}/reports", params={"follow": "1"})
            assert status == 400 and body["errors"][0]["field"] == "follow"
            status, body = await c.request("GET", f"/api/v1/tasks/{tid}/reports",
                                           params={"follow": "1", "wait": "99", "after": "x", "attempt": "-2"})
            assert status == 400 and [e["field"] for e in body["errors"]] == ["follow", "wait", "after", "attempt"], body
            status, body = await c.request("GET", "/api/v1/tasks/nope/reports")
            assert status == 404
