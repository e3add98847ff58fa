"""Write docs/openapi.json: the coordinator's OpenAPI description, as ``GET /api/v1/openapi.json``
serves it with the default configuration. ``--check``: exit 1 if the committed file differs.

    python scripts/gen_openapi.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.api import openapi_text
from distributed_testing.coordinator.server import create_app

TARGET = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def generated() -> str:
    """The document of a coordinator with the default flags, as stable, indented JSON."""
    return openapi_text(create_app(CoordinatorConfig(db_path="memory://")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    ns = p.parse_args(argv)
    text = generated()
    if ns.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run python scripts/gen_openapi.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
