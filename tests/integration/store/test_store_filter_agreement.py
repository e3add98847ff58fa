"""MemoryStore (the Python predicates), DuckDBStore and PostgresStore (their SQL) answer every
ResultQuery, TaskQuery and task_stats call alike.

Outputs are drawn with the awkward shapes real JSON has: fields missing, of the wrong type
(an int model, a "4" or 4.0 or true batch size), batch_results that is not a list, an environment
that is not an object, and many ties in received_at; task specs likewise (tags that are not a list
or hold non-strings, requirements that are not an object).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.store import MemoryStore
from distributed_testing.coordinator.store.base import ResultQuery, TaskQuery
from distributed_testing.coordinator.store.duckdb import DuckDBStore
from distributed_testing.coordinator.store.postgres import PostgresStore
from distributed_testing.testing import pg_schema_url

pytestmark = pytest.mark.timeout(90)

# Small alphabets on both sides, so that filters often hit, including the values whose JSON type
# is wrong for the filter (1 vs "1", true vs 1, 4.0 vs 4, "4" vs 4).
ODD = [1, True, None, 4.0, [], {}]
model = st.sampled_from(["bert", "1", "true", "ünï/côde", *ODD])
precision = st.sampled_from(["fp16", "fp32", *ODD])
device = st.sampled_from(["cuda", "NVIDIA H100", *ODD])
batch_size = st.sampled_from([0, 1, 4, True, False, 1.0, 4.0, "4", None, [4]])
batch_entry = st.one_of(
    st.fixed_dictionaries({}, optional={"batch_size": batch_size, "latency_ms": st.floats(0, 10)}),
    st.sampled_from([4, "x", None]),
)
environment = st.one_of(
    st.fixed_dictionaries({}, optional={"device_name": device, "fingerprint_hash": st.sampled_from(["f1", "f2", 1, None])}),
    st.sampled_from([["NVIDIA H100"], "NVIDIA H100", None]),
)
output = st.fixed_dictionaries(
    {},
    optional={
        "model": model,
        "precision": precision,
        "device": device,
        "environment": environment,
        "config_hash": st.sampled_from(["c1", "c2", 1, None]),
        "batch_results": st.one_of(st.lists(batch_entry, max_size=4), batch_entry),
    },
)
results = st.builds(
    ResultRow,
    task_id=st.sampled_from(["a", "b", "c", "d", "e", "f"]),
    attempt=st.integers(1, 3),
    worker_id=st.sampled_from(["w1", "w2"]),
    status=st.sampled_from(["completed", "failed"]),
    started_at=st.just(1.0),
    finished_at=st.just(2.0),
    received_at=st.integers(0, 4).map(float),
    output=output,
    error=st.none(),
    task_type=st.sampled_from(["benchmark", "test"]),
)
FILTERS: dict[str, st.SearchStrategy[Any]] = {
    "task_id": st.sampled_from(["a", "b", "zz"]),
    "worker_id": st.sampled_from(["w1", "w2"]),
    "status": st.sampled_from(["completed", "failed"]),
    "task_type": st.sampled_from(["benchmark", "test"]),
    "since": st.integers(0, 5).map(float),
    "until": st.integers(0, 5).map(float),
    "model": st.sampled_from(["bert", "1", "true", "ünï/côde"]),
    "precision": st.sampled_from(["fp16", "1"]),
    "hardware": st.sampled_from(["cuda", "NVIDIA H100", "1"]),
    "batch_size": st.sampled_from([0, 1, 4]),
    "config_hash": st.sampled_from(["c1", "c2"]),
    "fingerprint": st.sampled_from(["f1", "f2"]),
}


@st.composite
def queries(draw: st.DrawFn) -> ResultQuery:
    """Zero to two filters (more would match nothing on data this small), and paging."""
    names = draw(st.sets(st.sampled_from(sorted(FILTERS)), max_size=2))
    filters = {name: draw(FILTERS[name]) for name in sorted(names)}
    limit = draw(st.one_of(st.just(100), st.integers(0, 6)))
    return ResultQuery(**filters, limit=limit, offset=draw(st.one_of(st.just(0), st.integers(0, 4))))


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def duck(runner: asyncio.Runner, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DuckDBStore]:
    """One DuckDB store for the module (opening one costs ~0.1 s); each example empties it."""
    store = DuckDBStore(tmp_path_factory.mktemp("agreement") / "s.duckdb", checkpoint_interval_s=60.0)
    runner.run(store.open())
    yield store
    runner.run(store.close())


@pytest.fixture(scope="module")
def pg(runner: asyncio.Runner, pg_database_url: str) -> Iterator[PostgresStore]:
    """One PostgreSQL store for the module, in a schema of its own; each example empties it."""
    store = PostgresStore(runner.run(pg_schema_url(pg_database_url, "agreement")))
    runner.run(store.open())
    yield store
    runner.run(store.close())


async def _fill(duck: DuckDBStore, pg: PostgresStore, table: str, rows: list[Any]) -> MemoryStore:
    """Empty ``table`` in both stores, then append ``rows`` to all three: the first half reaches
    DuckDB, the rest stays pending there, so both of its query paths, and resends and updates
    across that line, are exercised."""
    await duck.checkpoint()
    await duck._db(lambda: duck._conn().execute(f"DELETE FROM {table}"))
    duck._changes.forget()  # its tasks' rows are gone: the next row of each must be journaled whole
    await pg.pool.execute(f"DELETE FROM {table}")
    mem = MemoryStore()
    await mem.open()
    split = len(rows) // 2
    await asyncio.gather(mem.append(rows[:split]), duck.append(rows[:split]), pg.append(rows[:split]))
    await duck.checkpoint()
    await asyncio.gather(mem.append(rows[split:]), duck.append(rows[split:]), pg.append(rows[split:]))
    return mem


async def _all(duck: DuckDBStore, pg: PostgresStore, rows: list[ResultRow],
               qs: list[ResultQuery]) -> list[tuple[Any, Any, Any]]:
    mem = await _fill(duck, pg, "results", rows)
    return [(await mem.query_results(q), await duck.query_results(q), await pg.query_results(q)) for q in qs]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(results, min_size=10, max_size=30), qs=st.lists(queries(), min_size=1, max_size=8))
def test_memory_duckdb_and_postgres_agree(
    runner: asyncio.Runner, duck: DuckDBStore, pg: PostgresStore, rows: list[ResultRow], qs: list[ResultQuery]
) -> None:
    for q, (mem_rows, duck_rows, pg_rows) in zip(qs, runner.run(_all(duck, pg, rows, qs)), strict=True):
        assert mem_rows == duck_rows == pg_rows, q


def test_agreement_is_not_vacuous(runner: asyncio.Runner, duck: DuckDBStore, pg: PostgresStore) -> None:
    rows = [
        ResultRow(
            "a",
            1,
            "w1",
            "completed",
            1.0,
            2.0,
            3.0,
            {
                "model": "bert",
                "precision": "fp16",
                "environment": {"device_name": "NVIDIA H100"},
                "batch_results": [{"batch_size": 4}],
            },
            task_type="benchmark",
        )
    ]
    q = ResultQuery(model="bert", precision="fp16", hardware="NVIDIA H100", batch_size=4)
    ((mem_rows, duck_rows, pg_rows),) = runner.run(_all(duck, pg, rows, [q]))
    assert mem_rows == duck_rows == pg_rows == rows


# ---------------------------------------------------------------------------- tasks

tag_list = st.lists(st.sampled_from(["gpu", "cpu", "1", 1, True, None, ["gpu"]]), max_size=3)
requirements = st.one_of(
    st.fixed_dictionaries({}, optional={"tags": st.one_of(tag_list, st.sampled_from(["gpu", 1, None, {}]))}),
    st.sampled_from([["gpu"], "gpu", None]),
)
specs = st.fixed_dictionaries({"type": st.just("custom")}, optional={"requirements": requirements})
times = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.7, 1.0, 1.5, 2.0, 2.9999999999999996, 3.0, 10.0])
task_rows = st.builds(
    lambda i, **kw: TaskRow(f"t{i}", seq=i + 1, attempt=1, priority=0, digest="d", **kw),
    st.integers(0, 15),
    type=st.sampled_from(["custom", "benchmark"]),
    state=st.sampled_from(["pending", "running", "succeeded", "failed", "timed_out", "error", "cancelled"]),
    submitted_at=times,
    updated_at=times,
    spec=specs,
    worker_id=st.sampled_from([None, "w1", "w2"]),
    submitted_by=st.sampled_from([None, "k1", "k2"]),
)
TASK_FILTERS: dict[str, st.SearchStrategy[Any]] = {
    "state": st.sampled_from(["pending", "failed", "succeeded"]),
    "type": st.sampled_from(["custom", "benchmark"]),
    "worker_id": st.sampled_from(["w1", "w2"]),
    "submitted_by": st.sampled_from(["k1", "k2"]),
    "tag": st.sampled_from(["gpu", "cpu", "1", "true"]),
    "since": times,
    "until": times,
}


@st.composite
def task_queries(draw: st.DrawFn) -> TaskQuery:
    names = draw(st.sets(st.sampled_from(sorted(TASK_FILTERS)), max_size=2))
    filters = {name: draw(TASK_FILTERS[name]) for name in sorted(names)}
    limit = draw(st.one_of(st.just(100), st.integers(0, 6)))
    return TaskQuery(**filters, limit=limit, offset=draw(st.one_of(st.just(0), st.integers(0, 4))))


stats_args = st.tuples(st.sampled_from([0.0, 0.1, 1.0, -1.0]), st.sampled_from([0.1, 0.3, 1.0, 2.5]),
                       st.integers(0, 12), st.integers(0, 4))


async def _all_tasks(duck: DuckDBStore, pg: PostgresStore, rows: list[TaskRow], qs: list[TaskQuery],
                     stats: list[tuple[float, float, int, int]]) -> list[tuple[Any, Any, Any]]:
    mem = await _fill(duck, pg, "tasks", rows)
    out: list[tuple[Any, Any, Any]] = [
        (await mem.query_tasks(q), await duck.query_tasks(q), await pg.query_tasks(q)) for q in qs]
    out += [(await mem.task_stats(*a), await duck.task_stats(*a), await pg.task_stats(*a)) for a in stats]
    ids = sorted({r.task_id for r in rows}) + ["nope"]
    out.append((await mem.get_tasks(ids), await duck.get_tasks(ids), await pg.get_tasks(ids)))
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(task_rows, min_size=5, max_size=30), qs=st.lists(task_queries(), min_size=1, max_size=6),
       stats=st.lists(stats_args, min_size=1, max_size=3))
def test_task_queries_and_stats_agree(runner: asyncio.Runner, duck: DuckDBStore, pg: PostgresStore,
                                      rows: list[TaskRow], qs: list[TaskQuery],
                                      stats: list[tuple[float, float, int, int]]) -> None:
    # Distinct (submitted_at, seq) per task id: the order contract breaks no ties beyond seq.
    answers = runner.run(_all_tasks(duck, pg, rows, qs, stats))
    for what, (mem, duck_answer, pg_answer) in zip([*qs, *stats, "get_tasks"], answers, strict=True):
        assert mem == duck_answer == pg_answer, what
