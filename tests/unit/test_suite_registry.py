"""The registry suites' fleet runs carry the suite's environment variables (``--dt-env``), so the
workers' pytest sees what the local runs see (benchmarks/plugin_suites.py, shipped_suites.py)."""

from pathlib import Path

from distributed_testing.testing.suites import SUITES, Suite, outcomes


def test_fleet_args_send_the_suites_env_by_name() -> None:
    suite = Suite("x", "x==1", (), ("tests", "-q"), env={"FAST": "1", "MODE": "ci"})
    assert suite.fleet_args == ("tests", "-q", "--dt-env", "FAST", "--dt-env", "MODE")


def test_fleet_args_without_env_are_the_suites_args() -> None:
    for suite in SUITES.values():
        if not suite.env:
            assert suite.fleet_args == suite.args


def test_outcomes_count_every_case_of_a_name(tmp_path: Path) -> None:
    """Items that share a node id (docopt-ng's) are JUnit cases of one name: each is compared, so a
    run with one more of them, or another outcome for one, differs."""
    case = '<testcase classname="t" name="shared">{}</testcase>'
    junit = tmp_path / "r.xml"
    junit.write_text(f"<testsuites><testsuite>{case.format('')}{case.format('<failure/>')}"
                     f"{case.format('')}</testsuite></testsuites>")
    assert outcomes(junit) == {"t::shared": "passed", "t::shared #2": "failed", "t::shared #3": "passed"}
