#!/usr/bin/env bash
# Set up and run a real demo: a coordinator on the embedded DuckDB store, two worker processes,
# the worker guide's sample tasks, and the results printed. Everything lives in ./demo-state.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m distributed_testing.cli.demo "$@"
