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
python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
python -m pip install -q --disable-pip-version-check "torch==2.13.0"
python -m pip install -q --disable-pip-version-check -e ".[dev,bench]"
