"""Forwarding and TLS (coordinator/forward.py): real coordinator processes on PostgreSQL, members
serving https with a private CA made at test time. A standby reached over https does not send a
client's credential on to a leader on plain http (unless on loopback)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ha_support import HaGroup, Member, request

from distributed_testing.testing import TlsFiles, free_port, make_tls_files, pg_database_sync, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
NOOP = {"type": "custom", "config": {"name": "noop"}}


@pytest.fixture
def group(tmp_path: Path) -> Iterator[HaGroup]:
    with pg_database_sync(prefix="dt_ha_tls") as dsn:
        g = HaGroup(tmp_path, dsn)
        try:
            yield g
        finally:
            g.close()


def outward_address() -> str | None:
    """An address of this host that is not loopback, or None (no route out)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # nothing is sent: this only picks the outgoing interface
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def https_call(url: str, ca: Path, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    status, _, answer = request(url + path, method, key, body, context=ssl.create_default_context(cafile=str(ca)),
                                timeout=30)
    return status, answer


def https_member(group: HaGroup, name: str, tls: TlsFiles, *extra: str, role: str = "standby") -> Member:
    m = group.start_member(name, "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), *extra)
    https = Member(m.name, m.proc, m.url.replace("http://", "https://"), m.log)
    group.members[name] = https

    def in_role() -> bool:
        try:
            return https_call(https.url, tls.ca, "GET", "/api/v1/health", "")[1]["role"] == role
        except OSError:
            return False

    wait_until(in_role, 30, f"{name} to be the {role}")
    return https


def test_a_standby_verifies_an_https_leader_with_its_ca_file(group: HaGroup, tmp_path: Path) -> None:
    """A group on a private CA: the standby given ``--ca-file`` forwards to the https leader; one
    without it trusts only the system's CAs, so it cannot connect and answers 503 (nothing sent)."""
    tls = make_tls_files(tmp_path / "tls")
    a = https_member(group, "a", tls, role="leader")
    b = https_member(group, "b", tls, "--ca-file", str(tls.ca))
    c = https_member(group, "c", tls)
    wait_until(group.admin_file.exists, 30, "the admin key")
    key = group.admin_file.read_text().strip()
    for method, path, body in (("POST", "/api/v1/tasks", {**NOOP, "task_id": "ca"}), ("GET", "/api/v1/tasks/ca", None)):
        status, answer = https_call(b.url, tls.ca, method, path, key, body)
        assert status in (200, 201), answer
    status, answer = https_call(c.url, tls.ca, "GET", "/api/v1/tasks/ca", key)
    assert status == 503 and answer["error"] == "not_leader" and "Certificate" in answer["message"], answer
    assert https_call(a.url, tls.ca, "GET", "/api/v1/tasks/ca", key)[0] == 200


def test_a_standby_reached_over_https_does_not_forward_a_credential_to_a_plain_http_leader(
        group: HaGroup, tmp_path: Path) -> None:
    address = outward_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    port = free_port()
    a = group.start_member("a", "--host", "0.0.0.0", "--port", str(port), "--advertise-url",
                           f"http://{address}:{port}")
    group.wait_role(a, "leader")
    key = group.admin(a).key
    tls = make_tls_files(tmp_path / "tls")
    b = https_member(group, "b", tls)
    for method, path, body in (("POST", "/api/v1/tasks", NOOP), ("GET", "/api/v1/tasks", None)):
        status, answer = https_call(b.url, tls.ca, method, path, key, body)
        assert status == 503 and answer["error"] == "not_leader", (path, answer)
        assert "plain http" in answer["message"] and "in clear" in answer["message"], answer
    assert group.admin(a).tasks() == {}  # nothing reached the leader
