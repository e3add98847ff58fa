"""One declaration per setting: the flag, its ``DT_*`` variable, type, bounds, default and help.

A program's table (a tuple of :class:`Setting`) generates its argparse parser
(:func:`add_settings`), reads flags and variables once with flag > variable > default
(:func:`resolve`), checks each value's type and bounds once with an error naming the flag or
the variable it came from, and renders the README's option table (:func:`markdown_rows`,
``scripts/gen_options.py``). Rules between settings (``--recover`` needs ``--db-path``, a
profile's presets) stay in the program's ``config_from_args``.

Malformed values: a flag with a variable is read as text and parsed here (a ConfigError naming
the flag); a flag without one is typed by argparse (a usage error, exit 2), unless the row says
otherwise with ``usage_error``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

TRUE, FALSE = ("1", "true", "yes"), ("", "0", "false", "no")
SWITCH = "switch"  # Setting.type of an on/off flag (store_true); its variable takes 1/true/yes or 0/false/no


@dataclass(frozen=True)
class Setting:
    """One flag of one program. ``type`` is ``str``, ``int``, ``float``, ``Path`` or ``SWITCH``.

    Bounds: ``lo``/``hi`` inclusive, ``lo_open`` makes ``lo`` exclusive (``> lo``); floats must
    also be finite; ``bounds`` says the range in words where ``0..1`` would not do. ``check(value, source)`` converts or validates further (a URL list, module
    prefixes), raising ConfigError naming ``source``. ``default`` is the value when neither flag
    nor variable is given (None: the config's own default). ``doc`` is the README's text for the
    row when it says more than ``help``; ``shown`` the README's flag column when not
    ``flag METAVAR``, ``shown_default`` the default as a flag/variable/default table says it. ``read=False``: in the parser and the README, but the program reads it
    itself (credentials, where one excludes another)."""

    flag: str
    help: str
    type: Any = str
    env: str | None = None
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    bounds: str | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    group: str | None = None
    field: str | None = None
    check: Callable[[Any, str], Any] | None = None
    usage_error: bool | None = None
    read: bool = True
    doc: str | None = None
    shown: str | None = None
    shown_default: str = ""

    @property
    def dest(self) -> str:
        """The argparse attribute (and, unless ``field`` says otherwise, the config field)."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def key(self) -> str:
        return self.field or self.dest

    @property
    def typed_by_argparse(self) -> bool:
        return self.usage_error if self.usage_error is not None else self.env is None


def add_settings(parser: argparse.ArgumentParser, settings: Iterable[Setting],
                 groups: Mapping[str, str] | None = None) -> None:
    """Add every setting to ``parser``, under its group's title (``groups``: key -> title)."""
    made: dict[str, Any] = {}
    for s in settings:
        target: Any = parser
        if s.group is not None:
            if s.group not in made:
                made[s.group] = parser.add_argument_group((groups or {}).get(s.group, s.group))
            target = made[s.group]
        env = f"{s.env}=1/0" if s.type == SWITCH else s.env
        help_text = f"{s.help} (env {env})" if s.env and s.env not in s.help else s.help
        if s.type == SWITCH:
            # None: not given, so that its variable can stand in
            target.add_argument(s.flag, action="store_true", default=None if s.env else False, help=help_text)
            continue
        kwargs: dict[str, Any] = {"help": help_text, "metavar": s.metavar}
        if s.choices:
            kwargs["choices"] = s.choices
        if s.typed_by_argparse:
            kwargs["type"] = s.type
        target.add_argument(s.flag, **kwargs)


def resolve(settings: Iterable[Setting], ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Every setting's value: the flag, else its variable (empty counts as unset), else its
    default; typed, bounds-checked and ``check``-ed once. Keys are the config field names."""
    return {s.key: value_of(s, getattr(ns, s.dest, None), env) for s in settings if s.read}


def value_of(s: Setting, flag_value: Any, env: Mapping[str, str]) -> Any:
    """One setting's value (see :func:`resolve`); ConfigError names the flag or the variable."""
    if flag_value is not None:
        source, raw = s.flag, flag_value
    elif s.env is not None and env.get(s.env, "") != "":
        source, raw = s.env, env[s.env]
    else:
        return s.default
    if s.type == SWITCH:
        value: Any = raw if isinstance(raw, bool) else _switch(raw, source)
    else:
        value = _typed(s, raw, source)
        _check_bounds(s, value, source, raw)
    return s.check(value, source) if s.check is not None else value


def _switch(raw: str, source: str) -> bool:
    text = raw.strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise ConfigError(f"{source}: must be 1/true/yes or 0/false/no, got {raw!r}")


def _typed(s: Setting, raw: Any, source: str) -> Any:
    if not isinstance(raw, str):
        return raw  # argparse typed it already
    if s.choices and raw not in s.choices:
        raise ConfigError(f"{source}: must be one of {', '.join(s.choices)}, got {raw!r}")
    try:
        return s.type(raw)
    except ValueError:
        what = {int: "a whole number", float: "a number"}.get(s.type, "a value")
        raise ConfigError(f"{source}: expected {what}, got {raw!r}") from None


def _check_bounds(s: Setting, value: Any, source: str, raw: Any) -> None:
    if s.type is float and not math.isfinite(value):
        raise ConfigError(f"{source}: must be a finite number, got {raw!r}")
    if s.lo is None and s.hi is None:
        return
    above = s.lo is None or (value > s.lo if s.lo_open else value >= s.lo)
    if above and (s.hi is None or value <= s.hi):
        return
    raise ConfigError(f"{source}: must be {s.bounds or bounds_text(s)}, got {number(value)}")


def bounds_text(s: Setting) -> str:
    """``0..65535``, ``>= 1``, ``> 0``, ``> 0 and at most 3600``: how an error and the README say it."""
    lo, hi = (None if b is None else number(b) for b in (s.lo, s.hi))
    if lo is not None and hi is not None:
        return f"> {lo} and at most {hi}" if s.lo_open else f"{lo}..{hi}"
    if lo is not None:
        return f"> {lo}" if s.lo_open else f">= {lo}"
    return f"at most {hi}"


def number(value: float) -> str:
    """``2592000`` and ``0.2``, not ``2.592e+06`` and ``0.20000``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def markdown_rows(settings: Iterable[Setting]) -> list[str]:
    """The README's table, one row per setting: flag (with metavar), variable, meaning."""
    rows = ["| flag | variable | meaning |", "|---|---|---|"]
    for s in settings:
        shown = s.shown or (s.flag if s.type == SWITCH else f"{s.flag} {s.metavar or s.dest.upper()}")
        var = f"`{s.env}`" + (" (`1`/`0`)" if s.type == SWITCH else "") if s.env else ""
        rows.append(_row(f"`{shown}`", var, s.doc or s.help))
    return rows



def markdown_default_rows(settings: Iterable[Setting], title: str = "flag") -> list[str]:
    """docs/operations.md's style: ``flag`` (what it does) | variable | default."""
    rows = [f"| {title} | variable | default |", "|---|---|---|"]
    for s in settings:
        text = s.help if s.doc is None else s.doc
        flag = f"`{s.shown or s.flag}`" + (f" ({text})" if text else "")
        var = f"`{s.env}`" + (" (`1`/`0`)" if s.type == SWITCH else "") if s.env else ""
        rows.append(_row(flag, var, s.shown_default))
    return rows


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |" if all(cells) else "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
