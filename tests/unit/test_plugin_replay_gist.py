"""The one line each test of a task that failed as a whole gets (``plugin/replay.py``'s ``_gist``):
the task's reason with the cause its output ends with, so pytest's short summary says why."""

from distributed_testing.plugin.replay import _gist

# a worker's error for a task whose environment names a distribution with no wheel (pygments'
# wcag-contrast-ratio: the workers install wheels only)
PIP = ("installing the task's Python requirements failed (pip install exit code 1):\n"
       "Collecting pytest==9.2.0\n  Downloading pytest-9.2.0-py3-none-any.whl (411 kB)\n"
       "ERROR: Could not find a version that satisfies the requirement wcag-contrast-ratio==0.9 (from versions: none)\n"
       "ERROR: No matching distribution found for wcag-contrast-ratio==0.9\n(after 0.9 s)")


def test_a_pip_failure_names_what_pip_could_not_install() -> None:
    assert _gist(PIP) == ("installing the task's Python requirements failed (pip install exit code 1): "
                          "No matching distribution found for wcag-contrast-ratio==0.9")


def test_a_usage_error_gets_its_exception_and_a_plain_reason_stays_as_it_is() -> None:
    assert _gist("pytest exit code 4 (usage error):\nE   ValueError: bad\n") == \
        "pytest exit code 4 (usage error): ValueError: bad"
    assert _gist("no connected worker can run it for 30 s\nERROR: unrelated") == "no connected worker can run it for 30 s"
