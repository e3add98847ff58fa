"""Adding a task kind touches the registry and one executor module: an ``echo`` kind, declared
in ``echo_kind.py`` and installed in a temporary registry, is validated at submit, published in
the schema, placed by its implied hardware and run end to end by a real coordinator and worker."""

import pytest
from echo_kind import ECHO

from distributed_testing.tasks import kinds
from distributed_testing.testing import run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_a_new_kind_runs_end_to_end_from_a_temporary_registry(tmp_path):
    with kinds.installed(kinds.BUILTIN.with_kind(ECHO)):
        async with run_cluster(tmp_path, workers=1) as c:
            [tid] = await c.submit({"type": "echo", "config": {"message": "hi", "repeat": 3}})
            done = await c.wait(tid)
            assert done["state"] == "succeeded", done
            assert done["result"]["output"] == {"echo": "hi hi hi"}

            status, body = await c.request("POST", "/api/v1/tasks", json={"type": "echo", "config": {"mesage": "x"}})
            assert status == 400
            assert {e["field"] for e in body["errors"]} == {"config.mesage", "config.message"}
            status, body = await c.request("POST", "/api/v1/tasks", json={"type": "echo",
                                                                          "config": {"message": "x", "repeat": 0}})
            assert status == 400 and body["errors"] == [{"field": "config.repeat", "error": "must be >= 1; got 0"}]

            status, schema = await c.request("GET", "/api/v1/schema/task")
            assert status == 200 and schema["$defs"]["EchoConfig"]["properties"]["repeat"]["default"] == 1
            assert {"$ref": "#/$defs/EchoTask"} in schema["$defs"]["Task"]["oneOf"]
            assert c.runtime.state.tasks[tid].key[0] == ("cpu",)  # the kind's implied hardware
    assert kinds.active() is kinds.BUILTIN
    assert "echo" not in kinds.BUILTIN.names()


async def test_a_real_worker_reports_its_handlers_so_an_unknown_one_waits_or_is_refused_when_strict(tmp_path):
    async with run_cluster(tmp_path / "lenient", workers=1) as c:
        [tid] = await c.submit({"type": "custom", "config": {"name": "no_such_handler"}})
        status, task = await c.request("GET", f"/api/v1/tasks/{tid}")
        assert status == 200 and task["state"] == "pending"
        assert "lacks custom handler 'no_such_handler' (it has noop, setup_environment, sleep" in task["pending_reason"]
        [ok] = await c.submit({"type": "custom", "config": {"name": "noop"}})
        assert (await c.wait(ok))["state"] == "succeeded"
    async with run_cluster(tmp_path / "strict", workers=1, strict=True) as c:
        status, body = await c.request("POST", "/api/v1/tasks", json={"type": "custom", "config": {"name": "nope"}})
        assert status == 400 and body["errors"][0]["field"] == "config.name", body
        assert "no connected worker has custom handler 'nope'" in body["errors"][0]["error"]
