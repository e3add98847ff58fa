#!/usr/bin/env python3
"""Make a seccomp profile that lets the worker's sandbox (bubblewrap) work in a container.

    python3 deploy/seccomp_for_bwrap.py DEFAULT.json > deploy/seccomp-bwrap.json

DEFAULT.json is your engine's default profile: Docker's is ``profiles/seccomp/default.json`` in
the moby repository at your Docker's version; podman's is ``/usr/share/containers/seccomp.json``.
The output is that profile with the calls bubblewrap makes allowed whatever the container's
capabilities: ``clone`` with namespace flags, ``unshare``, ``mount``, ``umount2``, ``pivot_root``
(:data:`BWRAP_CALLS`). Docker's default allows them only to a container with ``CAP_SYS_ADMIN``,
and adding that capability to a container would hand far more to its root than bwrap needs; the
image's worker is not root and makes its namespaces unprivileged, where these calls act only
inside them. Every other rule stays as the engine wrote it. docs/operations.md, "Containers",
says which other options the worker's container needs (a /proc it may mount afresh).

Exit 2, naming what is wrong, when DEFAULT.json is not a seccomp profile.
"""

from __future__ import annotations

import json
import sys
from typing import Any

BWRAP_CALLS = ("clone", "unshare", "mount", "umount2", "pivot_root")


def for_bwrap(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` with :data:`BWRAP_CALLS` taken out of every rule and allowed by one rule of their own."""
    if not isinstance(profile.get("syscalls"), list) or "defaultAction" not in profile:
        raise ValueError("not a seccomp profile: no defaultAction or no syscalls list")
    rules = []
    for rule in profile["syscalls"]:
        names = [n for n in rule.get("names", []) if n not in BWRAP_CALLS]
        if names or not rule.get("names"):
            rules.append({**rule, "names": names} if "names" in rule else rule)
    rules.append({"names": list(BWRAP_CALLS), "action": "SCMP_ACT_ALLOW", "args": [],
                  "comment": "bubblewrap: the worker's task sandbox, made unprivileged (deploy/seccomp_for_bwrap.py)"})
    return {**profile, "syscalls": rules}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: seccomp_for_bwrap.py DEFAULT.json (your engine's default seccomp profile)", file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            profile = for_bwrap(json.load(f))
    except (OSError, ValueError) as exc:
        print(f"seccomp_for_bwrap.py: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    json.dump(profile, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
