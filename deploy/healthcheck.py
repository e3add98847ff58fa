#!/opt/dt/bin/python
"""The image's HEALTHCHECK: asks the program this container runs whether it answers.

It finds the program among PID 1's children (dt-coordinator, dt-worker or dt-dashboard), reads
the port from that process's own flags and DT_* variables, and asks:

* a coordinator: ``GET /healthz`` (no credential; https when it serves TLS, its certificate not
  checked: this is the container asking itself);
* a dashboard: ``GET /login``;
* a worker: ``GET /metrics`` on its ``--metrics-port`` (dt-entrypoint sets 9100 on 127.0.0.1), and
  prints whether it is registered with a coordinator. A worker waiting for a coordinator is
  healthy: it reconnects by itself, and restarting it would only lose its running tasks.

Exit 0 when the program answers 200, 1 otherwise (one line on stdout either way).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request
from pathlib import Path

PROGRAMS = {"dt-coordinator": ("DT_COORDINATOR_PORT", "8080", "/healthz"),
            "dt-dashboard": ("DT_DASHBOARD_PORT", "8081", "/login"),
            "dt-worker": ("DT_METRICS_PORT", "", "/metrics")}


def _program() -> tuple[str, list[str], dict[str, str]] | None:
    """(name, argv, environment) of the dt program under PID 1, or None."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            env_raw = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if ppid != "1" and proc.name != "1":
            continue
        for arg in argv[:2]:
            name = os.path.basename(arg)
            if name in PROGRAMS:
                env = dict(e.split("=", 1) for e in env_raw if "=" in e)
                return name, argv, env
    return None


def _flag(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``; the last one wins)."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def main() -> int:
    found = _program()
    if found is None:
        print("unhealthy: no dt-coordinator, dt-worker or dt-dashboard runs under PID 1")
        return 1
    name, argv, env = found
    variable, default, path = PROGRAMS[name]
    flag = "--metrics-port" if name == "dt-worker" else "--port"
    port = _flag(argv, flag) or env.get(variable) or default
    if not port or port == "0":
        print(f"{name}: no fixed {flag} to ask (set {variable})")
        return 1
    host = "127.0.0.1"
    if name == "dt-worker":
        bound = _flag(argv, "--metrics-host") or env.get("DT_METRICS_HOST", "127.0.0.1")
        host = "127.0.0.1" if bound in ("0.0.0.0", "::", "") else bound
    tls = name == "dt-coordinator" and bool(_flag(argv, "--tls-cert") or env.get("DT_TLS_CERT"))
    url = f"{'https' if tls else 'http'}://{host}:{port}{path}"
    context = ssl._create_unverified_context() if tls else None  # noqa: S323 - the container asking itself
    try:
        with urllib.request.urlopen(url, timeout=4, context=context) as r:
            body = r.read(1 << 20).decode(errors="replace")
            status = r.status
    except OSError as exc:
        print(f"unhealthy: {name} does not answer {url}: {exc}")
        return 1
    if name == "dt-worker":
        connected = any(line.startswith("dt_worker_connected 1") for line in body.splitlines())
        print(f"{name}: {url} {status}, {'registered' if connected else 'not registered (reconnecting)'}")
    else:
        print(f"{name}: {url} {status} {body[:200]}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
