"""REST handlers for bundles: blobs by digest and manifests (see ``distributed_testing.bundles``).

The route table (``api.ROUTES``) declares each route's permission; ``bundles:upload`` also needs a
key created with ``--allow-code`` (``api.authorize``), and what a key may read or name in a task
is the ownership rule of ``bundle_access.py`` on top of ``bundles:read`` (404 otherwise). Every
blob's digest is checked on arrival (400 on a mismatch; ``POST /blobs`` stores several small
blobs in one body of at most ``BATCH_CAP``, all or none; ``PUT /blobs/{d}`` streams to disk); a
blob over ``--max-bundle-file-mb`` is refused with 413 before more than the cap is read, and one
past the key's ``--max-blob-mb-per-key`` with 413. A manifest is accepted only when the key holds
every blob it lists (400 naming the missing ones), each file's declared size is its blob's (400
naming the file), and its files fit ``--max-bundle-mb`` and the per-file cap (413 naming the
largest). A task that names a bundle is checked at submit (``check_bundles``): the key may ship
code, the manifest was accepted by the manifest route for this key (an admin: for any) and holds
what the task's config names (a test file, a handler's module); its blobs are then marked used,
so ``--bundle-retention`` counts from the youngest task that refers to them. ``sweep`` deletes
blobs no upload or task used within it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from aiohttp import web

from ..bundles import digest as dg
from ..bundles import manifest as mf
from ..errors import NotFound, PermissionDenied, TooLarge, ValidationError
from ..process.httpstream import unreadable
from ..security import auth as sa
from ..security.roles import Role
from ..tasks import kinds
from ..tasks.spec import TaskSpec
from . import bundle_access as access
from .rest import PRINCIPAL, read_body
from .runtime import RUNTIME, Runtime
from .store.blobs import OverQuota

log = logging.getLogger(__name__)
MIB = 1024 * 1024
MAX_MISSING_QUERY = 20_000
# The largest ``POST /blobs`` body: twice what the uploader sends in one (bundles/upload.py,
# BATCH_BYTES), which falls back to one PUT per blob on a 413; it is read into memory, a PUT is not.
BATCH_CAP = 8 * MIB
ALLOW_CODE_HINT = "create one with: dt keys create --role submitter --allow-code"


def require_allow_code(principal: sa.Principal) -> None:
    """PermissionDenied unless ``principal``'s key was created with ``--allow-code``."""
    if not principal.allow_code:
        raise PermissionDenied(f"{principal.role} key {principal.key_id} may not ship code (it was not created "
                               "with --allow-code); " + ALLOW_CODE_HINT)


def _digest_param(request: web.Request) -> str:
    d = request.match_info["digest"]
    if not dg.is_digest(d):
        raise ValidationError([{"field": "digest", "error": "must be 64 lower-case hex characters (SHA-256)"}])
    return d


def _octets(data: bytes, status: int = 200) -> web.Response:
    return web.Response(body=data, status=status, content_type="application/octet-stream")


def body_cap(rt: Runtime) -> int:
    """How large a body the routes in ``CAPPED`` take: ``--max-bundle-file-mb``."""
    return int(rt.config.max_bundle_file_mb * MIB)


def check_length(request: web.Request, cap: int, what: str) -> None:
    """TooLarge when the body's declared length is over ``cap``, before any of it is read."""
    if request.content_length is not None and request.content_length > cap:
        raise TooLarge([{"field": what, "error": f"{request.content_length} bytes; the cap is {cap} bytes "
                         "(--max-bundle-file-mb)"}])


async def read_capped(request: web.Request, cap: int, what: str) -> bytes:
    """The body, decoded per its ``Content-Encoding``, refused with 413 as soon as it passes
    ``cap`` bytes (aiohttp's own body limit does not apply: blobs may be larger than a task
    document), and with 400 when it does not decode."""
    check_length(request, cap, what)
    chunks, size = [], 0
    try:
        async for chunk in request.content.iter_chunked(1 << 20):
            size += len(chunk)
            if size > cap:
                raise TooLarge([{"field": what, "error": f"over the cap of {cap} bytes (--max-bundle-file-mb)"}])
            chunks.append(chunk)
    except web.RequestPayloadError as exc:
        raise unreadable(exc) from exc
    return b"".join(chunks)


async def missing_blobs(request: web.Request) -> web.Response:
    """``{"digests": [...]}`` -> ``{"missing": [...]}``: which the coordinator lacks."""
    try:
        body = msgspec.json.decode(await read_body(request))
    except msgspec.DecodeError as exc:
        raise ValidationError([{"field": "(body)", "error": f"not JSON: {exc}"}]) from exc
    digests = body.get("digests") if isinstance(body, dict) else None
    if not isinstance(digests, list) or len(digests) > MAX_MISSING_QUERY or not all(map(dg.is_digest, digests)):
        raise ValidationError([{"field": "digests", "error": f"must be a list of at most {MAX_MISSING_QUERY} "
                                "SHA-256 digests (64 lower-case hex characters)"}])
    rt = request.app[RUNTIME]  # what this key does not hold: another key's upload is not used, nor told of
    return web.json_response({"missing": await rt.blobs.missing(dict.fromkeys(digests), request[PRINCIPAL].key_id)})


