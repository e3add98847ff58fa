"""The deployment files in deploy/ hold what docs/operations.md ("Containers", "Service units") says.

The container tier (``bash scripts/test.sh --containers``) builds the image and runs the compose
group; these checks need no container engine: the service units pass ``systemd-analyze verify``
with nothing to say, each unit's stop timeout leaves a worker its drain, the image's entry point
starts the program its first argument names (a real shell run over stand-in programs), the
compose group is the operations guide's HA example, and deploy/seccomp_for_bwrap.py allows what
bubblewrap needs and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


def _unit(path: Path) -> dict[str, str]:
    """``Key=value`` settings of a unit (continuation lines joined; the last of a key wins)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_units_pass_systemd_analyze_verify_with_nothing_to_say(tmp_path: Path) -> None:
    # verify also checks that ExecStart's program exists: point it at this interpreter's programs
    bindir = Path(sys.executable).parent
    assert (bindir / "dt-worker").exists() and (bindir / "dt-coordinator").exists()
    for unit in UNITS:
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/dt/bin", str(bindir)))
    done = subprocess.run(["systemd-analyze", "verify", *sorted(map(str, tmp_path.iterdir()))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_a_stopped_worker_unit_drains_its_tasks_before_systemd_kills_them() -> None:
    worker = _unit(DEPLOY / "systemd" / "dt-worker.service")
    drain = int(re.search(r"DT_DRAIN_TIMEOUT=(\d+)", (DEPLOY / "systemd" / "dt-worker.service").read_text())[1])
    assert worker["KillSignal"] == "SIGTERM"
    assert worker["KillMode"] == "mixed"  # SIGTERM to the worker alone: its tasks go on while it drains
    assert int(worker["TimeoutStopSec"]) > drain + 60  # the drain, plus the 60 s a stop may overrun it
    assert worker["LoadCredential"].startswith("worker.key:")
    assert "\nEnvironment=DT_API_KEY_FILE=%d/worker.key\n" in (DEPLOY / "systemd" / "dt-worker.service").read_text()
    for unit in UNITS:
        s = _unit(unit)
        assert s["User"] == "dt" and s["StateDirectory"] and s["Restart"] == "on-failure", unit.name
    assert re.search(r"^u dt ", (DEPLOY / "systemd" / "dt.sysusers.conf").read_text(), re.M)


def _fake_programs(tmp_path: Path) -> dict[str, str]:
    for name in ("dt-coordinator", "dt-worker", "dt-dashboard", "dt"):
        p = tmp_path / name
        p.write_text(f'#!/bin/sh\necho "{name} $* metrics=${{DT_METRICS_PORT:-unset}}"\n')
        p.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


@pytest.mark.parametrize(("argv", "said"), [
    (["coordinator", "--port", "9"], "dt-coordinator --port 9 metrics=unset"),
    ([], "dt-coordinator  metrics=unset"),
    (["worker", "--accept-bundles"], "dt-worker --accept-bundles metrics=9100"),
    (["dashboard"], "dt-dashboard  metrics=unset"),
    (["dt", "workers"], "dt workers metrics=unset"),
    (["echo", "anything else"], "anything else"),
])
def test_the_entry_point_runs_the_program_its_first_argument_names(tmp_path: Path, argv: list[str],
                                                                  said: str) -> None:
    done = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), *argv], capture_output=True, text=True,
                          env=_fake_programs(tmp_path), timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == said


def test_the_entry_point_keeps_an_operators_metrics_port_for_the_worker(tmp_path: Path) -> None:
    env = {**_fake_programs(tmp_path), "DT_METRICS_PORT": "9200"}
    done = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), "worker"], capture_output=True, text=True, env=env,
                          timeout=30)
    assert done.stdout.strip() == "dt-worker  metrics=9200"


def test_the_compose_group_is_the_operations_guides_ha_example() -> None:
    yaml = pytest.importorskip("yaml")
    group = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = group["services"]
    assert set(services) == {"postgres", "coordinator-a", "coordinator-b", "dashboard", "worker-1", "worker-2"}
    for name in ("coordinator-a", "coordinator-b"):
        c = services[name]
        assert c["environment"]["DT_COORDINATOR_DB"] == "postgresql://dt@postgres:5432/dt"  # one database
        assert c["command"][:3] == ["coordinator", "--advertise-url", f"http://{name}:8080"]
    members = "http://coordinator-a:8080,http://coordinator-b:8080"
    for name in ("worker-1", "worker-2"):
        w = services[name]
        assert w["environment"]["DT_COORDINATOR_URL"] == members
        assert w["environment"]["DT_API_KEY_FILE"] == "/run/secrets/worker_key" and w["secrets"] == ["worker_key"]
        assert "--high-availability" in w["command"] and "--accept-bundles" in w["command"]
        drain = int(w["command"][w["command"].index("--drain-timeout") + 1])
        assert int(w["stop_grace_period"].rstrip("s")) > drain + 60
    assert services["dashboard"]["environment"]["DT_COORDINATOR_URL"] == members
    for engine in ("podman", "docker"):
        extra = yaml.safe_load((DEPLOY / f"compose.{engine}.yaml").read_text())["services"]
        assert set(extra) == {"worker-1", "worker-2"}  # only the workers make sandboxes


def _seccomp(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPLOY / "seccomp_for_bwrap.py"), *argv], capture_output=True,
                          text=True, timeout=30)


def test_the_seccomp_rewrite_allows_bwraps_calls_and_leaves_every_other_rule(tmp_path: Path) -> None:
    profile = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 0, "value": 2114060288, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
        {"names": ["mount", "unshare", "setns", "umount2", "pivot_root"], "action": "SCMP_ACT_ALLOW",
         "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    ]}
    (tmp_path / "default.json").write_text(json.dumps(profile))
    done = _seccomp(str(tmp_path / "default.json"))
    assert done.returncode == 0, done.stderr
    rules = json.loads(done.stdout)["syscalls"]
    assert rules[0] == profile["syscalls"][0]
    assert rules[1] == {"names": ["setns"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}}
    assert rules[2]["names"] == ["clone", "unshare", "mount", "umount2", "pivot_root"]
    assert rules[2]["action"] == "SCMP_ACT_ALLOW" and rules[2]["args"] == [] and "includes" not in rules[2]
    assert len(rules) == 3


def test_the_seccomp_rewrite_refuses_what_is_no_profile(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"names": []}')
    done = _seccomp(str(tmp_path / "x.json"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"seccomp_for_bwrap.py: {tmp_path / 'x.json'}: not a seccomp profile: no " \
                                  "defaultAction or no syscalls list"
    assert _seccomp(str(tmp_path / "missing.json")).returncode == 2


def test_podmans_default_profile_is_allowed_what_bwrap_needs_already() -> None:
    # why compose.podman.yaml names no seccomp profile: podman's default allows these calls
    path = Path("/usr/share/containers/seccomp.json")
    if not path.exists():
        pytest.skip("podman's default seccomp profile is not installed here")
    allowed = {n for r in json.loads(path.read_text())["syscalls"] if r["action"] == "SCMP_ACT_ALLOW"
               and not r.get("args") and not r.get("includes") for n in r["names"]}
    assert {"clone", "unshare", "mount", "umount2", "pivot_root"} <= allowed
    assert os.path.exists(DEPLOY / "compose.podman.yaml")
