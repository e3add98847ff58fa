"""The worker's blob cache: a directory of read-only blobs, least recently used evicted first.

Layout: ``<root>/<d[:2]>/<d>`` (mode 0444) and, for a blob some manifest marks executable,
``<d>.x`` (0555); hard links to them are the bundle trees (``tree.build_tree``), so a blob's
mode is the tree file's mode. Use is recorded as the file's mtime (``touch``), and ``evict`` keeps
the total at or under ``max_bytes``, deleting the least recently used first, never a blob in
``keep`` (the blobs of a task about to run or of a tree kept for reuse). Which digests are present
is read from disk once, at construction, and kept in memory, so ``missing`` over a 10,000-file
manifest is a set difference, not 10,000 ``stat`` calls. Not thread-safe: the worker calls it from
one thread at a time.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ..errors import ValidationError
from .digest import of_bytes


class BlobCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        entries = [p for p in self.root.glob("??/*") if not p.name.startswith(".")]
        self.size = sum(p.stat().st_size for p in entries)
        self._present = {p.name for p in entries if not p.name.endswith(".x")}

    def path(self, digest: str, executable: bool = False) -> Path:
        return self.root / digest[:2] / (digest + (".x" if executable else ""))

    def has(self, digest: str) -> bool:
        return digest in self._present

    def missing(self, digests: set[str]) -> set[str]:
        """The digests not in the cache."""
        return digests - self._present

    def put(self, digest: str, data: bytes) -> None:
        """Store ``data`` as ``digest`` after checking it; ValidationError when it does not match."""
        if of_bytes(data) != digest:
            raise ValidationError([{"field": f"blob {digest}", "error": "the bytes received do not match the digest"}])
        dest = self.path(digest)
        dest.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
        if digest not in self._present:  # a blob fetched twice (overlapping tasks) replaces itself
            self._present.add(digest)
            self.size += len(data)

    def executable(self, digest: str) -> Path:
        """The 0555 twin of a cached blob, made on first use."""
        x = self.path(digest, True)
        if not x.exists():
            fd, tmp = tempfile.mkstemp(dir=x.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(self.path(digest).read_bytes())
            os.chmod(tmp, 0o555)
            os.replace(tmp, x)
            self.size += x.stat().st_size
        return x

    def touch(self, digests: set[str]) -> None:
        now = time.time()
        for d in digests:
            for p in (self.path(d), self.path(d, True)):
                try:
                    os.utime(p, (now, now))
                except FileNotFoundError:
                    continue

    def evict(self, keep: set[str]) -> int:
        """Delete least recently used blobs until the cache fits ``max_bytes``; bytes freed."""
        if self.size <= self.max_bytes:
            return 0
        entries = sorted((p.stat().st_mtime, p) for p in self.root.glob("??/*") if not p.name.startswith("."))
        freed = 0
        for _, p in entries:
            if self.size - freed <= self.max_bytes:
                break
            if p.name.removesuffix(".x") in keep:
                continue
            size = p.stat().st_size
            p.unlink()
            self._present.discard(p.name)
            freed += size
        self.size -= freed
        return freed
