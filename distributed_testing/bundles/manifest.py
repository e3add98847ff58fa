"""A bundle's manifest: every file's path, digest, size and mode; and the scan that makes one.

See the package docstring for the contract. ``validate`` is what the coordinator and the worker
apply to a manifest they did not make: paths are relative POSIX paths without ``.``, ``..`` or
empty parts, within the ``MAX_NAME_BYTES`` / ``MAX_PATH_BYTES`` / ``MAX_DEPTH`` a worker can lay
out, unique, and no file sits where another path needs a directory.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import msgspec

from ..errors import ValidationError
from . import digest as dg
from .ignore import Rules

MANIFEST_VERSION = 1
MAX_FILES = 200_000
# What a worker can lay out under its own directory: a name of at most 255 bytes (NAME_MAX of
# Linux file systems), a path of at most 1,024 bytes (macOS's PATH_MAX, which leaves Linux's
# 4,096 room for the worker's tree root) and 100 levels (tools that walk a tree recursively,
# pathlib's mkdir among them, stop near Python's 1,000 frames).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 100


class FileEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str
    digest: str
    size: int
    mode: int = 0o644


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    files: list[FileEntry]
    version: int = MANIFEST_VERSION

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def digests(self) -> set[str]:
        return {f.digest for f in self.files}


_decoder = msgspec.json.Decoder(Manifest)


def encode(m: Manifest) -> bytes:
    """The manifest's bytes, files sorted by path (so one tree always has one digest)."""
    return msgspec.json.encode(Manifest(sorted(m.files, key=lambda f: f.path), m.version))


def decode(data: bytes) -> Manifest:
    """Decode and ``validate`` a manifest; ValidationError naming what is wrong."""
    try:
        m = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValidationError([{"field": "manifest", "error": f"not a manifest: {exc}"}]) from exc
    validate(m)
    return m


def validate(m: Manifest) -> None:
    """ValidationError listing every bad entry (see the module docstring)."""
    errors: list[dict[str, str]] = []
    if m.version != MANIFEST_VERSION:
        errors.append({"field": "manifest.version", "error": f"unsupported version {m.version}"})
    if len(m.files) > MAX_FILES:
        errors.append({"field": "manifest.files", "error": f"{len(m.files)} files; at most {MAX_FILES}"})
    seen: set[str] = set()
    dirs: set[str] = set()
    for f in m.files:
        bad = _bad_path(f.path) or (None if dg.is_digest(f.digest) else "digest is not a lower-case hex SHA-256")
        if bad is None and (f.size < 0 or f.mode not in (0o644, 0o755)):
            bad = "size must be >= 0 and mode 0o644 (420) or 0o755 (493)"
        if bad is None and f.path in seen:
            bad = "listed twice"
        if bad:
            errors.append({"field": f"manifest: {f.path[:200]!r}", "error": bad})
            continue
        seen.add(f.path)
        parts = f.path.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    errors += [{"field": f"manifest: {p!r}", "error": "a file where other paths need a directory"}
               for p in sorted(seen & dirs)]
    if errors:
        raise ValidationError(errors[:50])


def _bad_path(path: str) -> str | None:
    if not path or "\x00" in path or "\\" in path:
        return "path must be 1 or more characters without NUL or backslash"
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "path must be relative, without '.', '..' or empty parts"
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        return "path is not valid UTF-8 (a name the file system gave in another encoding)"
    if size > MAX_PATH_BYTES:
        return f"path is {size:,} bytes; at most {MAX_PATH_BYTES:,} (UTF-8)"
    if len(parts) > MAX_DEPTH:
        return f"path is {len(parts):,} levels deep; at most {MAX_DEPTH}"
    long = next((p for p in parts if len(p.encode()) > MAX_NAME_BYTES), None)
    if long is not None:
        return (f"the name {long[:40]!r}... is {len(long.encode()):,} bytes; a file or directory name is at most "
                f"{MAX_NAME_BYTES} bytes (UTF-8)")
    return None


