"""Suites nobody here wrote, taken from the registry as sdists, run through two bundle workers give
the per-test outcomes of local pytest with the same options, with no file written by hand.

* toolz 1.2.0 with ``-p no:asyncio``: pytest-asyncio is installed beside the submitter's pytest
  and breaks toolz's collection unless turned off; the option has to reach the workers, and the
  workers' own plugins must not load (193 errors before).
* pyparsing 3.2.3: ``test_diagram`` writes HTML files into the tree (read-only before: 5 failures),
  and its tests need railroad-diagrams and jinja2, which the workers' Python lacks: they travel
  with the run as the submitter's environment.
* tomlkit 0.15.2: ``test_toml_file`` rewrites a shipped TOML fixture (its files were read-only
  links into the blob cache before: PermissionError).
* toolz again, with a ``requirements.txt`` at its root that names a package no index has: a
  project's own file (kept for other uses: glom's pins an older pytest) does not replace the
  environment the plugin runs in (before, the workers installed the file instead: every test an
  error).

The submitter's environment is a virtual environment with the suite's test dependencies installed
(distributed_testing/testing/suite_registry.py); the workers run from this interpreter, in bwrap.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import SUITES, fetch, run_pytest, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]


@pytest.mark.parametrize(("name", "own_requirements"), [("toolz", False), ("pyparsing", False), ("tomlkit", False),
                                                      ("toolz", True)])
async def test_a_registry_suite_through_two_bundle_workers_matches_local_pytest(tmp_path: Path, name: str,
                                                                               own_requirements: bool) -> None:
    suite = SUITES[name]
    tree = await asyncio.to_thread(fetch, suite, tmp_path / "sdist")
    if own_requirements:
        (tree / "requirements.txt").write_text("dt-no-such-distribution-anywhere==0.0.1\n")
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", list(suite.requirements))
    local = await asyncio.to_thread(run_pytest, python, tree, list(suite.args), tmp_path / "local.xml")
    assert local.outcomes and "passed" in local.outcomes.values(), local.output[-3000:]
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        remote = await asyncio.to_thread(run_pytest, python, tree, [*suite.args, "--dt-coordinator", c.base_url],
                                         tmp_path / "remote.xml", {"DT_API_KEY": key})
    differ = {t: (o, remote.outcomes.get(t)) for t, o in local.outcomes.items() if remote.outcomes.get(t) != o}
    assert not differ and remote.outcomes.keys() == local.outcomes.keys(), (sorted(differ.items())[:20],
                                                                            remote.output[-4000:])
