"""One filter language for every store: a query (``ResultQuery``, ``TaskQuery``) becomes a
``Filter``, a tuple of typed terms that must all hold, and that one description is evaluated in
Python (``holds``: ``MemoryStore``, and DuckDB's rows still waiting for a checkpoint) and rendered
to SQL for DuckDB and PostgreSQL (``render``). Which query field means which term is stated once,
in ``RESULT_FIELDS`` and ``TASK_FIELDS``: adding a filter is one line there (and the field on the
query), and every store has it.

The terms and their meaning (``row.c`` is a column of the row, ``J`` the JSON value found by
walking ``path`` through objects from column ``c``; missing anywhere on the way means no match):

- ``Eq(c, v)``: ``row.c == v`` (a NULL column matches nothing).
- ``Ge(c, v)`` / ``Lt(c, v)``: ``row.c >= v`` / ``row.c < v`` (finite floats).
- ``JsonStr(c, path, v)``: ``J`` is a string equal to ``v``.
- ``JsonListHas(c, path, key, v)``: ``J`` is a list holding ``v`` (``key`` None), or holding an
  object whose ``key`` is ``v``. Type-strict as JSON is: an int ``4`` matches ``4``, never
  ``4.0``, ``"4"`` or ``true``; a string matches only that string.
- ``AnyOf(terms)``: at least one of ``terms`` holds.

SQL injection is impossible by construction: every value travels as a bound parameter; column
names and JSON path steps come only from the tables below, are checked against
``[a-z_][a-z0-9_]*`` when a term is made, and a column must be one of the queried table's.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

import msgspec

from ...errors import ValidationError
from .base import ResultQuery, TaskQuery

_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
_MISSING = object()


def _names(*names: str) -> None:
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"not a plain SQL name: {name!r}")


@dataclass(frozen=True)
class Eq:
    column: str
    value: str

    def __post_init__(self) -> None:
        _names(self.column)


@dataclass(frozen=True)
class Ge:
    column: str
    value: float

    def __post_init__(self) -> None:
        _names(self.column)


@dataclass(frozen=True)
class Lt:
    column: str
    value: float

    def __post_init__(self) -> None:
        _names(self.column)


@dataclass(frozen=True)
class JsonStr:
    column: str
    path: tuple[str, ...]
    value: str

    def __post_init__(self) -> None:
        _names(self.column, *self.path)


@dataclass(frozen=True)
class JsonListHas:
    column: str
    path: tuple[str, ...]
    key: str | None
    value: str | int

    def __post_init__(self) -> None:
        _names(self.column, *self.path, *([self.key] if self.key is not None else []))
        if type(self.value) not in (str, int):  # a bool is not an int here (JSON true is not 1)
            raise ValueError(f"JsonListHas compares a str or an int, not {type(self.value).__name__}")


@dataclass(frozen=True)
class AnyOf:
    terms: tuple[Term, ...]


Term = Eq | Ge | Lt | JsonStr | JsonListHas | AnyOf
Filter = tuple[Term, ...]  # every term must hold

# ---------------------------------------------------------------------------- the one table

# Query field -> the term it means. The only place that says what a filter does.
RESULT_FIELDS: dict[str, Callable[[Any], Term]] = {
    "task_id": lambda v: Eq("task_id", v),
    "worker_id": lambda v: Eq("worker_id", v),
    "status": lambda v: Eq("status", v),
    "task_type": lambda v: Eq("task_type", v),
    "since": lambda v: Ge("received_at", v),
    "until": lambda v: Lt("received_at", v),
    "model": lambda v: JsonStr("output", ("model",), v),
    "precision": lambda v: JsonStr("output", ("precision",), v),
    "hardware": lambda v: AnyOf((JsonStr("output", ("device",), v),
                                 JsonStr("output", ("environment", "device_name"), v))),
    "batch_size": lambda v: JsonListHas("output", ("batch_results",), "batch_size", v),
    "config_hash": lambda v: JsonStr("output", ("config_hash",), v),  # bench/env.py
    "fingerprint": lambda v: JsonStr("output", ("environment", "fingerprint_hash"), v),
}
TASK_FIELDS: dict[str, Callable[[Any], Term]] = {
    "state": lambda v: Eq("state", v),
    "type": lambda v: Eq("type", v),
    "worker_id": lambda v: Eq("worker_id", v),
    "submitted_by": lambda v: Eq("submitted_by", v),
    "tag": lambda v: JsonListHas("spec", ("requirements", "tags"), None, v),
    "since": lambda v: Ge("submitted_at", v),
    "until": lambda v: Lt("submitted_at", v),
    "run_id": lambda v: Eq("run_id", v),
}
PAGING = ("limit", "offset")  # the query fields that are not filters


def fields_of(q: ResultQuery | TaskQuery) -> dict[str, Callable[[Any], Term]]:
    return RESULT_FIELDS if isinstance(q, ResultQuery) else TASK_FIELDS


def describe(q: ResultQuery | TaskQuery) -> Filter:
    """The filter ``q`` means: one term per filter field given (not None), in table order."""
    return tuple(term(value) for name, term in fields_of(q).items() if (value := getattr(q, name)) is not None)


# ---------------------------------------------------------------------------- in Python


def _at(value: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        if not isinstance(value, dict):
            return _MISSING
        value = value.get(step, _MISSING)
    return value


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b  # JSON-strict: True is not 1, 4.0 is not 4


def term_holds(t: Term, row: Any) -> bool:
    """Whether ``t`` holds for ``row`` (a ``ResultRow`` or ``TaskRow``; module docstring)."""
    if isinstance(t, Eq):
        return bool(getattr(row, t.column) == t.value)
    if isinstance(t, Ge):
        return bool(getattr(row, t.column) >= t.value)
    if isinstance(t, Lt):
        return bool(getattr(row, t.column) < t.value)
    if isinstance(t, JsonStr):
        found = _at(getattr(row, t.column), t.path)
        return isinstance(found, str) and found == t.value
    if isinstance(t, JsonListHas):
        items = _at(getattr(row, t.column), t.path)
        if not isinstance(items, list):
            return False
        if t.key is None:
            return any(_same(e, t.value) for e in items)
        return any(isinstance(e, dict) and _same(e.get(t.key, _MISSING), t.value) for e in items)
    if isinstance(t, AnyOf):
        return any(term_holds(s, row) for s in t.terms)
    assert_never(t)


def holds(f: Filter, row: Any) -> bool:
    """Whether every term of ``f`` holds for ``row``."""
    return all(term_holds(t, row) for t in f)


# ---------------------------------------------------------------------------- in SQL


class Params:
    """Collects a statement's parameter values; ``add`` returns the SQL parameter marker for one:
    ``$1``, ``$2``, ... when ``numbered`` (PostgreSQL), ``?`` otherwise (DuckDB, by position)."""

    def __init__(self, numbered: bool = True) -> None:
        self.numbered = numbered
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}" if self.numbered else "?"


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL stores: how a text value and a JSON value are sent (the
    PostgreSQL store stores U+0000 as U+FFFD, so its queries must too: ``pgsql.clean_text``)."""

    name: str
    text: Callable[[str], str]
    json: Callable[[Any], str]


