#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its test tools. Idempotent.
# torch is pinned to the CPU wheel first: a looser pin would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
# pip runs when this script or pyproject.toml changed since it last completed here (their digest is
# kept in .venv), or the package is not installed: otherwise re-resolving everything cost the demo
# and each test run about ten seconds for nothing.
STAMP=.venv/.dt-setup-digest
DIGEST=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$DIGEST" ] || ! python -c 'import importlib.metadata as m
for name in ("distributed_testing", "torch"): m.version(name)' 2>/dev/null; then
  rm -f "$STAMP"
  python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  python -m pip install -q --disable-pip-version-check "torch==2.13.0"
  python -m pip install -q --disable-pip-version-check -e ".[dev,bench]"
  echo "$DIGEST" > "$STAMP"
fi
# The dashboard's browser tests drive Debian's chromium through Playwright (whose own browser
# download is not used). Installed when missing and possible (root with apt-get); otherwise
# those tests skip, saying why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "setup: could not install chromium; the dashboard's browser tests will skip" >&2
fi
# Workers confine shipped code (bundles) with bubblewrap; without it a worker refuses bundles and
# the sandbox tests skip, saying why.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
    || echo "setup: could not install bubblewrap; workers will refuse shipped code" >&2
fi
