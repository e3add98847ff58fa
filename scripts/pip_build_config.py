"""Print the ``podman build`` options that give a build this machine's pip configuration.

Where the package registries are reached through settings of this machine (a CA bundle, a
find-links directory, a local index, a constraints file: what ``pip config list`` shows from the
config files and the ``PIP_*`` variables), a container build that uses the public defaults finds
neither the registry nor the CPU torch wheel. This writes those settings, merged, into one
``pip.conf`` (``OUT``) and prints, one per line, the ``--volume`` options that mount it at the
build's ``/etc/pip.conf`` and every local path it names at the same path, read-only (and empties
the Containerfile's ``TORCH_INDEX`` where a CPU torch wheel lies in a find-links directory). Nothing is
copied into the image: the mounts exist only while a ``RUN`` step runs.

    python3 scripts/pip_build_config.py build/containers/pip.conf
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

# pip options whose values are local paths or file:// URLs to mount
PATH_OPTIONS = ("cert", "client-cert", "constraint", "requirement", "find-links", "index-url", "extra-index-url")


def settings() -> dict[str, str]:
    """``pip config list`` as {option: value}: later scopes (the ``PIP_*`` variables) win."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=True).stdout
    merged: dict[str, str] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"([^.]*)\.([\w-]+)='(.*)'", line.strip())
        if m and m.group(1) in ("global", "install", ":env:"):
            merged[m.group(2)] = m.group(3)
    return merged


def local_paths(values: dict[str, str]) -> list[Path]:
    """The existing local files and directories the settings name (plain paths and file:// URLs)."""
    found: set[Path] = set()
    for option in PATH_OPTIONS:
        for item in values.get(option, "").split():
            path = Path(urlparse(item).path) if item.startswith("file:") else Path(item)
            if "://" in item and not item.startswith("file:"):
                continue
            if option.endswith("index-url") and path.name == "simple":
                path = path.parent  # an index's pages link to files beside simple/ (../../files/...)
            if path.is_absolute() and path.exists():
                found.add(path.resolve())
    return sorted(found)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: pip_build_config.py OUT (the pip.conf to write)", file=sys.stderr)
        return 2
    out = Path(argv[0]).absolute()
    values = settings()
    conf = configparser.ConfigParser()
    conf["global"] = {k: v for k, v in values.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        conf.write(f)
    print(f"--volume={out}:/etc/pip.conf:ro")
    for path in local_paths(values):
        print(f"--volume={path}:{path}:ro")
    # a CPU torch wheel among the find-links: the build need not ask download.pytorch.org for
    # every requirement (the Containerfile's TORCH_INDEX)
    links = [Path(p) for p in values.get("find-links", "").split() if Path(p).is_dir()]
    if any(w for d in links for w in d.glob("torch-*+cpu-*.whl")):
        print("--build-arg=TORCH_INDEX=")
    return 0


if __name__ == "__main__":
    os.environ.pop("PIP_CONFIG_FILE", None)  # the merged view, not one file's
    sys.exit(main(sys.argv[1:]))