def render(f: Filter, dialect: Dialect, p: Params, columns: Collection[str]) -> str:
    """A SQL boolean expression true exactly where ``holds(f, row)`` is (``TRUE`` for no terms),
    its values added to ``p``. ``columns`` are the queried table's; a term naming another is a
    programming error (ValueError)."""
    return " AND ".join(_term_sql(t, dialect, p, frozenset(columns)) for t in f) or "TRUE"


def _term_sql(t: Term, d: Dialect, p: Params, columns: frozenset[str]) -> str:
    if isinstance(t, AnyOf):
        return "(" + " OR ".join(_term_sql(s, d, p, columns) for s in t.terms) + ")"
    if t.column not in columns:
        raise ValueError(f"filter on {t.column!r}, which is not a column of the queried table")
    c = t.column
    if isinstance(t, Eq):
        return f"{c} = {p.add(d.text(t.value))}"
    if isinstance(t, Ge):
        return f"{c} >= {p.add(t.value)}"
    if isinstance(t, Lt):
        return f"{c} < {p.add(t.value)}"
    if isinstance(t, JsonStr):
        if d is DUCKDB:
            path = _duck_path(t.path)
            return f"(json_type({c}, '{path}') = 'VARCHAR' AND json_extract_string({c}, '{path}') = {p.add(t.value)})"
        return f"({_pg_path(c, t.path)})::text = {p.add(d.json(t.value))}"
    if isinstance(t, JsonListHas):
        return _list_has_sql(t, d, p)
    assert_never(t)


