"""Upload a directory as a bundle: only the blobs the coordinator lacks, then the manifest.

Synchronous (``http.client`` over one keep-alive connection), so ``dt`` and the pytest plugin call
it directly. See the package docstring for the routes and the contract.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import manifest as mf
from .digest import of_bytes

MISSING_BATCH = 5000  # digests per "which are missing?" question
BATCH_BYTES = 4 << 20  # blobs up to this many bytes go several to a POST /blobs (at most this much each)
BATCH_BLOBS = 2000
API = "/api/v1"


class UploadError(Exception):
    """The coordinator refused part of an upload (``status``: its HTTP status, 0 unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


@dataclass
class UploadStats:
    """What one upload did: files in the manifest, blobs and bytes sent, seconds taken."""

    digest: str = ""
    files: int = 0
    total_bytes: int = 0
    blobs_sent: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0


class _Conn:
    """One keep-alive connection to the coordinator, reopened once if the server closed it."""

    def __init__(self, base_url: str, api_key: str, ssl_context: ssl.SSLContext | None, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(base_url.split(",")[0].strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UploadError(0, f"not a coordinator URL: {base_url!r}")
        self._parts, self._ssl, self._timeout = parts, ssl_context, timeout_s
        self._prefix = parts.path.rstrip("/")
        self._auth = f"Bearer {api_key}"
        self._conn: http.client.HTTPConnection | None = None

    def _open(self) -> http.client.HTTPConnection:
        p = self._parts
        if p.scheme == "https":
            return http.client.HTTPSConnection(p.hostname or "", p.port, timeout=self._timeout, context=self._ssl)
        return http.client.HTTPConnection(p.hostname or "", p.port, timeout=self._timeout)

    def request(self, method: str, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        headers = {"Authorization": self._auth, "Content-Type": content_type}
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = self._open()
            try:
                self._conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = self._conn.getresponse()
                return resp.status, resp.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine) as exc:
                self.close()
                if attempt:
                    raise UploadError(0, f"cannot reach the coordinator: {exc}") from exc
            except OSError as exc:
                self.close()
                raise UploadError(0, f"cannot reach the coordinator: {exc}") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _check(status: int, raw: bytes, what: str) -> Any:
    if status >= 400:
        try:
            body = json.loads(raw)
            detail = body.get("message") or raw.decode(errors="replace")
            if body.get("errors"):
                detail += " (" + "; ".join(f"{e.get('field')}: {e.get('error')}" for e in body["errors"][:10]) + ")"
        except (ValueError, AttributeError):
            detail = raw.decode(errors="replace")[:500]
        raise UploadError(status, f"{what}: {detail}")
    return json.loads(raw) if raw else None


def upload_with_stats(base_url: str, api_key: str, root: Path, *, ssl_context: ssl.SSLContext | None = None,
                      timeout_s: float = 60.0) -> UploadStats:
    """Scan ``root`` (``manifest.scan``), upload what the coordinator lacks, then the manifest."""
    started = time.perf_counter()
    m, sources = mf.scan(Path(root))
    data = mf.encode(m)
    stats = UploadStats(digest=of_bytes(data), files=len(m.files), total_bytes=m.total_size)
    conn = _Conn(base_url, api_key, ssl_context, timeout_s)
    try:
        wanted = sorted(m.digests())
        for i in range(0, len(wanted), MISSING_BATCH):
            body = json.dumps({"digests": wanted[i:i + MISSING_BATCH]}).encode()
            answer = _check(*conn.request("POST", f"{API}/blobs/missing", body, "application/json"), "asking for missing blobs")
            _send(conn, [(d, sources[d]) for d in answer["missing"]], stats)
        _check(*conn.request("PUT", f"{API}/bundles/{stats.digest}", data, "application/json"), "uploading the manifest")
    finally:
        conn.close()
    stats.seconds = time.perf_counter() - started
    return stats


def _read(digest: str, path: Path) -> bytes:
    blob = path.read_bytes()
    if of_bytes(blob) != digest:
        raise UploadError(0, f"{path} changed while it was being uploaded; upload again")
    return blob


def _send(conn: _Conn, todo: list[tuple[str, Path]], stats: UploadStats) -> None:
    """Upload ``todo``: small blobs ``BATCH_BLOBS``/``BATCH_BYTES`` to a ``POST /blobs``, the rest
    (and every blob of a batch the coordinator refuses as too large or does not know) one ``PUT``
    each."""
    batch: list[tuple[str, Path, bytes]] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if not batch:
            return
        body = b"".join(d.encode() + len(b).to_bytes(8, "big") + b for d, _, b in batch)
        status, raw = conn.request("POST", f"{API}/blobs", body, "application/octet-stream")
        if status in (404, 405, 413):  # an older coordinator, or a per-file cap below BATCH_BYTES
            for d, path, blob in batch:
                _put(conn, d, path, blob, stats)
        else:
            _check(status, raw, f"uploading {len(batch)} files ({batch[0][1]} ...)")
            stats.blobs_sent += len(batch)
            stats.bytes_sent += sum(len(b) for _, _, b in batch)
        batch.clear()
        size = 0

    for d, path in todo:
        blob = _read(d, path)
        if len(blob) + 72 > BATCH_BYTES:
            _put(conn, d, path, blob, stats)
            continue
        if size + len(blob) + 72 > BATCH_BYTES or len(batch) >= BATCH_BLOBS:
            flush()
        batch.append((d, path, blob))
        size += len(blob) + 72
    flush()


def _put(conn: _Conn, d: str, path: Path, blob: bytes, stats: UploadStats) -> None:
    _check(*conn.request("PUT", f"{API}/blobs/{d}", blob, "application/octet-stream"), f"uploading {path}")
    stats.blobs_sent += 1
    stats.bytes_sent += len(blob)


def upload(base_url: str, api_key: str, root: Path, *, ssl_context: ssl.SSLContext | None = None) -> str:
    """Upload the tree at ``root`` as a bundle; its manifest digest (the task's ``"bundle"``)."""
    return upload_with_stats(base_url, api_key, root, ssl_context=ssl_context).digest
