"""Who may read and use which bundle blobs, what a key may keep stored, and how an upload
reaches the disk (docs/security.md, "Bundles"; the handlers are in ``bundles_api.py``).

- **Reads** (``GET /api/v1/blobs/{d}``, ``GET /api/v1/bundles/{d}``; the route table first asks
  the role for ``bundles:read``): an admin reads every blob; another key reads the blobs it holds
  (it uploaded them, ``store/blobs.py``) and the bundles it stored through the manifest route; a
  worker key also the bundle of each task one of its workers holds now (assigned or running),
  and the blobs its manifest lists. Anything else is answered 404 as a digest never stored is,
  so a key learns nothing of other keys' uploads.
- **Use**: a task names a bundle its own key stored through the manifest route (an admin's task:
  any key's). A manifest stored through ``PUT /blobs`` passed none of that route's checks.
- **Quota** (``--max-blob-mb-per-key``): the bytes of the blobs a key holds, each counted once
  however many of its bundles list it; past it an upload is refused with 413 naming the flag.
- **Uploads** are streamed to a temporary file beside the store (a bounded buffer: aiohttp's
  reader pauses the socket while a chunk is written), hashed as they arrive, and moved in only
  when the digest matches.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from aiohttp import web

from ..bundles import manifest as mf
from ..errors import TooLarge, ValidationError
from ..process.httpstream import unreadable
from ..security import auth as sa
from ..security.roles import Role
from .runtime import Runtime
from .store.blobs import OverQuota

MIB = 1024 * 1024
CHUNK = 1 << 20  # what one read of an upload's body takes at most (and so what one upload buffers)
# Manifests whose listed digests are kept for the read checks of workers, by digest count (a
# manifest lists at most MAX_FILES, so the largest one fits): about 40 MiB at most.
MAX_CACHED_DIGESTS = 256 * 1024
_listed: collections.OrderedDict[str, frozenset[str]] = collections.OrderedDict()
_workers_of: dict[str, list[str]] = {}  # key id -> worker ids last found bound to it (a hint: checked on use)


def blob_limit(rt: Runtime) -> int:
    """The stored-bytes quota per key in bytes (0: none)."""
    return int(rt.config.max_blob_mb_per_key * MIB)


def over_quota(exc: OverQuota, principal: sa.Principal) -> TooLarge:
    """The 413 for an upload that would take ``principal``'s key past its quota."""
    return TooLarge([{"field": "(body)", "error": (
        f"key {principal.key_id} holds {exc.used / MIB:.1f} MiB of bundle files; {exc.adding / MIB:.1f} MiB more "
        f"would pass its quota of {exc.limit / MIB:g} MiB (--max-blob-mb-per-key). Files that no upload or task "
        "used within --bundle-retention are deleted, and an admin may raise the quota")}])


async def check_room(rt: Runtime, principal: sa.Principal, digest: str, size: int | None) -> None:
    """Before reading an upload of ``size`` bytes (None: not declared): 413 when the key could
    not store it under its quota (the store checks again as it stores)."""
    limit = blob_limit(rt)
    if size is None or limit <= 0 or not await rt.blobs.missing([digest], principal.key_id):
        return
    used = await rt.blobs.usage(principal.key_id)
    if used + size > limit:
        raise over_quota(OverQuota(used, size, limit), principal)


async def may_read(rt: Runtime, principal: sa.Principal, digest: str, *, bundle: bool) -> bool:
    """Whether ``principal`` may read blob ``digest`` (``bundle``: as a bundle's manifest, which
    its holder must have stored through the manifest route); see the module docstring."""
    holders = await rt.blobs.holders(digest)
    if bundle and not any(holders.values()):
        return False  # never accepted by the manifest route
    held = holders.get(principal.key_id, False) if bundle else principal.key_id in holders
    if principal.role == Role.ADMIN or held:
        return True
    return principal.role == Role.WORKER and await runs_with(rt, principal.key_id, digest)


async def runs_with(rt: Runtime, key_id: str, digest: str) -> bool:
    """Whether a worker bound to ``key_id`` holds a task whose bundle is ``digest`` or lists it.
    The key's worker ids are remembered between calls and checked on use; only a miss scans
    every worker (a new worker of the key, or a refusal)."""
    cached = _workers_of.get(key_id)
    for scan in ((False, True) if cached is not None else (True,)):
        if scan:
            cached = _workers_of[key_id] = [w.worker_id for w in rt.state.workers.values() if w.key_id == key_id]
        bundles = _bundles_held(rt, key_id, cached or [])
        if digest in bundles:
            return True
        for b in bundles:
            if digest in await _digests_listed(rt, b):
                return True
    return False


def _bundles_held(rt: Runtime, key_id: str, worker_ids: list[str]) -> set[str]:
    """The bundles of the tasks these workers (those still bound to ``key_id``) hold a slot for.
    A slot is a task id, or a batch's id, whose members are never bundle tasks (they do not batch)."""
    out: set[str] = set()
    for wid in worker_ids:
        w = rt.state.workers.get(wid)
        if w is None or w.key_id != key_id:
            continue
        for slot in w.view.running:
            t = rt.state.tasks.get(slot)
            if t is not None and t.spec.bundle is not None:
                out.add(t.spec.bundle)
    return out


async def _digests_listed(rt: Runtime, bundle: str) -> frozenset[str]:
    """The digests the manifest ``bundle`` lists (a bounded cache: a manifest never changes)."""
    found = _listed.get(bundle)
    if found is not None:
        _listed.move_to_end(bundle)
        return found
    data = await rt.blobs.get(bundle)
    found = frozenset() if data is None else frozenset(mf.decode(data).digests())
    _listed[bundle] = found
    while sum(map(len, _listed.values())) > MAX_CACHED_DIGESTS and len(_listed) > 1:
        _listed.popitem(last=False)
    return found


async def receive(request: web.Request, rt: Runtime, digest: str, cap: int, what: str) -> tuple[Path, int]:
    """The body of an upload of blob ``digest``, streamed to a temporary file (the caller moves
    it in with ``put_file``, which removes it either way): 413 once it passes ``cap`` bytes
    (``--max-bundle-file-mb``), 400 when its SHA-256 is not ``digest`` or it does not decode per
    its ``Content-Encoding``. Returns the file and its size."""
    where = rt.blobs.staging(digest)
    fd, name = await asyncio.to_thread(tempfile.mkstemp, dir=where, prefix=".tmp-")
    path, size, h = Path(name), 0, hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.content.iter_chunked(CHUNK):
                size += len(chunk)
                if size > cap:
                    raise TooLarge([{"field": what, "error": f"over the cap of {cap} bytes (--max-bundle-file-mb)"}])
                await asyncio.to_thread(_write, f, h, chunk)  # hashlib and the write release the GIL
    except web.RequestPayloadError as exc:
        path.unlink(missing_ok=True)
        raise unreadable(exc) from exc
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if h.hexdigest() != digest:
        path.unlink(missing_ok=True)
        raise ValidationError([{"field": "digest", "error": f"the body's SHA-256 is {h.hexdigest()}, not {digest}"}])
    return path, size


def _write(f: BinaryIO, h: Any, chunk: bytes) -> None:
    h.update(chunk)
    f.write(chunk)
