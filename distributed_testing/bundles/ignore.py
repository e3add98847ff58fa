"""Which files of a tree are left out of its bundle: ``.git/``, Python's and pytest's caches
(``__pycache__/``, ``.pytest_cache/``: local byte code and history, never what a task should
run), and what ``.gitignore`` and ``.dtignore`` files say (gitignore syntax, via ``pathspec``'s
``GitIgnoreSpec``).

Each directory's ignore files apply to paths below that directory, as git applies them; the
``.dtignore`` of a directory is read after its ``.gitignore``, so ``!pattern`` in it re-includes
what git ignores (a generated file the tests need). A deeper directory's rules come after its
parents' and so win. One kind of ignored file travels all the same (``manifest._generated_version``):
the version file setuptools-scm or hatch-vcs writes into a package at install, which it imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".dtignore")
ALWAYS_SKIPPED = frozenset({".git", "__pycache__", ".pytest_cache"})


@dataclass(frozen=True)
class Rules:
    """The ignore rules in force in one directory: (directory relative to root, spec) pairs,
    outermost first."""

    layers: tuple[tuple[str, pathspec.GitIgnoreSpec], ...] = ()

    def below(self, root: Path, rel_dir: str) -> Rules:
        """The rules in force inside ``rel_dir`` (``""``: the root): these plus its own files."""
        lines: list[str] = []
        for name in IGNORE_FILES:
            try:
                lines += (root / rel_dir / name).read_text(encoding="utf-8", errors="replace").splitlines()
            except FileNotFoundError:
                continue
        if not lines:
            return self
        return Rules((*self.layers, (rel_dir, pathspec.GitIgnoreSpec.from_lines(lines))))

    def ignored(self, rel_path: str, is_dir: bool) -> bool:
        """True when ``rel_path`` (POSIX, relative to the root) is left out; the last layer that
        says anything about it decides."""
        if rel_path.rsplit("/", 1)[-1] in ALWAYS_SKIPPED:
            return True
        verdict = False
        for base, spec in self.layers:
            sub = rel_path[len(base) + 1:] if base else rel_path
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                verdict = bool(result.include)
        return verdict
