"""Fuzz every REST route of a real coordinator (DuckDB store, real sockets) with hypothesis.

Inputs: malformed, truncated and oversized bodies, random JSON values of the wrong types, task
documents with one field replaced by junk, non-standard JSON (NaN, Infinity, 1e999, lone
surrogates, integers beyond 64 bits, deep nesting), random path segments and query parameters,
absent, bad and garbage ``Authorization`` headers, and odd content types.

Properties, for every request: never a 5xx and never a dropped connection; every 4xx body is JSON
with ``error`` and ``message``; every 2xx body is strict JSON (RFC 8259: no NaN or Infinity).
After the run: every task the coordinator holds validates against the published schema and
``parse_tasks``, everything it persisted checkpoints into DuckDB, and a normal submit still works.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import msgspec
import pytest
from fuzz_support import CASES, Background, background_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distributed_testing.coordinator.api import ROUTES as ALL_ROUTES
from distributed_testing.tasks.spec import parse_tasks, task_json_schema
from distributed_testing.testing import Cluster

# the change feed never ends a 200 answer (server-sent events): its own tests cover it
ROUTES = [r for r in ALL_ROUTES if r[1] != "/api/v1/events"]

pytestmark = pytest.mark.timeout(180)

MAX_BODY = 64 * 1024  # CoordinatorConfig.max_frame_bytes, which also bounds REST bodies (16 MiB by default)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SUITE = "REST"

VALID_TASKS: list[dict[str, Any]] = [
    {"type": "custom", "config": {"name": "noop"}},
    {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 1}}, "priority": 3,
     "requirements": {"tags": ["gpu-box"], "hardware": ["cpu"], "min_memory_gb": 1}, "max_retries": 1},
    {"type": "test", "config": {"test_file": "test_x.py", "test_args": ["-k", "fast"]}, "timeout_s": 30},
    {"type": "benchmark", "config": {"model": "bert-base-uncased", "batch_sizes": [1, 2], "precision": "fp16",
                                     "iterations": 5}, "max_memory_mb": 512},
    {"type": "training", "config": {"model": "mlp", "nodes": 2, "batch_size": 256, "steps": 50}},
]


@dataclass
class Env:
    bg: Background
    c: Cluster
    keys: dict[str, str]
    task_ids: list[str]
    victim_key_ids: list[str]
    worker_ids: list[str]

    @property
    def port(self) -> int:
        return int(self.c.base_url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp: Path = tmp_path_factory.mktemp("fuzz-rest")
    with background_cluster(tmp, workers=0, db_path=str(tmp / "coordinator.duckdb"), max_frame_bytes=MAX_BODY,
                            auth_fail_limit=0) as (bg, c):  # fuzzed credentials are not to lock the address out
        keys = {"admin": c.admin_key} | {role: bg.run(c.create_key(role)) for role in ("submitter", "viewer", "worker")}
        task_ids = bg.run(c.submit([{**t, "task_id": f"seed-{i}"} for i, t in enumerate(VALID_TASKS)]))

        async def victims() -> list[str]:
            out = []
            for i in range(3):
                status, body = await c.request("POST", "/api/v1/keys", json={"role": "viewer", "name": f"victim-{i}"})
                assert status == 201, body
                out.append(body["key_id"])
            return out

        yield Env(bg, c, keys, task_ids, bg.run(victims()), ["no-such-worker"])


# ------------------------------------------------------------------ strategies

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30]) | st.floats() | st.text(max_size=20))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
ODD_LITERALS = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b'"\\ud800"', b'"\\udc00x"',
                                b"123456789012345678901234567890", b"18446744073709551616", b"-9223372036854775809",
                                b'"\\u0000"', b"true", b"null", b"0", b"-0", b"1e-400"])


def _set_path(doc: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _set_path(doc.get(head), rest, value)}
    return {head: _set_path(None, rest, value)}


@st.composite
def mutated_task(draw: st.DrawFn) -> bytes:
    """A valid task with one field (at any depth) replaced by a junk value or odd literal."""
    task = draw(st.sampled_from(VALID_TASKS))
    field = draw(st.sampled_from(["task_id", "type", "priority", "timeout_s", "max_retries", "max_memory_mb", "cache",
                                  "requirements", "config", "unknown"]))
    sub = {"requirements": ["hardware", "tags", "min_memory_gb", "x"],
           "config": ["name", "parameters", "test_file", "test_args", "model", "batch_sizes", "precision",
                      "iterations", "backend", "device", "kind", "nodes", "batch_size", "steps"]}.get(field)
    path = [field] + ([draw(st.sampled_from(sub))] if sub and draw(st.booleans()) else [])
    if draw(st.integers(0, 3)) == 0:
        marker = "__ODD__"
        text = json.dumps(_set_path(task, path, marker)).encode()
        return text.replace(b'"__ODD__"', draw(ODD_LITERALS))
    doc = _set_path(task, path, draw(JSON_VALUES))
    if draw(st.booleans()):
        doc = [doc, draw(st.sampled_from(VALID_TASKS))]
    return json.dumps(doc, allow_nan=True).encode()


def _deep(n: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * n + b"]" * n
    if kind == "object":
        return b'{"a":' * n + b"1" + b"}" * n
    inner = b'{"a":' * n + b"1" + b"}" * n  # inside a task's free-form parameters
    return b'{"type":"custom","config":{"name":"x","parameters":' + inner + b"}}"


BODIES = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")),
    JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    mutated_task(),
    st.tuples(st.sampled_from(VALID_TASKS), st.floats(0, 1)).map(  # truncated valid JSON
        lambda a: (t := json.dumps(a[0]).encode())[: int(len(t) * a[1])]),
    st.tuples(st.integers(1, 5000), st.sampled_from(["array", "object", "param"])).map(lambda a: _deep(*a)),
    ODD_LITERALS,
    st.just(b"\xef\xbb\xbf" + json.dumps(VALID_TASKS[0]).encode()),  # BOM
    st.just(b""),
)
CONTENT_TYPES = st.sampled_from([None, "application/json", "text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=xyz", "application/json; charset=latin-1",
                                 "application/octet-stream", "garbage/∅".encode().decode("latin-1"), ""])
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
ROLES = ("admin", "submitter", "viewer", "worker")


@st.composite
def authorization(draw: st.DrawFn, env: Env) -> dict[str, str]:
    kind = draw(st.sampled_from(["admin", "admin", "admin", "submitter", "viewer", "worker", "none", "empty",
                                 "bearer-junk", "junk", "basic", "lowercase", "prefix-key", "long"]))
    if kind in ROLES:
        return {"Authorization": f"Bearer {env.keys[kind]}"}
    value = {
        "none": None,
        "empty": "",
        "bearer-junk": "Bearer " + draw(HEADER_TEXT),
        "junk": draw(HEADER_TEXT),
        "basic": f"Basic {env.keys['admin']}",
        "lowercase": f"bearer {env.keys['admin']}",
        "prefix-key": "Bearer dtk_" + draw(HEADER_TEXT.filter(lambda s: " " not in s)),
        # longer than the credential limit, shorter than aiohttp's 8 KiB header line limit (a longer
        # line is refused by its HTTP parser, with a plain-text 400, before the application runs)
        "long": "Bearer " + "A" * draw(st.integers(3000, 8000)),
    }[kind]
    return {} if value is None else {"Authorization": value}


PRE_ENCODED = ("%00", "%2F", "%2e%2e", "%ff%fe", "%")  # sent as they are (the last is a bad escape)
SEGMENT = st.one_of(st.text(max_size=40), st.sampled_from(["..", ".", "a/b", " ", "\x00", "é", "😀" * 10, *PRE_ENCODED]),
                    st.text(alphabet="abcdef0123456789-", min_size=1, max_size=8))


@st.composite
def route_path(draw: st.DrawFn, env: Env, template: str) -> str:
    """``template`` with each ``{param}`` filled with a known id or a random segment."""
    known = {"task_id": env.task_ids, "key_id": env.victim_key_ids, "worker_id": env.worker_ids}
    parts = []
    for part in template.split("/"):
        if part.startswith("{") and part.endswith("}"):
            pool = known.get(part[1:-1], [])
            seg = draw(st.sampled_from(pool)) if pool and draw(st.booleans()) else draw(SEGMENT)
            part = seg if seg in PRE_ENCODED else urllib.parse.quote(seg, safe="")
        parts.append(part)
    return "/".join(parts)


QUERY_NAMES = ["wait", "result", "limit", "offset", "state", "type", "worker_id", "task_id", "status", "task_type",
               "model", "precision", "hardware", "batch_size", "since", "until", "x"]
QUERY_VALUES = st.one_of(st.text(max_size=20), st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "0", "1e-300",
                                                                "99999999999999999999", "9223372036854775807",
                                                                "-9223372036854775808", "0x10", "1_000", " 5 ", "",
                                                                "true", "300.0000001", "1e5"]),
                         st.integers().map(str), st.floats().map(str))
QUERIES = st.dictionaries(st.sampled_from(QUERY_NAMES), QUERY_VALUES, max_size=5)


# ------------------------------------------------------------------ requests and checks


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes


async def _send(c: Cluster, method: str, path: str, headers: dict[str, str], data: bytes | None,
                query: dict[str, str] | None = None) -> Reply:
    url = c.base_url + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    async with c.http.request(method, yarl_url(url), headers=headers, data=data) as r:
        return Reply(r.status, r.content_type, await r.read())


def yarl_url(url: str) -> Any:
    import yarl

    return yarl.URL(url, encoded=True)  # send our percent-encoding as is


def check_reply(r: Reply, what: str) -> None:
    assert r.status < 500, f"{what}: HTTP {r.status}: {r.body[:500]!r}"
    if what.startswith("HEAD "):
        return  # no body
    if r.status >= 400:
        assert r.content_type == "application/json", f"{what}: {r.status} body is {r.content_type}: {r.body[:300]!r}"
        doc = msgspec.json.decode(r.body)
        assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"], (what, doc)
        assert isinstance(doc.get("message"), str) and doc["message"], (what, doc)
    elif r.content_type == "application/json":
        msgspec.json.decode(r.body)  # strict JSON: NaN or Infinity in a 2xx body fails here


def request(env: Env, method: str, path: str, headers: dict[str, str], data: bytes | None = None,
            query: dict[str, str] | None = None) -> Reply:
    CASES[SUITE] += 1
    what = f"{method} {path} q={query} h={headers!r:.200} body={data!r:.300}"
    try:
        reply = env.bg.run(_send(env.c, method, path, headers, data, query))
    except aiohttp.ClientError as exc:  # a dropped connection, never acceptable
        raise AssertionError(f"{what}: connection failed: {exc!r}") from exc
    check_reply(reply, what)
    return reply


# ------------------------------------------------------------------ the fuzz tests

# the routes that read their body (the others ignore it, whatever its size)
BODY_ROUTES = [(meth, path) for meth, path, handler, _ in ROUTES if handler.__name__ in ("create_key", "submit_tasks", "drain_worker")]


@FUZZ
@given(data=st.data())
def test_bodies_on_every_route(env: Env, data: st.DataObject) -> None:
    method, template = data.draw(st.sampled_from([(meth, path) for meth, path, _, _ in ROUTES]), label="route")
    path = data.draw(route_path(env, template), label="path")
    headers = data.draw(authorization(env), label="auth")
    ctype = data.draw(CONTENT_TYPES, label="content-type")
    if ctype is not None:
        headers["Content-Type"] = ctype
    body = data.draw(BODIES, label="body")
    request(env, method, path, headers, body)


@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_task_documents(env: Env, data: st.DataObject) -> None:
    """The submit route gets the most attention: junk inside otherwise valid task documents."""
    body = data.draw(st.one_of(mutated_task(), BODIES), label="body")
    r = request(env, "POST", "/api/v1/tasks", {"Authorization": f"Bearer {env.keys['admin']}"}, body)
    if r.status in (200, 201):
        ids = [t["task_id"] for t in msgspec.json.decode(r.body)["tasks"]]
        env.task_ids.extend(i for i in ids if i not in env.task_ids)


@FUZZ
@given(data=st.data())
def test_paths_and_query_parameters(env: Env, data: st.DataObject) -> None:
    method, template = data.draw(st.sampled_from([(meth, path) for meth, path, _, _ in ROUTES]
                                                  + [("GET", "/api/v1/tasks/{task_id}")] * 3
                                                  + [("GET", "/api/v1/results")] * 3 + [("GET", "/api/v1/tasks")] * 3),
                                 label="route")
    path = data.draw(route_path(env, template), label="path")
    query = data.draw(QUERIES, label="query")
    if "wait" in query:  # a valid wait long-polls; keep the suite bounded
        query["wait"] = data.draw(st.sampled_from(["0", "0.001", "-1", "nan", "inf", "1e400", "301", "x", ""]))
    request(env, method, path, {"Authorization": f"Bearer {env.keys['admin']}"}, None, query)


@FUZZ
@given(data=st.data())
def test_credentials_methods_and_unknown_paths(env: Env, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["route", "method", "unknown"]), label="kind")
    method, template = data.draw(st.sampled_from([(meth, path) for meth, path, _, _ in ROUTES]), label="route")
    path = data.draw(route_path(env, template), label="path")
    if kind == "method":
        method = data.draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]))
    elif kind == "unknown":
        path = data.draw(st.sampled_from(["/", "/api", "/api/v1", "/api/v2/tasks", "/ws/worker", "/api/v1/tasks/a/b/c"])
                         | SEGMENT.map(lambda s: "/api/v1/" + urllib.parse.quote(s, safe="")))
    r = request(env, method, path, data.draw(authorization(env), label="auth"), None)
    if method == "HEAD":
        return
    assert r.status != 200 or kind != "unknown" or path == "/ws/worker", r


@settings(FUZZ, max_examples=20)
@given(route=st.sampled_from(BODY_ROUTES), extra=st.integers(1, 4 * MAX_BODY))
def test_oversized_bodies_are_413_json(env: Env, route: tuple[str, str], extra: int) -> None:
    method, template = route
    path = template.replace("{task_id}", env.task_ids[0]).replace("{key_id}", "zz").replace("{worker_id}", "w")
    r = request(env, method, path, {"Authorization": f"Bearer {env.keys['admin']}"}, b"[" + b" " * (MAX_BODY + extra) + b"]")
    assert r.status == 413, r


def _raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes or times out."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


@settings(FUZZ, max_examples=15)
@given(cut=st.integers(0, 40), claimed=st.integers(41, 400))
def test_a_body_shorter_than_its_content_length_harms_nothing(env: Env, cut: int, claimed: int) -> None:
    """The client promises more than it sends, then gives up: the coordinator keeps serving."""
    body = json.dumps(VALID_TASKS[0]).encode()[:cut]
    head = (f"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.keys['admin']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {claimed}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", env.port), timeout=5) as s:
        s.sendall(head + body)
    request(env, "GET", "/healthz", {}, None)


# ------------------------------------------------------------------ after the run


def test_after_the_run_nothing_invalid_was_accepted_and_submit_still_works(env: Env) -> None:
    rt = env.c.runtime
    schema = task_json_schema()

    async def snapshot() -> list[dict[str, Any]]:
        await rt.store.checkpoint()  # everything persisted must also fit DuckDB
        return [t.spec_dict for t in rt.state.tasks.values()]

    specs = env.bg.run(snapshot())
    assert len(specs) >= len(VALID_TASKS)
    for spec in specs:
        jsonschema.validate(spec, schema)
        parse_tasks(spec)
        msgspec.json.decode(msgspec.json.encode(spec))  # strict JSON round trip
    ok = request(env, "POST", "/api/v1/tasks", {"Authorization": f"Bearer {env.keys['submitter']}",
                                                "Content-Type": "application/json"},
                 json.dumps({"task_id": "after-fuzz", "type": "custom", "config": {"name": "noop"}}).encode())
    assert ok.status == 201, ok
    got = request(env, "GET", "/api/v1/tasks/after-fuzz", {"Authorization": f"Bearer {env.keys['viewer']}"})
    assert got.status == 200 and msgspec.json.decode(got.body)["state"] == "pending", got
    health = request(env, "GET", "/healthz", {})
    assert health.status == 200
    raw = _raw_exchange(env.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
