"""The filter language (``store.filters``): every query field has one term, which every store
evaluates by construction (Python, DuckDB SQL, PostgreSQL SQL); values only ever travel as bound
parameters; REST query parameters are parsed once, naming each bad one. That the three agree on
data: tests/integration/store/test_filter_language.py and test_store_filter_agreement.py."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest

from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.store.base import ResultQuery, TaskQuery
from distributed_testing.coordinator.store.filters import (
    DUCKDB,
    PAGING,
    RESULT_FIELDS,
    TASK_FIELDS,
    AnyOf,
    Eq,
    Ge,
    JsonListHas,
    JsonStr,
    Lt,
    Params,
    Term,
    describe,
    holds,
    parse_query,
    render,
)
from distributed_testing.coordinator.store.pgsql import POSTGRES
from distributed_testing.errors import ValidationError

CASES = [(ResultQuery, ResultRow, RESULT_FIELDS), (TaskQuery, TaskRow, TASK_FIELDS)]
SAMPLE = {str: "x'; DROP TABLE tasks; --", float: 1.5, int: 4}


def _sample(query_type: type[Any], name: str) -> Any:
    field_type = {f.name: f.type for f in msgspec.structs.fields(query_type)}[name]
    (base,) = [a for a in typing.get_args(field_type) if a is not type(None)]
    # a field of fixed values (state, status) is still a string to the SQL: the hostile one
    return SAMPLE[str] if typing.get_origin(base) is typing.Literal else SAMPLE[base]


def _columns(t: Term) -> list[str]:
    return [c for s in t.terms for c in _columns(s)] if isinstance(t, AnyOf) else [t.column]


@pytest.mark.parametrize(("query_type", "row_type", "table"), CASES)
def test_every_filter_field_is_one_term_every_store_runs(query_type: type[Any], row_type: type[Any],
                                                         table: dict[str, Any]) -> None:
    filters = [f.name for f in msgspec.structs.fields(query_type) if f.name not in PAGING]
    assert sorted(filters) == sorted(table)  # no query field without a term, no term without a field
    columns = [f.name for f in msgspec.structs.fields(row_type)]
    row = msgspec.convert({f.name: _sample_value(f) for f in msgspec.structs.fields(row_type) if f.required}, row_type)
    for name in filters:
        value = _sample(query_type, name)
        (term,) = describe(query_type(**{name: value}))
        assert set(_columns(term)) <= set(columns), name
        assert isinstance(holds((term,), row), bool)  # evaluated in Python ...
        for dialect, p in ((DUCKDB, Params(numbered=False)), (POSTGRES, Params())):  # ... and in both SQLs
            sql = render((term,), dialect, p, columns)
            assert p.values and str(value) not in sql and "DROP" not in sql, (name, sql)


def _sample_value(f: Any) -> Any:
    return {str: "s", int: 1, float: 1.0}.get(f.type, {})


def test_no_filter_is_true_and_terms_are_anded_with_placeholders_per_dialect() -> None:
    f = (Eq("state", "a"), Ge("submitted_at", 1.0), Lt("submitted_at", 2.0))
    cols = [f.name for f in msgspec.structs.fields(TaskRow)]
    assert render((), DUCKDB, Params(numbered=False), cols) == "TRUE"
    p = Params()
    assert render(f, POSTGRES, p, cols) == "state = $1 AND submitted_at >= $2 AND submitted_at < $3"
    assert p.values == ["a", 1.0, 2.0]
    p = Params(numbered=False)
    assert render(f, DUCKDB, p, cols) == "state = ? AND submitted_at >= ? AND submitted_at < ?"


@pytest.mark.parametrize("make", [
    lambda: Eq("state; DROP TABLE tasks", "x"),
    lambda: JsonStr("spec", ("a' OR '1'='1",), "x"),
    lambda: JsonListHas("spec", ("tags",), "k'", "x"),
    lambda: JsonListHas("spec", ("tags",), None, True),  # JSON true is not the int 1
    lambda: JsonListHas("spec", ("tags",), None, 1.0),
])
def test_names_in_sql_are_plain_and_list_values_typed(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


def test_a_column_not_of_the_queried_table_is_refused() -> None:
    with pytest.raises(ValueError, match="received_at"):
        render((Ge("received_at", 1.0),), POSTGRES, Params(), [f.name for f in msgspec.structs.fields(TaskRow)])


def test_json_terms_are_type_strict_in_python() -> None:
    row = TaskRow("t", "c", "pending", 1, 0, 1.0, 1.0, "d", spec={"a": {"tags": ["1", 4, True]}, "b": 1},
                  history=[{"k": 1}, "x"])
    assert holds((JsonListHas("spec", ("a", "tags"), None, "1"),), row)
    assert holds((JsonListHas("spec", ("a", "tags"), None, 4),), row)
    assert not holds((JsonListHas("spec", ("a", "tags"), None, 1),), row)  # True is there, 1 is not
    assert holds((JsonListHas("history", (), "k", 1),), row)
    assert not holds((JsonStr("spec", ("b",), "1"),), row)
    assert not holds((JsonStr("outcome", ("b",), "1"),), row)  # outcome is None
    assert holds((AnyOf((JsonStr("spec", ("b",), "1"), Eq("state", "pending"))),), row)


def test_rest_parameters_are_parsed_once_naming_each_bad_one() -> None:
    q = parse_query({"model": "bert", "batch_size": "8", "since": "1.5", "limit": "3"}, ResultQuery)
    assert q == ResultQuery(model="bert", batch_size=8, since=1.5, limit=3)
    with pytest.raises(ValidationError) as err:
        parse_query({"batch_size": "eight", "until": "nan", "since": "inf", "colour": "red"}, ResultQuery)
    assert sorted(e["field"] for e in err.value.errors) == ["batch_size", "colour", "since", "until"]
    with pytest.raises(ValidationError) as err:
        parse_query({"limit": "abc", "since": "yesterday"}, ResultQuery)
    assert sorted((e["field"], e["error"]) for e in err.value.errors) == [
        ("limit", "must be an integer; got 'abc'"), ("since", "must be a number; got 'yesterday'")]
    assert parse_query({"model": ""}, ResultQuery) == ResultQuery(model="")
    assert parse_query({"state": "", "tag": "gpu"}, TaskQuery, blank_is_absent=True) == TaskQuery(tag="gpu")
    with pytest.raises(ValidationError) as err:
        parse_query({"limit": ""}, TaskQuery, blank_is_absent=True)  # paging is never blank
    assert err.value.errors[0]["field"] == "limit"
