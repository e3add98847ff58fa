"""Content-addressed project bundles: a directory shipped as blobs plus a manifest.

The contract (what ``dt submit --bundle``, the pytest plugin and the worker rely on):

* A **blob** is the bytes of one file, named by its digest: the lower-case hex SHA-256 of those
  bytes (:func:`digest.of_bytes`). The coordinator stores a blob once, whatever the number of
  bundles that hold it, and checks the digest on arrival.
* A **manifest** (:class:`manifest.Manifest`) lists every file of the tree: POSIX path relative to
  the tree's root, digest, size and mode (``0o644`` or ``0o755``: only the owner's execute bit is
  kept). Its bytes are ``manifest.encode(m)`` (files sorted by path) and its digest, the SHA-256 of
  those bytes, is the bundle's name: ``"bundle": "<manifest digest>"`` in a task.
* :func:`manifest.scan(root)` builds the manifest of a directory: ``.git/``, ``__pycache__/`` and ``.pytest_cache/`` are skipped, the
  ``.gitignore`` and ``.dtignore`` files of every directory are honoured (gitignore syntax, a
  ``.dtignore`` read after the ``.gitignore`` beside it so it can re-include with ``!``; what a
  build wrote beside its sources ships even where a ``.gitignore`` lists it: :mod:`.ignore`), a symlink
  whose target leaves ``root`` raises :class:`~distributed_testing.errors.ValidationError` naming
  it, a symlink to a file inside ``root`` is shipped as that file's content, and a symlinked
  directory or a symlink loop is refused. Returns ``(manifest, {digest: local path})``.
  :func:`manifest.validate` (the coordinator's manifest route, the worker, ``scan``) refuses paths
  a worker could not lay out: a name over ``MAX_NAME_BYTES`` (255), a path over
  ``MAX_PATH_BYTES`` (1,024) or ``MAX_DEPTH`` (100) levels.
* :func:`upload.upload(base_url, api_key, root)` -> manifest digest (a ``str``): scans ``root``,
  asks the coordinator which digests it lacks, uploads only those (small ones several to a request,
  ``POST /blobs``; one durable write per batch instead of per file), then the manifest. An
  unchanged tree uploads no file (``UploadStats.bytes_sent`` counts blob bytes only); a one-file
  change uploads that file. Needs a key created with ``--allow-code``. ``upload_with_stats``
  returns the stats too. Errors: :class:`upload.UploadError` with the coordinator's status and
  message (413 names the largest files).
* REST (``/api/v1``, every route in ``coordinator/api.py``'s table):

  =======================================  ==================  =====================================
  route                                    permission          body / answer
  =======================================  ==================  =====================================
  ``POST /blobs/missing``                  ``bundles:upload``  ``{"digests": [...]}`` ->
                                                               ``{"missing": [...]}``
  ``PUT /blobs/{digest}``                  ``bundles:upload``  the bytes; 201 stored, 200 already
                                                               there, 400 digest mismatch, 413 cap
  ``POST /blobs``                          ``bundles:upload``  several blobs, each record ``<digest, 64
                                                               ASCII hex><length, 8 bytes big-endian>
                                                               <bytes>``; all stored or none (400
                                                               names each bad record); the body is
                                                               capped like one file. ->
                                                               ``{"stored": n, "created": k}``
  ``GET /blobs/{digest}``                  ``bundles:read``    the bytes (``application/octet-stream``)
  ``PUT /bundles/{digest}``                ``bundles:upload``  the manifest's bytes; 400 when a blob
                                                               it lists is missing (``errors`` names
                                                               them), 413 over ``--max-bundle-mb``
  ``GET /bundles/{digest}``                ``bundles:read``    the manifest's bytes
  =======================================  ==================  =====================================

  ``bundles:upload`` is held by submitter and admin keys *created with* ``--allow-code`` only;
  ``bundles:read`` by worker, submitter and admin keys.
* The worker side: :class:`cache.BlobCache` (a directory of read-only blobs, least recently used
  evicted beyond its cap) and :func:`tree.build_tree` (a read-only tree, hard links from the
  cache, copies where the cache is on another filesystem; a sandboxed worker keeps a bundle's tree
  for its later tasks, each of which gets its own writable view, :func:`tree.writable_view`; see
  :mod:`distributed_testing.worker.bundles`). A task's
  ``requirements.python`` and the bundle's root ``requirements.txt`` (grammar:
  :mod:`distributed_testing.tasks.pyreqs`) make a virtual environment per requirements digest,
  built once with pip inside the task's sandbox and kept beside the blobs
  (:mod:`distributed_testing.worker.pyenv`).
"""

from __future__ import annotations
