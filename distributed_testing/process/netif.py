"""This node's network interfaces: the address of a named NIC and the NIC holding an address.
Used by the worker (its rendezvous address, ``--interface``) and by training nodes (what gloo and
NCCL bind); below both, so neither imports the other for it.

:class:`InterfaceError` sits under :class:`~distributed_testing.errors.ExecutionError`, so a
training node that loses its NIC reports an ``error`` result like any other launch failure.
"""

from __future__ import annotations

import socket

import psutil

from ..errors import ExecutionError


class InterfaceError(ExecutionError):
    """A named network interface does not exist here or has no IP address."""


def interface_address(interface: str) -> str:
    """The first IPv4 (else IPv6) address of ``interface``; raises PreflightError if none."""
    addresses = psutil.net_if_addrs().get(interface)
    if addresses is None:
        raise InterfaceError(f"network interface {interface!r} does not exist on this node")
    for family in (socket.AF_INET, socket.AF_INET6):
        for address in addresses:
            if address.family == family:
                return str(address.address).split("%")[0]
    raise InterfaceError(f"network interface {interface!r} has no IP address")


def interface_of(address: str) -> str | None:
    """The network interface that holds ``address`` on this node, or None when none does (an
    address seen through NAT, or one that went away)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(str(a.address).split("%")[0] == address for a in addresses):
            return str(name)
    return None
