"""Pre-flight check that every node can reach the rendezvous endpoint before torch starts.

Design: node 0 will host torch's ``TCPStore`` on ``master_port``, so before launching torch it runs
a short-lived *check-in listener on that same port* (no extra port to allocate or open in a
firewall, and it proves exactly the path the rendezvous will use). Every other node connects to
``master_addr:master_port`` and sends ``dt-preflight/1 <node_rank> <nnodes>``. When all
``nnodes - 1`` peers have checked in, node 0 answers each ``ok <address it saw>`` and closes the
listener (peers close first, so no TIME_WAIT is left on node 0's side of the port); only then does
any node launch torch. It is a barrier: either every node launches or every node fails within
``timeout_s``, with a message naming this node's address and the far end, instead of torch's
rendezvous timing out after minutes.

A peer retries *refused* connections until ``timeout_s`` (node 0's listener may not be up yet);
an unreachable network or host fails at once. After the listener closes, the peers' torch agents
connect to the TCPStore that node 0's agent then opens on the port; they retry until it is up.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import time
from dataclasses import dataclass, field

from distributed_testing.training.errors import PreflightError

logger = logging.getLogger(__name__)

MAGIC = "dt-preflight/1"
_RETRY_REFUSED_S = 0.1
_LINGER_S = 2.0
_MAX_LINE = 256


def route_source_address(host: str, port: int) -> str:
    """The local address the kernel would use to reach ``host`` (a UDP connect sends nothing)."""
    family, _, _, _, sockaddr = _resolve(host, port)
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(sockaddr)
        except OSError as exc:
            raise PreflightError(f"this node has no route to master {host}:{port}: {exc}") from exc
        return str(probe.getsockname()[0])


def check_in(
    master_addr: str,
    master_port: int,
    *,
    node_rank: int,
    nnodes: int,
    local_addr: str | None,
    timeout_s: float,
) -> str:
    """Peer side: check in with node 0 and wait for the release. Returns the address node 0 saw."""
    here = f"node {node_rank} ({local_addr or 'unknown address'})"
    there = f"master {master_addr}:{master_port}"
    sock = _connect(master_addr, master_port, local_addr, timeout_s, here, there)
    with sock:
        sock.settimeout(timeout_s + _LINGER_S)
        try:
            sock.sendall(f"{MAGIC} {node_rank} {nnodes}\n".encode())
            reply = _read_line(sock)
        except OSError as exc:
            raise PreflightError(f"pre-flight: {here} lost the connection to {there}: {exc}") from exc
    if not reply.startswith("ok"):
        raise PreflightError(f"pre-flight: {there} rejected {here}: {reply or 'connection closed'}")
    seen = reply[3:].strip()
    logger.info("pre-flight: %s checked in with %s (seen as %s)", here, there, seen)
    return seen


@dataclass
class _Peer:
    sock: socket.socket
    address: str
    buffer: bytes = b""
    node_rank: int | None = None


@dataclass
class _Listener:
    port: int
    nnodes: int
    local_addr: str
    peers: dict[int, _Peer] = field(default_factory=dict)


def gather_check_ins(port: int, *, nnodes: int, local_addr: str, timeout_s: float) -> dict[int, str]:
    """Node 0 side: listen on ``port`` until nodes 1..nnodes-1 check in, then release them.

    Returns ``{node_rank: peer address}``. Raises PreflightError naming the missing node ranks.
    """
    state = _Listener(port, nnodes, local_addr)
    if nnodes == 1:
        _listen(port, local_addr).close()
        return {}
    listener = _listen(port, local_addr)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    deadline = time.monotonic() + timeout_s
    try:
        while len(state.peers) < nnodes - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _fail_missing(state, timeout_s)
            for key, _ in selector.select(remaining):
                if key.data is None:
                    _accept(listener, selector)
                else:
                    _receive(state, selector, key.data)
        return _release(state)
    finally:
        selector.close()
        listener.close()
        for peer in state.peers.values():
            peer.sock.close()


def _listen(port: int, local_addr: str) -> socket.socket:
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("", port))
    except OSError as exc:
        raise PreflightError(f"pre-flight: node 0 ({local_addr}) cannot listen on master port {port}: {exc}") from exc


def _accept(listener: socket.socket, selector: selectors.BaseSelector) -> None:
    sock, address = listener.accept()
    sock.setblocking(False)
    selector.register(sock, selectors.EVENT_READ, _Peer(sock, _plain_address(address[0])))


def _receive(state: _Listener, selector: selectors.BaseSelector, peer: _Peer) -> None:
    try:
        chunk = peer.sock.recv(_MAX_LINE)
    except OSError as exc:
        logger.warning("pre-flight: connection from %s failed: %s", peer.address, exc)
        chunk = b""
    peer.buffer += chunk
    if chunk and b"\n" not in peer.buffer and len(peer.buffer) < _MAX_LINE:
        return
    selector.unregister(peer.sock)
    error = _parse_hello(state, peer) if chunk else "closed before checking in"
    if error is None and peer.node_rank is not None:
        state.peers[peer.node_rank] = peer
        return
    logger.warning("pre-flight: rejected check-in from %s: %s", peer.address, error)
    _send(peer, f"error {error}")
    peer.sock.close()


def _parse_hello(state: _Listener, peer: _Peer) -> str | None:
    parts = peer.buffer.split(b"\n", 1)[0].decode("ascii", "replace").split()
    if len(parts) != 3 or parts[0] != MAGIC or not parts[1].isdigit() or not parts[2].isdigit():
        return f"not a {MAGIC} hello: {peer.buffer[:60]!r}"
    node_rank, nnodes = int(parts[1]), int(parts[2])
    if nnodes != state.nnodes:
        return f"node {node_rank} expects {nnodes} nodes, node 0 expects {state.nnodes}"
    if not 1 <= node_rank < state.nnodes:
        return f"node rank {node_rank} outside 1..{state.nnodes - 1}"
    if node_rank in state.peers:
        return f"node rank {node_rank} already checked in from {state.peers[node_rank].address}"
    peer.node_rank = node_rank
    return None


def _release(state: _Listener) -> dict[int, str]:
    for peer in state.peers.values():
        _send(peer, f"ok {peer.address}")
    linger_until = time.monotonic() + _LINGER_S
    for peer in state.peers.values():
        peer.sock.settimeout(max(0.01, linger_until - time.monotonic()))
        try:
            peer.sock.recv(1)
        except OSError as exc:
            logger.debug("pre-flight: %s did not close first: %s", peer.address, exc)
    logger.info("pre-flight: all %d peers checked in on port %d", len(state.peers), state.port)
    return {rank: peer.address for rank, peer in state.peers.items()}


def _fail_missing(state: _Listener, timeout_s: float) -> None:
    missing = [r for r in range(1, state.nnodes) if r not in state.peers]
    seen = {rank: peer.address for rank, peer in state.peers.items()}
    for peer in state.peers.values():
        _send(peer, f"error node ranks {missing} never checked in with node 0")
    raise PreflightError(
        f"pre-flight: node 0 ({state.local_addr}) waited {timeout_s:g}s on master port {state.port}: "
        f"node ranks {missing} never connected (checked in: {seen or 'none'})"
    )


def _send(peer: _Peer, line: str) -> None:
    try:
        peer.sock.settimeout(1.0)
        peer.sock.sendall(f"{line}\n".encode())
    except OSError as exc:
        logger.warning("pre-flight: could not answer %s: %s", peer.address, exc)


def _connect(host: str, port: int, local_addr: str | None, timeout_s: float, here: str, there: str) -> socket.socket:
    family, _, _, _, sockaddr = _resolve(host, port)
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if local_addr and family == _family_of(local_addr):
                sock.bind((local_addr, 0))
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            sock.connect(sockaddr)
            return sock
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() + _RETRY_REFUSED_S >= deadline:
                raise PreflightError(
                    f"pre-flight: {here} cannot reach {there}: connection refused for {timeout_s:g}s "
                    "(nothing listening there: is node 0 running, is the address right?)"
                ) from None
            time.sleep(_RETRY_REFUSED_S)
        except OSError as exc:
            sock.close()
            reason = "timed out" if isinstance(exc, TimeoutError) else _describe(exc)
            raise PreflightError(f"pre-flight: {here} cannot reach {there}: {reason}") from exc


def _resolve(
    host: str, port: int
) -> tuple[socket.AddressFamily, int, int, str, tuple[str, int] | tuple[str, int, int, int]]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PreflightError(f"pre-flight: cannot resolve master address {host!r}: {exc}") from exc
    return infos[0]  # type: ignore[return-value]


def _family_of(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _plain_address(address: str) -> str:
    return address.removeprefix("::ffff:")


def _read_line(sock: socket.socket) -> str:
    data = b""
    while b"\n" not in data and len(data) < _MAX_LINE:
        chunk = sock.recv(_MAX_LINE)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("ascii", "replace").strip()


def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{name} {exc.strerror or exc}".strip()
