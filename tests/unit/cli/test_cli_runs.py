"""A run's name and labels from each CI system's variables (``cli/runs.py``), and its line."""

from __future__ import annotations

import pytest

from distributed_testing.cli import runs


@pytest.mark.parametrize(("env", "name", "labels"), [
    ({"GITHUB_WORKFLOW": "tests", "GITHUB_JOB": "unit", "GITHUB_RUN_NUMBER": "41", "GITHUB_SHA": "3f2a9c1d0e4b5a6f",
      "GITHUB_REF_NAME": "main"}, "tests unit 41 3f2a9c1d0e4b", {"commit": "3f2a9c1d0e4b5a6f", "branch": "main"}),
    ({"CI_JOB_NAME": "pytest", "CI_PIPELINE_ID": "977", "CI_COMMIT_SHORT_SHA": "a1b2c3d4",
      "CI_COMMIT_SHA": "a1b2c3d4e5f6", "CI_COMMIT_REF_NAME": "feature/x"},
     "pytest 977 a1b2c3d4", {"commit": "a1b2c3d4e5f6", "branch": "feature/x"}),
    ({"BUILDKITE_PIPELINE_SLUG": "gpu-suite", "BUILDKITE_BUILD_NUMBER": "12", "BUILDKITE_COMMIT": "ffeeddccbbaa99",
      "BUILDKITE_BRANCH": "release"}, "gpu-suite 12 ffeeddccbbaa", {"commit": "ffeeddccbbaa99", "branch": "release"}),
    ({"JOB_NAME": "nightly", "BUILD_NUMBER": "7", "GIT_COMMIT": "0123456789abcdef", "GIT_BRANCH": "origin/main"},
     "nightly 7 0123456789ab", {"commit": "0123456789abcdef", "branch": "origin/main"}),
    ({"HOME": "/root"}, None, {}),
])
def test_each_ci_systems_variables_name_the_run(env: dict[str, str], name: str | None, labels: dict[str, str]) -> None:
    assert runs.ci_name(env) == name
    assert runs.ci_labels(env) == labels
    assert runs.run_name(None, env, "tasks.json") == (name or "tasks.json")
    assert runs.run_name("given", env, "tasks.json") == "given"  # --run-name wins


def test_the_run_line_links_the_dashboard_page_or_the_rest_path() -> None:
    run = {"run_id": "run-0123456789ab", "name": "ci"}
    assert runs.run_line(run, "http://h:8080/dashboard/", "http://c") == \
        "run run-0123456789ab (ci): http://h:8080/dashboard/runs/run-0123456789ab"
    assert runs.run_line(run, None, "http://c:8080") == "run run-0123456789ab (ci): http://c:8080/api/v1/runs/run-0123456789ab"
    assert runs.derived_id("x" * 128, "run-0123456789ab") == "x" * 115 + "@0123456789ab"