def _duck_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f".{step}" for step in path)


def _pg_path(column: str, path: tuple[str, ...]) -> str:
    return " -> ".join([column, *(f"'{step}'" for step in path)])


def _list_has_sql(t: JsonListHas, d: Dialect, p: Params) -> str:
    # Both compare JSON text: the element as stored (minified) with the value encoded the same way.
    if d is DUCKDB:
        path = _duck_path(t.path)
        items = f"{path}[*]" + (f".{t.key}" if t.key is not None else "")
        return (f"(json_type({t.column}, '{path}') = 'ARRAY' AND "
                f"list_contains(json_extract({t.column}, '{items}'), CAST({p.add(d.json(t.value))} AS JSON)))")
    x = _pg_path(t.column, t.path)
    elem = "e" if t.key is None else f"json_typeof(e) = 'object' AND (e -> '{t.key}')"
    return (f"EXISTS (SELECT 1 FROM json_array_elements(CASE WHEN json_typeof({x}) = 'array' THEN {x} "
            f"ELSE '[]'::json END) e WHERE {elem}::text = {p.add(d.json(t.value))})")


_json_encode = msgspec.json.Encoder().encode
DUCKDB = Dialect("duckdb", text=lambda s: s, json=lambda v: _json_encode(v).decode())
# POSTGRES is made in pgsql.py, where its encoding of stored text and JSON lives.


# ---------------------------------------------------------------------------- from the REST query

Q = TypeVar("Q", ResultQuery, TaskQuery)


def parse_query(params: Mapping[str, str], query_type: type[Q], blank_is_absent: bool = False) -> Q:
    """A REST endpoint's query parameters as ``query_type``: each converted to its field's type;
    a ``since``/``until`` must be finite. ``blank_is_absent``: an empty filter parameter (a
    form's blank field) filters nothing. ValidationError naming every bad or unknown parameter.
    Paging bounds are the endpoint's to check."""
    fields = {f.name: f.type for f in msgspec.structs.fields(query_type)}
    errors = [{"field": k, "error": "unknown query parameter"} for k in sorted(set(params) - set(fields))]
    values: dict[str, Any] = {}
    for name, raw in params.items():
        if name not in fields or (blank_is_absent and raw == "" and name not in PAGING):
            continue
        try:
            values[name] = msgspec.convert(raw, fields[name], strict=False)
        except msgspec.ValidationError as exc:
            errors.append({"field": name, "error": _choice_error(fields[name], raw) or _type_error(fields[name], raw)
                           or str(exc).split(" - at ")[0]})
            continue
        if isinstance(values[name], float) and not math.isfinite(values[name]):
            errors.append({"field": name, "error": "must be a finite number of UNIX seconds"})
    if errors:
        raise ValidationError(errors)
    return query_type(**values)


def _type_error(field_type: Any, raw: str) -> str | None:
    """For a number field: what it must be, in words (msgspec says "Expected `int`, got `str`")."""
    arms = set(typing.get_args(field_type) or (field_type,))
    if int in arms and bool not in arms:
        return f"must be an integer; got {raw!r}"
    if float in arms:
        return f"must be a number; got {raw!r}"
    return None


def _choice_error(field_type: Any, raw: str) -> str | None:
    """For a field of fixed values (``Literal``, maybe ``| None``): what it may be, as the task
    validation says it."""
    choices = [a for arm in typing.get_args(field_type) or (field_type,) if typing.get_origin(arm) is typing.Literal
               for a in typing.get_args(arm)]
    if not choices:
        return None
    return f"must be one of {', '.join(repr(c) for c in sorted(choices))}; got {raw!r}"
