#!/usr/bin/env bash
# Set up and run a real demo: a coordinator on the embedded DuckDB store, a dashboard, two worker
# processes, a run of tasks of each kind (a pytest file, two small benchmarks, custom handlers)
# with progress, and the results printed. Everything lives in ./demo-state. Arguments go to
# python -m distributed_testing.cli.demo (--keep-running, --state-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m distributed_testing.cli.demo "$@"