async def put_blob(request: web.Request) -> web.Response:
    """Store one blob, streamed to disk, held by the caller's key; 201 when new, 200 when it was
    already there."""
    d = _digest_param(request)
    rt, principal = request.app[RUNTIME], request[PRINCIPAL]
    check_length(request, body_cap(rt), f"blob {d}")
    await access.check_room(rt, principal, d, request.content_length)
    path, size = await access.receive(request, rt, d, body_cap(rt), f"blob {d}")
    try:
        created = await rt.blobs.put_file(d, path, rt.clock(), principal.key_id, limit=access.blob_limit(rt))
    except OverQuota as exc:
        raise access.over_quota(exc, principal) from None
    return web.json_response({"digest": d, "size": size, "created": created}, status=201 if created else 200)


def split_batch(body: bytes) -> list[tuple[str, bytes]]:
    """The (digest, bytes) records of a batch body (``bundles.BATCH_FORMAT``), each digest checked;
    ValidationError naming every bad record."""
    out: list[tuple[str, bytes]] = []
    errors: list[dict[str, str]] = []
    pos = 0
    while pos < len(body) and len(errors) < 50:
        head = body[pos:pos + 72]
        d = head[:64].decode("ascii", errors="replace")
        if len(head) < 72 or not dg.is_digest(d):
            errors.append({"field": f"record at byte {pos}", "error": "expected 64 hex digest characters and an "
                           "8-byte big-endian length"})
            break
        size = int.from_bytes(head[64:], "big")
        data = body[pos + 72:pos + 72 + size]
        if len(data) != size:
            errors.append({"field": f"blob {d}", "error": f"{size} bytes announced, {len(data)} sent"})
            break
        if dg.of_bytes(data) != d:
            errors.append({"field": f"blob {d}", "error": f"the bytes' SHA-256 is {dg.of_bytes(data)}"})
        out.append((d, data))
        pos += 72 + size
    if errors:
        raise ValidationError(errors)
    return out


async def put_blobs(request: web.Request) -> web.Response:
    """Store several blobs sent in one body; all or none (every digest is checked first)."""
    rt, principal = request.app[RUNTIME], request[PRINCIPAL]
    blobs = split_batch(await read_capped(request, min(body_cap(rt), BATCH_CAP), "batch"))
    try:
        created = await rt.blobs.put_many(blobs, rt.clock(), principal.key_id, limit=access.blob_limit(rt))
    except OverQuota as exc:
        raise access.over_quota(exc, principal) from None
    return web.json_response({"stored": len(blobs), "created": created})


async def get_blob(request: web.Request) -> web.Response:
    """A blob the caller may read (``bundle_access.may_read``); 404 otherwise, as for none."""
    d = _digest_param(request)
    rt = request.app[RUNTIME]
    data = await rt.blobs.get(d) if await access.may_read(rt, request[PRINCIPAL], d, bundle=False) else None
    if data is None:
        raise NotFound(f"no blob {d} this key may read (its uploader's, an admin's, or a worker's that runs a task "
                       "naming it)")
    return _octets(data)


def check_caps(m: mf.Manifest, max_bundle: int, max_file: int) -> None:
    """TooLarge naming the largest files when ``m`` is over either cap."""
    largest = sorted(m.files, key=lambda f: -f.size)[:5]
    names = ", ".join(f"{f.path} ({f.size / MIB:.1f} MiB)" for f in largest)
    if largest and largest[0].size > max_file:
        raise TooLarge([{"field": "bundle", "error": f"a file is over the per-file cap of {max_file / MIB:g} MiB "
                         f"(--max-bundle-file-mb); largest files: {names}"}])
    if m.total_size > max_bundle:
        raise TooLarge([{"field": "bundle", "error": f"{m.total_size / MIB:.1f} MiB in {len(m.files)} files, over the "
                         f"cap of {max_bundle / MIB:g} MiB (--max-bundle-mb); largest files: {names}"}])


