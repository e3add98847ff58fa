"""Write the option tables of README.md ("Worker options", the dashboard's) and docs/operations.md
("Coordinator") from the settings tables (distributed_testing/cli/worker_options.py,
coordinator_options.py, dashboard.py):
each sits between ``<!-- options:NAME -->`` and ``<!-- /options:NAME -->``. ``--check``: exit 1
if a committed file differs.

    python scripts/gen_options.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from distributed_testing.cli.coordinator_options import COORDINATOR_SETTINGS
from distributed_testing.cli.dashboard import DASHBOARD_SETTINGS
from distributed_testing.cli.options import Setting, markdown_default_rows, markdown_rows
from distributed_testing.cli.worker_options import WORKER_SETTINGS

ROOT = Path(__file__).resolve().parent.parent
# file, block name, settings, renderer
BLOCKS: list[tuple[Path, str, tuple[Setting, ...], Callable[[Iterable[Setting]], list[str]]]] = [
    (ROOT / "README.md", "worker", WORKER_SETTINGS, markdown_rows),
    (ROOT / "docs" / "operations.md", "coordinator", COORDINATOR_SETTINGS, markdown_default_rows),
    (ROOT / "README.md", "dashboard", DASHBOARD_SETTINGS,
     partial(markdown_default_rows, title="`dashboard_server.py` / `dt-dashboard` flag")),
]


def replace_block(text: str, name: str, rows: list[str]) -> str:
    """``text`` with the lines between the block's markers replaced by ``rows``."""
    start, end = f"<!-- options:{name} -->", f"<!-- /options:{name} -->"
    head, sep, rest = text.partition(start + "\n")
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"no {start} ... {end} block")
    return head + start + "\n" + "\n".join(rows) + "\n" + end + tail


def generated() -> dict[Path, str]:
    """Every target file's text as the tables make it."""
    out: dict[Path, str] = {}
    for path, name, settings, render in BLOCKS:
        out[path] = replace_block(out.get(path) or path.read_text(), name, render(settings))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the committed files instead of writing them")
    ns = p.parse_args(argv)
    stale = [path for path, text in generated().items() if path.read_text() != text]
    if ns.check:
        for path in stale:
            print(f"{path} is out of date: run python scripts/gen_options.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated().items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
