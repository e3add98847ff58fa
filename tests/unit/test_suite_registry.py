"""The registry suites' fleet runs carry the suite's environment variables (``--dt-env``), so the
workers' pytest sees what the local runs see (benchmarks/plugin_suites.py, shipped_suites.py)."""

from distributed_testing.testing.suites import SUITES, Suite


def test_fleet_args_send_the_suites_env_by_name() -> None:
    suite = Suite("x", "x==1", (), ("tests", "-q"), env={"FAST": "1", "MODE": "ci"})
    assert suite.fleet_args == ("tests", "-q", "--dt-env", "FAST", "--dt-env", "MODE")


def test_fleet_args_without_env_are_the_suites_args() -> None:
    for suite in SUITES.values():
        if not suite.env:
            assert suite.fleet_args == suite.args
