"""The OpenAPI description: it lists exactly the routes the app serves, is valid OpenAPI 3.1, is
the committed docs/openapi.json, and a live coordinator answers Schemathesis-generated requests
as it says (no 5xx; status codes, content types and bodies as described)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from openapi_spec_validator import validate
from schemathesis.specs.openapi.checks import positive_data_acceptance

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.api import OPENAPI, route_entries
from distributed_testing.coordinator.openapi import SPECS
from distributed_testing.coordinator.server import create_app
from distributed_testing.testing import Procs, Rest, start_coordinator_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 12  # per operation: the whole run stays well under 30 s
# needs a worker's WebSocket session (and its signed protocol), tested in tests/integration
SKIP = {("GET", "/ws/worker"), ("GET", "/api/v1/events")}  # a protocol switch; an endless stream
# The task schema describes a task's shape; the server checks meaning on top (a model path that
# resolves, a parameter that fits 64 bits) and answers 400 naming each field, as described. So a
# schema-valid task may be refused there: that check alone is off for that route.
SEMANTIC = {("POST", "/api/v1/tasks"): [positive_data_acceptance]}


def _gen_script() -> Any:
    spec = importlib.util.spec_from_file_location("gen_openapi", ROOT / "scripts" / "gen_openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_document_lists_exactly_the_routes_the_router_serves() -> None:
    app = create_app(CoordinatorConfig(db_path="memory://"))
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    doc = app[OPENAPI]
    described = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert served == described
    assert {(m, p) for m, p, _, _ in route_entries(app)} == set(SPECS), "every route needs an entry in openapi.SPECS"
    validate(doc)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and "x-permission" in op, (method, path)


def test_every_credentialed_route_documents_what_an_ha_standby_may_answer() -> None:
    """Through a standby (coordinator/forward.py) any such route may get 503 ``not_leader`` (nothing
    sent) or 502/504 ``answer_lost`` (sent; maybe carried out): a client generated from the document
    must know them."""
    doc = create_app(CoordinatorConfig(db_path="memory://"))[OPENAPI]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if op["security"]:
                assert {"502", "503", "504"} <= set(op["responses"]), (method, path)
                assert "answer_lost" in op["responses"]["504"]["description"]


def test_docs_openapi_json_is_the_generated_document() -> None:
    assert (ROOT / "docs" / "openapi.json").read_text() == _gen_script().generated(), \
        "docs/openapi.json is stale: run python scripts/gen_openapi.py"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, str]]:
    procs = Procs(tmp_path, cwd=ROOT)
    try:
        _, port = start_coordinator_process(procs, tmp_path / "state" / "c.duckdb", env={"DT_AUTH_FAIL_LIMIT": "0"})
        yield f"http://127.0.0.1:{port}", (tmp_path / "state" / "admin.key").read_text().strip()
    finally:
        procs.close()


@pytest.mark.timeout(120)
def test_schemathesis_against_a_live_coordinator(live: tuple[str, str]) -> None:
    base_url, admin = live
    doc = Rest(base_url, admin).ok("GET", "/api/v1/openapi.json")
    assert doc == json.loads(json.dumps(create_app(CoordinatorConfig(db_path="memory://"))[OPENAPI]))
    schema = schemathesis.openapi.from_dict(doc)
    headers = {"Authorization": f"Bearer {admin}"}
    ran = 0
    for result in schema.get_all_operations():
        op = result.ok()
        if (op.method.upper(), op.path) in SKIP:
            continue

        @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def check(case: Any) -> None:
            if case.query and "wait" in case.query:  # a real wait of up to 300 s would only slow the run
                case.query["wait"] = "0"
            case.call_and_validate(base_url=base_url, headers=headers,
                                   excluded_checks=SEMANTIC.get((case.method.upper(), case.path), []))

        check()
        ran += 1
    assert ran == len(SPECS) - len(SKIP)
