"""SHA-256 digests of blobs and manifests (lower-case hex, 64 characters)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def is_digest(text: object) -> bool:
    """True when ``text`` is a digest as this package writes it."""
    return isinstance(text, str) and DIGEST_RE.fullmatch(text) is not None


def of_bytes(data: bytes) -> str:
    """The digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def of_file(path: Path) -> tuple[str, int]:
    """(digest, size) of the file at ``path``, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size
