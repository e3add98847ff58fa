"""The benchmark suite's runner: ``python -m benchmarks NAME [ARGS...]`` (from the repository root).

Runs ``benchmarks/NAME.py`` as a script with ``ARGS``, the repository root and ``benchmarks/``
importable, as ``PYTHONPATH=. python benchmarks/NAME.py ARGS`` does. Without a name, or with
``--help``, it lists the scripts; an unknown name is an error naming the known ones.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def scripts() -> list[str]:
    return sorted(path.stem for path in HERE.glob("*.py") if not path.stem.startswith("_"))


def main(argv: list[str]) -> int:
    known = scripts()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m benchmarks NAME [ARGS...]  (NAME --help for a script's options)")
        print("scripts: " + ", ".join(known))
        return 0 if argv else 2
    name = argv[0].removesuffix(".py")
    if name not in known:
        print(f"python -m benchmarks: unknown benchmark {argv[0]!r} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    sys.path[:0] = [str(HERE), str(ROOT)]
    sys.argv = [str(HERE / f"{name}.py"), *argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
