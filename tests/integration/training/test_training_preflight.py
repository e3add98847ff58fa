import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from distributed_testing.process.netif import InterfaceError, interface_address
from distributed_testing.training.errors import PreflightError
from distributed_testing.training.launch import NodeAssignment, launch
from distributed_testing.training.preflight import check_in, gather_check_ins

pytestmark = pytest.mark.timeout(20)

CONFIG = {"model": "mlp", "nodes": 2, "batch_size": 8, "steps": 1}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on, held (bound, never listening) for the test, so a parallel test
    cannot start a listener on it meanwhile (a freed port was once taken by another test's
    pre-flight master, which then answered instead of refusing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_closed_port_fails_fast_naming_both_ends(closed_port: int, tmp_path: Path) -> None:
    free_port = closed_port
    assignment = NodeAssignment(node_rank=1, nnodes=2, master_addr="127.0.0.1", master_port=free_port, interface="lo")
    start = time.monotonic()
    with pytest.raises(PreflightError) as info:
        launch(CONFIG, assignment, tmp_path / "result.json", preflight_timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert elapsed < 2.5
    message = str(info.value)
    assert "node 1 (127.0.0.1)" in message
    assert f"master 127.0.0.1:{free_port}" in message
    assert "connection refused" in message
    assert not list(tmp_path.iterdir()), "nothing may be launched after a failed pre-flight"


def test_barrier_releases_every_peer_once_all_checked_in(free_port: int) -> None:
    with ThreadPoolExecutor(3) as pool:
        master = pool.submit(gather_check_ins, free_port, nnodes=3, local_addr="127.0.0.1", timeout_s=5.0)
        peers = [
            pool.submit(check_in, "127.0.0.1", free_port, node_rank=r, nnodes=3, local_addr="127.0.0.1", timeout_s=5.0)
            for r in (1, 2)
        ]
        assert master.result() == {1: "127.0.0.1", 2: "127.0.0.1"}
        assert [p.result() for p in peers] == ["127.0.0.1", "127.0.0.1"]
    with socket.create_server(("", free_port)):
        pass  # the port is free again for torch's TCPStore


def test_master_names_missing_nodes_and_fails_the_present_ones(free_port: int) -> None:
    with ThreadPoolExecutor(2) as pool:
        master = pool.submit(gather_check_ins, free_port, nnodes=3, local_addr="10.0.0.1", timeout_s=1.0)
        peer = pool.submit(
            check_in, "127.0.0.1", free_port, node_rank=1, nnodes=3, local_addr="127.0.0.1", timeout_s=3.0
        )
        with pytest.raises(PreflightError, match=r"node 0 \(10.0.0.1\).*node ranks \[2\] never connected"):
            master.result()
        with pytest.raises(PreflightError, match=r"rejected node 1 .*\[2\] never checked in"):
            peer.result()


def test_mismatched_node_count_and_strays_are_rejected(free_port: int) -> None:
    with ThreadPoolExecutor(3) as pool:
        master = pool.submit(gather_check_ins, free_port, nnodes=2, local_addr="127.0.0.1", timeout_s=4.0)
        wrong = pool.submit(
            check_in, "127.0.0.1", free_port, node_rank=1, nnodes=3, local_addr="127.0.0.1", timeout_s=2.0
        )
        with pytest.raises(PreflightError, match="expects 3 nodes, node 0 expects 2"):
            wrong.result()
        stray_reply = pool.submit(_send_garbage, free_port)
        assert stray_reply.result().startswith("error not a dt-preflight/1 hello")
        right = pool.submit(
            check_in, "127.0.0.1", free_port, node_rank=1, nnodes=2, local_addr="127.0.0.1", timeout_s=2.0
        )
        assert right.result() == "127.0.0.1"
        assert master.result() == {1: "127.0.0.1"}


def _send_garbage(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.sendall(b"GET / HTTP/1.0\n")
        return sock.recv(256).decode()


def test_port_in_use_on_node_zero_is_reported(free_port: int) -> None:
    with socket.create_server(("", free_port)):
        with pytest.raises(PreflightError, match=f"node 0 \\(127.0.0.1\\) cannot listen on master port {free_port}"):
            gather_check_ins(free_port, nnodes=2, local_addr="127.0.0.1", timeout_s=1.0)


def test_interface_address() -> None:
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(InterfaceError, match="does not exist"):
        interface_address("no-such-nic0")
