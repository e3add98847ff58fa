"""``interface_of``: which NIC holds an address (how a worker without --interface finds the NIC
its training ranks bind)."""

from __future__ import annotations

import psutil

from distributed_testing.process.netif import interface_of


def test_every_local_address_maps_back_to_its_interface() -> None:
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family.name in ("AF_INET", "AF_INET6"):
                owner = interface_of(str(a.address).split("%")[0])
                # an address held by two NICs maps to one of them
                assert owner is not None and any(
                    str(b.address).split("%")[0] == str(a.address).split("%")[0] for b in psutil.net_if_addrs()[owner])
    assert interface_of("127.0.0.1") is not None


def test_an_address_no_interface_holds_is_none() -> None:
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: documentation only, never assigned