def scan(root: Path) -> tuple[Manifest, dict[str, Path]]:
    """The manifest of the tree at ``root`` and where each digest's bytes are on disk.

    ValidationError names a symlink that leaves ``root``, a symlinked directory, a symlink loop,
    or a path the manifest could not hold."""
    root = Path(root).resolve(strict=True)
    if not root.is_dir():
        raise ValidationError([{"field": "bundle", "error": f"{root} is not a directory"}])
    files: list[FileEntry] = []
    sources: dict[str, Path] = {}
    _walk(root, "", Rules().below(root, ""), files, sources)
    m = Manifest(sorted(files, key=lambda f: f.path))
    validate(m)
    return m, sources


# Directories of state a test run reads and a .gitignore lists, which travel whole all the same:
# Hypothesis's (its example database, replayed first, so a failure found here is tried there too;
# its Unicode and codec tables, which cost each pytest process that lacks them about a second of
# CPU: 15 % of an attrs session's). It writes a ``.gitignore`` of ``*`` into it, which is git's
# business, not the run's; a ``.dtignore`` that lists the directory keeps it local.
RUN_STATE_DIRS = frozenset({".hypothesis"})


def code_digest(m: Manifest) -> str:
    """The digest of ``m`` without its run state (:func:`in_run_state`): one for two bundles that
    differ only there (the byte code a session kept serves the next, whose local run between
    them changed ``.hypothesis/``)."""
    return hashlib.sha256(encode(Manifest([f for f in m.files if not in_run_state(f.path)], m.version))).hexdigest()


def in_run_state(path: str) -> bool:
    """Whether the bundle path ``path`` lies in a run's state directory (:data:`RUN_STATE_DIRS`):
    what no build reads, and what every local run changes."""
    return not RUN_STATE_DIRS.isdisjoint(path.split("/")[:-1])


def _walk(root: Path, rel_dir: str, rules: Rules, files: list[FileEntry], sources: dict[str, Path],
          whole: bool = False) -> None:
    """Add the files under ``rel_dir`` that ``rules`` ship; ``whole``: a run's state directory
    (:data:`RUN_STATE_DIRS`), whose files ship where only a ``.gitignore`` leaves them out, its
    own ignore files unread."""
    if rel_dir.count("/") + 1 >= MAX_DEPTH:  # a file below would be refused anyway; and the walk recurses
        raise ValidationError([{"field": f"bundle: {rel_dir[:200]}", "error": f"directories nested more than "
                                f"{MAX_DEPTH} levels deep; a bundle's paths are at most {MAX_DEPTH} levels"}])
    with os.scandir(root / rel_dir) as it:
        entries = sorted(it, key=lambda e: e.name)
    held_back: list[tuple[str, os.DirEntry[str]]] = []  # ignored files: shipped only if built from a shipped one
    shipped: set[str] = set()
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        if entry.is_symlink():
            _symlink(root, rel, Path(entry.path), rules, files, sources)
        elif entry.is_dir(follow_symlinks=False):
            by = rules.left_out_by(rel, True)
            if by in (None, ".gitignore") and (whole or entry.name in RUN_STATE_DIRS):
                _walk(root, rel, rules, files, sources, whole=True)
            elif by is None:
                _walk(root, rel, rules.below(root, rel), files, sources)
        elif entry.is_file(follow_symlinks=False):
            by = rules.left_out_by(rel, False)
            if by is None or (whole and by == ".gitignore"):
                shipped.add(entry.name)
                _add(rel, Path(entry.path), entry.stat(follow_symlinks=False).st_mode, files, sources)
            elif by == ".gitignore":
                held_back.append((rel, entry))
    for rel, entry in held_back:
        if _built_output(entry, shipped):
            _add(rel, Path(entry.path), entry.stat(follow_symlinks=False).st_mode, files, sources)


