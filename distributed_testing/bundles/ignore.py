"""Which files of a tree are left out of its bundle: ``.git/``, Python's and pytest's caches
(``__pycache__/``, ``.pytest_cache/``: local byte code and history, never what a task should
run), and what ``.gitignore`` and ``.dtignore`` files say (gitignore syntax, via ``pathspec``'s
``GitIgnoreSpec``).

Each directory's ignore files apply to paths below that directory, as git applies them; the
``.dtignore`` of a directory is read after its ``.gitignore``, so ``!pattern`` in it re-includes
what git ignores (a generated file the tests need). A deeper directory's rules come after its
parents' and so win. What a build writes into the tree beside its sources travels even where a
``.gitignore`` lists it (``manifest._built_output``), since the local run imports or reads it: the
version file setuptools-scm or hatch-vcs writes into a package, an extension module compiled in
place next to its source, translations (``.mo``) compiled next to their ``.po``. So does Hypothesis's
``.hypothesis/`` directory, whole (``manifest.RUN_STATE_DIRS``). A ``.dtignore`` that lists one
keeps it local.
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

    layers: tuple[tuple[str, str, pathspec.GitIgnoreSpec], ...] = ()  # (directory, ignore file's name, spec)

    def below(self, root: Path, rel_dir: str) -> Rules:
        """The rules in force inside ``rel_dir`` (``""``: the root): these plus its own files."""
        layers = self.layers
        for name in IGNORE_FILES:
            try:
                lines = (root / rel_dir / name).read_text(encoding="utf-8", errors="replace").splitlines()
            except FileNotFoundError:
                continue
            layers = (*layers, (rel_dir, name, pathspec.GitIgnoreSpec.from_lines(lines)))
        return self if layers is self.layers else Rules(layers)

    def ignored(self, rel_path: str, is_dir: bool) -> bool:
        """True when ``rel_path`` (POSIX, relative to the root) is left out."""
        return self.left_out_by(rel_path, is_dir) is not None

    def left_out_by(self, rel_path: str, is_dir: bool) -> str | None:
        """What leaves ``rel_path`` out: the name of the ignore file whose rule decides (the last
        layer that says anything about it), ``""`` for a name always skipped, None when it ships."""
        if rel_path.rsplit("/", 1)[-1] in ALWAYS_SKIPPED:
            return ""
        verdict: str | None = None
        for base, name, spec in self.layers:
            sub = rel_path[len(base) + 1:] if base else rel_path
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                verdict = name if result.include else None
        return verdict
