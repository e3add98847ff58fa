"""The worker says at start which confinement its task children get, and why (issue 36, item 2).

``confine.describe`` makes the ``confinement: ...`` line ``for_worker`` logs: the user the
children run as (a root worker switches them to uid 65534; another keeps its uid, in user
namespaces it makes unprivileged), the container the worker runs in, and, where bwrap fails in
one, the engine's options that let it work (deploy/compose.podman.yaml, compose.docker.yaml).
The container tier (``scripts/test.sh --containers``) checks the line in a real container.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.worker import confine, sandbox

ROOT = Path(__file__).resolve().parents[3]


def test_a_root_worker_says_its_children_switch_to_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "container", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert confine.describe(None) == ("confinement: bubblewrap as root: task children switch to uid 65534 "
                                      "(setpriv), without capabilities")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or sandbox.available() is not None,
                    reason="needs root (to start a worker-like process as another user), setpriv and bwrap")
def test_a_worker_that_is_not_root_makes_its_sandbox_in_user_namespaces_and_says_so() -> None:
    # a real probe as uid 65534: the sandbox works unprivileged here, and the line says how
    code = ("from distributed_testing.worker import confine, sandbox\n"
            "print(confine.describe(sandbox.available()))")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("confinement: bubblewrap as uid 65534")
    assert "keep that uid, without capabilities, in user namespaces" in line


def test_in_a_podman_container_where_bwrap_fails_it_names_the_option_that_lets_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "container", lambda: "podman")
    line = confine.describe("bwrap cannot make a sandbox here: bwrap: Can't mount proc on /newroot/proc")
    assert line.startswith("confinement: none in a podman container: bwrap cannot make a sandbox here")
    assert line.endswith("run it with --security-opt unmask=/proc/* (deploy/compose.podman.yaml)")


def test_in_a_container_of_unknown_kind_it_names_both_engines_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "container", lambda: "a container")
    line = confine.describe("bwrap cannot make a sandbox here")
    assert "in a container:" in line and "unmask=/proc/*" in line and "systempaths=unconfined" in line


def test_outside_a_container_a_missing_bwrap_is_the_reason_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "container", lambda: None)
    assert confine.describe("bwrap is not installed") == "confinement: none: bwrap is not installed"
    assert confine.describe(None, "none") == "confinement: none, the operator's --sandbox none"


def test_the_named_options_files_exist() -> None:
    for text in confine.CONTAINER_OPTIONS.values():
        for word in text.replace("(", " ").replace(")", " ").replace(",", " ").replace(":", " ").split():
            if word.startswith("deploy/"):
                assert (ROOT / word).exists(), word