def _built_output(entry: os.DirEntry[str], shipped: set[str]) -> bool:
    """Whether a file a ``.gitignore`` leaves out is what a build wrote into the tree, which the
    local run imports or reads, so that it ships all the same: a version file written at install
    (:func:`_generated_version`), or an output beside the source it was built from, that source
    shipped (``shipped``: the names of the directory's files that ship; :func:`_built_from`)."""
    return any(source in shipped for source in _built_from(entry.name)) or _generated_version(entry)


# What a build writes beside its source, and a .gitignore lists: an extension module compiled in
# place (``name.cpython-311-x86_64-linux-gnu.so``, ``name.abi3.so``, ``name.pyd``) from
# ``name.pyx``, ``name.c``, ... (Cython, a C extension, mypyc's ``name.py``), and a catalogue of
# translations (``name.mo``) compiled from ``name.po``. The local run imports or opens them.
_EXTENSION_SUFFIXES = (".so", ".pyd")
_EXTENSION_SOURCES = (".pyx", ".py", ".c", ".cpp", ".cc", ".cxx")


def _built_from(name: str) -> tuple[str, ...]:
    """The names of the sources in the same directory that the ignored file ``name`` is built from,
    where it is such an output: shipped with its source, since the local run has it (humanize's
    compiled ``*.mo`` translations are ignored by git: 144 of its tests skipped on the workers)."""
    if name.endswith(".mo"):
        return (name[:-3] + ".po",)
    if name.endswith(_EXTENSION_SUFFIXES):
        stem = name.split(".", 1)[0]
        return tuple(stem + suffix for suffix in _EXTENSION_SOURCES) if stem else ()
    return ()


# The head of the version file setuptools-scm (and hatch-vcs, vcs-versioning, which use its
# template) writes into a package when it is installed, and which the project's .gitignore lists.
_VERSION_FILE_HEAD = (b"# file generated by ", b"# don't change, don't track in version control")


def _generated_version(entry: os.DirEntry[str]) -> bool:
    """Whether an ignored file is a version file written at install time (``_version.py`` of a
    setuptools-scm or hatch-vcs project): shipped all the same, since the package imports it
    and the local run has it (humanize's ``--doctest-modules`` run failed to import its package
    on the workers: every test an error). Only a small ``.py`` file with the template's first two
    lines qualifies, so nothing else a ``.gitignore`` keeps local travels."""
    if not entry.name.endswith(".py") or entry.stat(follow_symlinks=False).st_size > 8192:
        return False
    try:
        with open(entry.path, "rb") as f:
            first, second = f.readline(), f.readline()
    except OSError:
        return False
    return first.startswith(_VERSION_FILE_HEAD[0]) and second.rstrip(b"\r\n") == _VERSION_FILE_HEAD[1]


def _symlink(root: Path, rel: str, path: Path, rules: Rules, files: list[FileEntry], sources: dict[str, Path]) -> None:
    try:
        target = path.resolve()
    except (RuntimeError, OSError) as exc:  # Python 3.11 says RuntimeError for a loop, 3.13 OSError (ELOOP)
        if rules.ignored(rel, False):
            return
        raise ValidationError([{"field": f"bundle: {rel}", "error": f"the symlink cannot be followed: {exc}; remove it "
                                "or ignore it in .dtignore"}]) from exc
    if rules.ignored(rel, target.is_dir()):
        return
    if not target.is_relative_to(root):
        raise ValidationError([{"field": f"bundle: {rel}", "error": f"symlink leaves the bundle's directory "
                                f"{root} (it points at {target}); symlinks that leave it are refused"}])
    if target.is_dir():
        raise ValidationError([{"field": f"bundle: {rel}", "error": "symlinked directories are not shipped; "
                                "add the directory itself or ignore the link in .dtignore"}])
    if target.is_file():
        _add(rel, target, target.stat().st_mode, files, sources)


def _add(rel: str, path: Path, mode: int, files: list[FileEntry], sources: dict[str, Path]) -> None:
    d, size = dg.of_file(path)
    files.append(FileEntry(rel, d, size, 0o755 if mode & stat.S_IXUSR else 0o644))
    sources.setdefault(d, path)
