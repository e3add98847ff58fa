"""The rules for submitter-controlled code on workers: user-model module prefixes and the
``test_args`` allow-list (pure functions; the attacks over sockets live in
tests/integration/flags/test_flags_worker_trust.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.errors import ConfigError, ValidationError
from distributed_testing.tasks import spec as specs
from distributed_testing.tasks.pytest_args import parse_test_options, refused_test_args
from distributed_testing.tasks.usercode import (
    definition_refusal,
    model_module,
    module_allowed,
    parse_module_prefixes,
    refusal,
)


@pytest.mark.parametrize(("module", "allowed"), [
    ("mypkg.models", True), ("mypkg.models.sub", True), ("mypkg.modelsX", False), ("mypkg", False),
    ("os", False), ("torchvision.models.resnet", True),
])
def test_prefixes_match_on_dotted_boundaries(module: str, allowed: bool) -> None:
    assert module_allowed(module, ("mypkg.models", "torchvision.models")) is allowed


def test_refusal_names_the_module_and_the_flag() -> None:
    reason = refusal("os:system", ())
    assert reason is not None and "'os'" in reason and "--allow-model-modules os" in reason
    assert refusal("mypkg.models.a:make", ("mypkg.models",)) is None
    assert "not a dotted module name" in (refusal(".rel:make", ("",)) or "")


@pytest.mark.parametrize("name", ["mymodels:torch.os.system", "mymodels:a.b", "mymodels:", "mymodels:1x"])
def test_the_part_after_the_colon_is_one_name(name: str) -> None:
    assert "must be one name" in (refusal(name, ("mymodels",)) or "")


class Defined:
    pass


def defined() -> None:
    pass


def test_a_model_must_be_a_class_or_function_defined_in_an_allowed_module() -> None:
    import os

    here = (__name__,)
    assert definition_refusal("m:Defined", Defined, here) is None
    assert definition_refusal("m:defined", defined, here) is None
    assert "a builtin_function_or_method, not a class or function" in (definition_refusal("m:system", os.system, here)
                                                                       or "")
    imported = definition_refusal("m:Path", Path, here) or ""
    assert "is not defined in an allowed module" in imported and "from module 'pathlib'" in imported
    assert "not a class or function" in (definition_refusal("m:x", print, here) or "")
    assert "from module" in (definition_refusal("m:defined", defined, ("elsewhere",)) or "")


def test_model_module_only_for_user_models() -> None:
    assert model_module(True, {"model": "os:system"}) == "os"
    assert model_module(True, {"model": "pkg.m:factory"}) == "pkg.m"
    assert model_module(True, {"model": "bert-base-uncased"}) is None
    assert model_module(True, {"model": "mlp"}) is None
    assert model_module(False, {"test_file": "a:b"}) is None


def test_flag_values_are_checked() -> None:
    assert parse_module_prefixes(" a.b , c ,a.b", "--allow-model-modules") == ("a.b", "c")
    with pytest.raises(ConfigError, match="--allow-model-modules: 'a/b' is not a dotted module name"):
        parse_module_prefixes("a/b", "--allow-model-modules")
    assert parse_test_options("junitxml,--debug,p", "X") == ("--junitxml", "--debug", "-p")
    with pytest.raises(ConfigError, match="DT_ALLOW_TEST_OPTIONS: '-k' is not a guarded pytest option"):
        parse_test_options("-k", "DT_ALLOW_TEST_OPTIONS")


@pytest.mark.parametrize("args", [
    ["--batch-size", "4"], ["-k", "fast and not slow", "-xvs", "-ra"], ["--tb=short", "--maxfail", "2"],
    ["sub/test_a.py::test_x", "--", "sub"], ["--name=/abs/value/of/a/conftest/option"], ["--maxfail", "-1"],
    ["--deselect", "sub/test_a.py::test_y"],
])
def test_safe_arguments_pass(tmp_path: Path, args: list[str]) -> None:
    assert refused_test_args(args, root=tmp_path) == []


def test_own_plugin_options_are_refused_at_submit_too() -> None:
    assert any("own pytest plugin" in e for e in refused_test_args(["--dt-coordinator=http://x:1"], root=None))
    assert refused_test_args(["--", "-pthis"], root=None) == []  # -p is left to the worker, which knows what it allows
    assert refused_test_args(["--", "-p", "this"], allowed=("-p",), root=Path("/")) == []


@pytest.mark.parametrize(("args", "needle"), [
    (["/etc/passwd"], "outside the test root"),
    (["../x/test_a.py"], "outside the test root"),
    (["--", "/etc"], "outside the test root"),
    (["--conftest-flag", "/etc/test_a.py"], "outside the test root"),
    (["--ignore", "/etc"], "outside the test root"),
    (["--debug=/tmp/x"], "--allow-test-options --debug"),
    (["--debug", "x"], "--allow-test-options --debug"),
    (["-pno:foo"], "--allow-test-options -p"),
    (["-xpfoo"], "--allow-test-options -p"),
    (["-o", "cache_dir=/x"], "--allow-test-options -o"),
    (["--rootdir=/"], "--allow-test-options --rootdir"),
    (["-c", "/etc/x.ini"], "--allow-test-options -c"),
    (["-W", "error::mod.Warn"], "--allow-test-options -W"),
    (["--junitxml", "/tmp/x.xml"], "--allow-test-options --junitxml"),
    (["-k", "@args.txt"], "read arguments from that file"),
    (["-Z"], "-Z is not a pytest option"),
    (["--", "-pthis"], "--allow-test-options -p"),  # pytest scans for -p after '--' too
    (["-x", "--", "-p", "this"], "--allow-test-options -p"),
    (["--dt-coordinator=http://evil:1"], "own pytest plugin"),
    (["--dt-api-key", "k"], "own pytest plugin"),
])
def test_escapes_and_guarded_options_are_refused(tmp_path: Path, args: list[str], needle: str) -> None:
    errors = refused_test_args(args, root=tmp_path)
    assert errors and needle in errors[0], errors


def test_guarded_option_passes_when_allowed_and_its_value_is_skipped(tmp_path: Path) -> None:
    assert refused_test_args(["--debug", "debug.log"], allowed=["--debug"], root=tmp_path) == []
    # an allowed option does not hide the next option from the check
    assert refused_test_args(["--debug", "-p", "evil"], allowed=["--debug"], root=tmp_path)


def test_symlink_escape_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    assert "outside the test root" in refused_test_args(["link/test_a.py"], root=root)[0]


def test_submit_refuses_what_no_worker_runs() -> None:
    bad = [
        {"type": "test", "config": {"test_file": "../t.py"}},
        {"type": "test", "config": {"test_file": "t.py", "test_args": ["@f", "-Z", "../../x"]}},
        {"type": "benchmark", "config": {"model": "a/b:make"}},
        {"type": "test", "config": {"test_file": "-pevil"}},
    ]
    with pytest.raises(ValidationError) as info:
        specs.parse_tasks(bad)
    fields = [e["field"] for e in info.value.errors]
    assert fields == ["[0].config.test_file", "[1].config.test_args", "[1].config.test_args",
                      "[1].config.test_args", "[2].config.model", "[3].config.test_file"]
    # the worker decides on guarded options and absolute paths (it knows its root and permissions)
    ok = {"type": "test", "config": {"test_file": "/srv/t.py", "test_args": ["--debug=x", "--batch-size", "4"]}}
    assert len(specs.parse_tasks(ok)) == 1
    assert len(specs.parse_task_json(b'{"type":"test","config":{"test_file":"t.py","test_args":["-xq"]}}')) == 1
