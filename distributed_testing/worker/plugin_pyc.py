"""Run by a task environment's own Python once its build is done (:mod:`.pyenv`): write the
assert-rewritten byte code that pytest writes on its first import of each module of a pytest
plugin's distribution, beside the module, as it does in a local virtual environment.

pytest rewrites the asserts of every module of a distribution with a ``pytest11`` entry point
(Hypothesis, anyio, pytest-mock, ...) when a session imports it, and keeps the result in a
``-pytest-X.Y.Z.pyc`` beside the source. A task environment is read-only to the sessions that use
it, so each session rewrote them all again: 6 % of an attrs session's CPU went to rewriting
Hypothesis. Here the environment is still writable (the build's sandbox), and the code is
pytest's own, so what a session finds is what it would have written: it reads the ``.pyc``
pytest checks (against the source's hash from pytest 9.2 on, its size and time before).

Standalone (the environment does not have this package): ``python plugin_pyc.py SITE_DIR...``
rewrites the modules that lie under the given site directories. It exits 0 without a word where
pytest is missing or its private helpers are not the ones it knows: the environment works as
before, only slower to start.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path


class _State:
    """What pytest's ``_write_pyc`` asks of its assertion state: a trace to call."""

    @staticmethod
    def trace(*_args: object) -> None:
        return None


def main(sites: list[str]) -> int:
    try:
        from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc, get_cache_dir
        from _pytest.config import _iter_rewritable_modules
    except ImportError:
        return 0
    roots = [Path(s).resolve() for s in sites]
    for dist in md.distributions(path=[str(r) for r in roots]):
        if not any(ep.group == "pytest11" for ep in dist.entry_points) or not dist.files:
            continue
        names = set(_iter_rewritable_modules([str(f) for f in dist.files]))
        for f in dist.files:
            parts = f.parts
            if not parts or not str(f).endswith(".py") or parts[0].removesuffix(".py") not in names:
                continue
            source = Path(str(dist.locate_file(f))).resolve()
            if not source.is_file() or not any(source.is_relative_to(r) for r in roots):
                continue
            try:
                stamp, code = _rewrite_test(source, None)  # type: ignore[arg-type]  # no config: no pass hook
                cache = get_cache_dir(source)
                cache.mkdir(exist_ok=True)
                _write_pyc(_State(), code, stamp, cache / (source.name[:-3] + PYC_TAIL))  # type: ignore[arg-type]
            except (OSError, SyntaxError, ValueError, TypeError, AttributeError):
                continue  # pytest rewrites it in the session, as before
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
