"""A network namespace for tests and benchmarks that cut a process off the network (``ip netns``;
root or CAP_SYS_ADMIN): ``NetNs`` joins it to the root namespace by a veth pair whose link the
caller takes down and up."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess

_NS_COUNTER = itertools.count()


class NetNs:
    """A network namespace joined to the root one by a veth pair on a private /24 (10.78.x.0):
    ``host_addr`` (.1) is the root-namespace end, ``ns_addr`` (.2) the namespace's.
    ``prefix`` runs a command inside it; ``down``/``up`` cut and restore the link."""

    def __init__(self) -> None:
        # unique per process (the pid) and within it (a counter): three namespaces of one test once
        # drew the same random suffix; 7 digits keep the veth names within 15 characters
        tag = f"{os.getpid() % 100000}{next(_NS_COUNTER) % 100:02d}"
        self.name = f"dtchaos{tag}"
        self.host_if, self.ns_if = f"dtch{tag}", f"dtcn{tag}"
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        free = [x for x in range(10, 250) if f"10.78.{x}." not in used]
        x = random.choice(free)
        self.host_addr, self.ns_addr = f"10.78.{x}.1", f"10.78.{x}.2"
        self.prefix = ["ip", "netns", "exec", self.name]

    @staticmethod
    def unavailable() -> str | None:
        """Why this test cannot build a namespace here, or None."""
        if shutil.which("ip") is None:
            return "the ip command (iproute2) is not installed"
        probe = f"dtprobe{os.getpid() % 100000}"
        added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if added.returncode != 0:
            return f"ip netns add is not permitted here (needs root or CAP_SYS_ADMIN): {added.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def _ip(self, *args: str, ns: bool = False) -> None:
        cmd = [*(self.prefix if ns else []), "ip", *args]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")

    def __enter__(self) -> NetNs:
        try:
            self._ip("netns", "add", self.name)
            self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            self._ip("link", "set", self.ns_if, "netns", self.name)
            self._ip("addr", "add", f"{self.host_addr}/24", "dev", self.host_if)
            self._ip("link", "set", self.host_if, "up")
            self._ip("addr", "add", f"{self.ns_addr}/24", "dev", self.ns_if, ns=True)
            self._ip("link", "set", self.ns_if, "up", ns=True)
            self._ip("link", "set", "lo", "up", ns=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def route_default(self) -> None:
        """Send everything not on the /24 to the root namespace's end: addresses the root namespace
        holds (another namespace's ``host_addr``) are then reachable from inside."""
        self._ip("route", "add", "default", "via", self.host_addr, ns=True)

    def down(self) -> None:
        self._ip("link", "set", self.host_if, "down")

    def up(self) -> None:
        self._ip("link", "set", self.host_if, "up")

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
