"""The filter language itself (``store.filters``), beyond today's query fields: random terms over
any column and JSON path, evaluated in Python (``holds``) and rendered as SQL run by a real DuckDB
and a real PostgreSQL over the same stored rows, select the same tasks.

The rows hold JSON of every awkward shape (values of the wrong type, lists where objects are
expected, NULL columns, strings with quotes and backslashes), and the terms compare against values
that are often there with another JSON type (``"1"`` vs ``1``, ``1`` vs ``true``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from distributed_testing.coordinator.core.rows import TaskRow
from distributed_testing.coordinator.store.duckdb import DuckDBStore
from distributed_testing.coordinator.store.duckdbsql import TABLES as DUCK_TABLES
from distributed_testing.coordinator.store.filters import (
    DUCKDB,
    AnyOf,
    Eq,
    Ge,
    JsonListHas,
    JsonStr,
    Lt,
    Params,
    Term,
    holds,
    render,
)
from distributed_testing.coordinator.store.pgsql import POSTGRES
from distributed_testing.coordinator.store.postgres import PostgresStore
from distributed_testing.testing import pg_schema_url

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

COLUMNS = [c.name for c in DUCK_TABLES[TaskRow].columns]
KEYS = ["a", "b", "tags"]
STRINGS = ["gpu", "1", "true", "", "ünï", "it's", 'say "hi"', "back\\slash", "a b"]
scalars = st.one_of(st.sampled_from(STRINGS), st.sampled_from([0, 1, 4, -1, 2**40]), st.booleans(), st.none(),
                    st.sampled_from([1.0, 4.0, 0.5, -0.0]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
                           max_leaves=8)
objects = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3)
times = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5])
rows = st.lists(st.builds(
    lambda i, **kw: TaskRow(f"t{i}", seq=i + 1, attempt=1, priority=0, digest="d", **kw),
    st.integers(0, 40),
    type=st.sampled_from(STRINGS[:3]),
    state=st.sampled_from(["pending", "failed"]),
    submitted_at=times,
    updated_at=times,
    spec=objects,
    worker_id=st.one_of(st.none(), st.sampled_from(STRINGS)),
    outcome=st.one_of(st.none(), objects),
    history=st.lists(objects, max_size=3),
), min_size=1, max_size=25, unique_by=lambda r: r.task_id)

paths = st.lists(st.sampled_from(KEYS), max_size=2).map(tuple)
json_columns = st.sampled_from(["spec", "outcome"])
leaves: st.SearchStrategy[Term] = st.one_of(
    st.builds(Eq, st.sampled_from(["type", "state", "worker_id", "task_id"]),
              st.sampled_from([*STRINGS, "t1", "pending"])),
    st.builds(Ge, st.sampled_from(["submitted_at", "updated_at"]), times),
    st.builds(Lt, st.sampled_from(["submitted_at", "updated_at"]), times),
    st.builds(JsonStr, json_columns, paths, st.sampled_from(STRINGS)),
    st.builds(JsonListHas, st.sampled_from(["spec", "outcome", "history"]), paths,
              st.one_of(st.none(), st.sampled_from(KEYS)),
              st.one_of(st.sampled_from(STRINGS), st.sampled_from([0, 1, 4, 2**40]))),
)
terms = st.one_of(leaves, st.lists(leaves, min_size=1, max_size=3).map(lambda ts: AnyOf(tuple(ts))))
filters = st.lists(terms, max_size=3).map(tuple)


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def duck(runner: asyncio.Runner, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DuckDBStore]:
    store = DuckDBStore(tmp_path_factory.mktemp("language") / "s.duckdb", checkpoint_interval_s=60.0)
    runner.run(store.open())
    yield store
    runner.run(store.close())


@pytest.fixture(scope="module")
def pg(runner: asyncio.Runner, pg_database_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(runner.run(pg_schema_url(pg_database_url, "language")))
    runner.run(store.open())
    yield store
    runner.run(store.close())


async def _select(duck: DuckDBStore, pg: PostgresStore, task_rows: list[TaskRow],
                  fs: list[tuple[Term, ...]]) -> list[tuple[set[str], set[str]]]:
    """Store ``task_rows`` (only them) in both, then the ids each database selects per filter."""
    await duck.checkpoint()
    await duck._db(lambda: duck._conn().execute("DELETE FROM tasks"))
    duck._changes.forget()  # its tasks' rows are gone: the next row of each must be journaled whole
    await pg.pool.execute("DELETE FROM tasks")
    await asyncio.gather(duck.append(task_rows), pg.append(task_rows))
    await duck.checkpoint()
    out = []
    for f in fs:
        dp, pp = Params(numbered=False), Params()
        duck_sql = f"SELECT task_id FROM tasks WHERE {render(f, DUCKDB, dp, COLUMNS)}"
        in_duck = await duck._db(lambda sql=duck_sql, v=dp.values: duck._conn().execute(sql, v).fetchall())
        in_pg = await pg.pool.fetch(f"SELECT task_id FROM tasks WHERE {render(f, POSTGRES, pp, COLUMNS)}", *pp.values)
        out.append(({r[0] for r in in_duck}, {r[0] for r in in_pg}))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_rows=rows, fs=st.lists(filters, min_size=1, max_size=8))
def test_python_duckdb_and_postgres_select_the_same_rows(runner: asyncio.Runner, duck: DuckDBStore,
                                                         pg: PostgresStore, task_rows: list[TaskRow],
                                                         fs: list[tuple[Term, ...]]) -> None:
    for f, (in_duck, in_pg) in zip(fs, runner.run(_select(duck, pg, task_rows, fs)), strict=True):
        in_memory = {r.task_id for r in task_rows if holds(f, r)}
        event("some rows selected" if in_memory else "no row selected")
        assert in_memory == in_duck == in_pg, f


def test_the_agreement_is_not_vacuous(runner: asyncio.Runner, duck: DuckDBStore, pg: PostgresStore) -> None:
    row = TaskRow("t1", "custom", "pending", 1, 0, 1.0, 1.0, "d", spec={"a": {"tags": ["it's", 4]}, "b": 'say "hi"'},
                  history=[{"a": 1}, {"a": "1"}], seq=1)
    other = TaskRow("t2", "custom", "pending", 1, 0, 1.0, 1.0, "d", spec={"a": {"tags": ["4", True]}, "b": 1},
                    history=[{"a": True}], seq=2)
    cases: list[tuple[tuple[Term, ...], set[str]]] = [
        ((JsonListHas("spec", ("a", "tags"), None, "it's"),), {"t1"}),
        ((JsonListHas("spec", ("a", "tags"), None, 4),), {"t1"}),
        ((JsonListHas("history", (), "a", 1),), {"t1"}),
        ((JsonStr("spec", ("b",), 'say "hi"'),), {"t1"}),
        ((AnyOf((JsonListHas("spec", ("a", "tags"), None, "4"), Eq("task_id", "t1"))),), {"t1", "t2"}),
    ]
    answers = runner.run(_select(duck, pg, [row, other], [f for f, _ in cases]))
    for (f, want), (in_duck, in_pg) in zip(cases, answers, strict=True):
        assert {r.task_id for r in (row, other) if holds(f, r)} == in_duck == in_pg == want, f