async def put_manifest(request: web.Request) -> web.Response:
    """Store a manifest whose blobs the key all holds, each of the size it declares, as a bundle
    of the key; marks them used."""
    d = _digest_param(request)
    rt, principal = request.app[RUNTIME], request[PRINCIPAL]
    data = await read_capped(request, body_cap(rt), "manifest")
    if dg.of_bytes(data) != d:
        raise ValidationError([{"field": "digest", "error": f"the manifest's SHA-256 is {dg.of_bytes(data)}, not {d}"}])
    m = mf.decode(data)
    check_caps(m, int(rt.config.max_bundle_mb * MIB), int(rt.config.max_bundle_file_mb * MIB))
    stored = await rt.blobs.sizes(sorted(m.digests()), principal.key_id)
    absent = sorted(m.digests() - stored.keys())
    if absent:
        where = {f.digest: f.path for f in m.files}
        raise ValidationError([{"field": f"blob {a}", "error": f"not uploaded (file {where[a]})"} for a in absent[:50]])
    lying = [f for f in m.files if f.size != stored[f.digest]]
    if lying:  # the caps above were checked against the declared sizes
        raise ValidationError([{"field": f"manifest.files[{f.path}].size", "error": f"declares {f.size} bytes; its blob "
                                f"{f.digest} has {stored[f.digest]}"} for f in lying[:50]])
    now = rt.clock()
    await rt.blobs.touch(m.digests(), now)
    try:
        created = await rt.blobs.put(d, data, now, principal.key_id, limit=access.blob_limit(rt), bundle=True)
    except OverQuota as exc:
        raise access.over_quota(exc, principal) from None
    return web.json_response({"bundle": d, "files": len(m.files), "size": m.total_size}, status=201 if created else 200)


async def get_manifest(request: web.Request) -> web.Response:
    """A bundle the caller may read (``bundle_access.may_read``); 404 otherwise, as for none."""
    d = _digest_param(request)
    rt = request.app[RUNTIME]
    data = await rt.blobs.get(d) if await access.may_read(rt, request[PRINCIPAL], d, bundle=True) else None
    if data is None:
        raise NotFound(f"no bundle {d} this key may read (its uploader's, an admin's, or a worker's that runs a task "
                       "naming it)")
    return web.Response(body=data, content_type="application/json")


async def check_bundles(rt: Runtime, principal: sa.Principal, tasks: Sequence[TaskSpec], listed: bool) -> None:
    """At submit, for the bundles the tasks name: the key may ship code, each manifest is stored
    (ValidationError naming the missing ones), what each task's config names in its bundle is
    there (its kind's ``shipped`` rules: a test file, a handler's module), and the bundle's blobs
    count as used now. ``listed``: the tasks came as a JSON list (errors say ``[i].``)."""
    wanted = sorted({s.bundle for s in tasks if s.bundle is not None})
    if not wanted:
        return
    require_allow_code(principal)
    absent = [d for d in wanted if not await _accepted(rt, principal, d)]
    if absent:
        raise ValidationError([{"field": "bundle", "error": f"bundle {a} was not uploaded by this key through "
                                "PUT /api/v1/bundles (upload it first: dt submit --bundle DIR)"} for a in absent])
    manifests = {d: mf.decode(data) for d in wanted if (data := await rt.blobs.get(d)) is not None}
    files = {d: frozenset(f.path for f in m.files) for d, m in manifests.items()}
    registry, errors = kinds.active(), []
    for i, s in enumerate(tasks):
        if s.bundle in files:
            kind = registry.get(s.type)
            errors += [{"field": f"{f'[{i}].' if listed else ''}config.{field}", "error": error}
                       for field, error in kind.shipped(kind.decode(s.config), files[s.bundle])]
    if errors:
        raise ValidationError(errors)
    now = rt.clock()
    for d, m in manifests.items():
        await rt.blobs.touch({d, *m.digests()}, now)


async def _accepted(rt: Runtime, principal: sa.Principal, digest: str) -> bool:
    """Whether the manifest route accepted bundle ``digest`` for this key (an admin's: for any)."""
    holders = await rt.blobs.holders(digest)
    return holders.get(principal.key_id, False) or principal.role == Role.ADMIN and any(holders.values())


async def sweep(rt: Runtime, active_bundles: Iterable[str]) -> int:
    """Mark the blobs of unfinished tasks' bundles used, then delete what no upload or task used
    within ``--bundle-retention``; how many blobs were deleted."""
    now = rt.clock()
    for d in set(active_bundles):
        data = await rt.blobs.get(d)
        if data is not None:
            await rt.blobs.touch({d, *mf.decode(data).digests()}, now)
    gone = await rt.blobs.sweep(now - rt.config.bundle_retention_s)
    if gone:
        log.info("deleted %d bundle blobs unused for %g s (--bundle-retention)", gone, rt.config.bundle_retention_s)
    return gone


# The routes whose body is read with ``read_capped`` (up to ``body_cap``, not the app's body limit).
CAPPED = frozenset({("PUT", "/api/v1/blobs/{digest}"), ("POST", "/api/v1/blobs"), ("PUT", "/api/v1/bundles/{digest}")})
ROUTES: list[tuple[str, str, Any, str]] = [
    ("POST", "/api/v1/blobs/missing", missing_blobs, "bundles:upload"),
    ("PUT", "/api/v1/blobs/{digest}", put_blob, "bundles:upload"),
    ("POST", "/api/v1/blobs", put_blobs, "bundles:upload"),
    ("GET", "/api/v1/blobs/{digest}", get_blob, "bundles:read"),
    ("PUT", "/api/v1/bundles/{digest}", put_manifest, "bundles:upload"),
    ("GET", "/api/v1/bundles/{digest}", get_manifest, "bundles:read"),
]
