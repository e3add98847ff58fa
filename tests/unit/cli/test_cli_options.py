"""The settings tables (cli/worker_options.py, cli/coordinator_options.py) against what users
read: README.md's and docs/operations.md's option tables are the generated ones, ``--help``
lists exactly the table's flags with their variables, the table's defaults are the config's; and
the table engine itself (precedence, typing, bounds, errors naming the flag or variable)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.cli import coordinator as coord_cli
from distributed_testing.cli import dashboard as dash_cli
from distributed_testing.cli import worker as worker_cli
from distributed_testing.cli.coordinator_options import COORDINATOR_SETTINGS
from distributed_testing.cli.options import SWITCH, Setting, add_settings, resolve
from distributed_testing.cli.worker_options import WORKER_SETTINGS
from distributed_testing.config import CoordinatorConfig, WorkerConfig
from distributed_testing.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
PROGRAMS = [(worker_cli.build_parser, WORKER_SETTINGS, WorkerConfig, ROOT / "README.md", "worker"),
            (coord_cli.build_parser, COORDINATOR_SETTINGS, CoordinatorConfig, ROOT / "docs" / "operations.md",
             "coordinator"),
            # the dashboard's values go to DashboardConfig, a host and a port: no one config class
            (dash_cli.build_parser, dash_cli.DASHBOARD_SETTINGS, None, ROOT / "README.md", "dashboard")]
IDS = [p[-1] for p in PROGRAMS]
NOT_IN_TABLE = {"-h", "--help", "--log-level"}  # argparse's own, and cli/common.py's (every program)


def _gen_script() -> Any:
    spec = importlib.util.spec_from_file_location("gen_options", ROOT / "scripts" / "gen_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doc_flags(path: Path, name: str) -> list[str]:
    """The flags in the first column of a committed options table, in order."""
    block = path.read_text().split(f"<!-- options:{name} -->\n")[1].split(f"<!-- /options:{name} -->")[0]
    return [re.match(r"\| `(--[a-z0-9-]+)", line).group(1) for line in block.splitlines()[2:]]  # type: ignore[union-attr]


def test_the_committed_tables_are_the_generated_ones() -> None:
    for path, text in _gen_script().generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python scripts/gen_options.py"


@pytest.mark.parametrize(("build", "settings", "config", "doc", "name"), PROGRAMS, ids=IDS)
def test_readme_help_and_table_list_the_same_flags(build: Any, settings: tuple[Setting, ...], config: Any,
                                                   doc: Path, name: str) -> None:
    table = [s.flag for s in settings]
    parser = build()
    in_help = [o for a in parser._actions for o in a.option_strings if o not in NOT_IN_TABLE]
    assert len(set(table)) == len(table)
    assert in_help == table
    assert _doc_flags(doc, name) == table
    helps = {o: a.help or "" for a in parser._actions for o in a.option_strings}
    text = parser.format_help()
    for s in settings:
        assert s.flag in text
        if s.env:  # each variable is named in its flag's help
            assert s.env in helps[s.flag], (s.flag, s.env)


@pytest.mark.parametrize(("build", "settings", "config", "doc", "name"), PROGRAMS[:2], ids=IDS[:2])
def test_each_row_names_a_config_field_with_the_same_default(build: Any, settings: tuple[Setting, ...],
                                                             config: Any, doc: Path, name: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(config)}
    for s in settings:
        if not s.read:
            continue
        assert s.key in fields, s.flag
        default = fields[s.key].default
        if s.key == "coordinator_urls":  # () stands for (coordinator_url,)
            default = WorkerConfig().urls
        if s.default is not None and default is not dataclasses.MISSING:
            assert s.default == default, s.flag


TABLE = (
    Setting("--count", type=int, env="DT_COUNT", lo=1, hi=9, default=3, help="a count"),
    Setting("--wait", type=float, lo=0, lo_open=True, default=1.5, help="seconds"),
    Setting("--on", type=SWITCH, env="DT_ON", default=False, help="a switch"),
    Setting("--mode", env="DT_MODE", choices=("a", "b"), default="a", help="a choice"),
)


def _read(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    add_settings(p, TABLE)
    return resolve(TABLE, p.parse_args(list(argv)), env or {})


def test_flag_wins_over_variable_wins_over_default() -> None:
    assert _read() == {"count": 3, "wait": 1.5, "on": False, "mode": "a"}
    assert _read(env={"DT_COUNT": "5", "DT_ON": "yes", "DT_MODE": "b"}) == {"count": 5, "wait": 1.5, "on": True,
                                                                           "mode": "b"}
    assert _read("--count", "7", "--on", env={"DT_COUNT": "5", "DT_ON": "0"})["count"] == 7
    assert _read(env={"DT_COUNT": ""})["count"] == 3  # empty counts as unset


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--count", "0"], {}, "--count: must be 1..9, got 0"),
    ([], {"DT_COUNT": "10"}, "DT_COUNT: must be 1..9, got 10"),
    ([], {"DT_COUNT": "2.5"}, "DT_COUNT: expected a whole number, got '2.5'"),
    (["--wait", "0"], {}, "--wait: must be > 0, got 0"),
    (["--wait", "nan"], {}, "--wait: must be a finite number, got nan"),
    ([], {"DT_ON": "maybe"}, "DT_ON: must be 1/true/yes or 0/false/no, got 'maybe'"),
    ([], {"DT_MODE": "c"}, "DT_MODE: must be one of a, b, got 'c'"),
])
def test_bad_values_name_the_flag_or_the_variable(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _read(*argv, env=env)
    assert str(info.value) == message


def test_a_flag_without_a_variable_is_typed_by_argparse() -> None:
    with pytest.raises(SystemExit):
        _read("--wait", "soon")


def test_a_profile_presets_only_settings_without_a_default() -> None:
    """config_from_args lays given values over the profile's: a row with a default would always
    beat the profile, so every preset setting defaults to None (not given)."""
    from distributed_testing.worker.limits import PROFILES, profile_settings

    defaults = {s.key: s.default for s in WORKER_SETTINGS}
    for name in PROFILES:
        for key in profile_settings(name, 4):
            assert defaults[key] is None, (name, key)


def test_dt_lists_exactly_its_table_before_the_subcommands() -> None:
    from distributed_testing.cli import dt

    parser = dt.build_parser()
    assert [o for a in parser._actions for o in a.option_strings if o not in NOT_IN_TABLE] == \
        [s.flag for s in dt.DT_SETTINGS]
