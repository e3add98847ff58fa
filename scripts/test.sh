#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the tests; extra arguments go to pytest.
#   bash scripts/test.sh          the whole suite (what .ci/run runs): the independent tests on five
#                                 processes (pytest-xdist; DT_TEST_PROCESSES=N for another number),
#                                 then the `serial` ones (they measure time or CPU) alone. On two
#                                 cores the tests wait more than they compute (workers' TTLs, child
#                                 interpreters starting, polls): with three processes the parallel
#                                 phase kept about 1.0 of the 2 cores busy; five took it from 519 s
#                                 to 432 s on the same tree, the same tests failing and passing
#                                 (benchmarks/RESULTS.md, "Test suite time", 2026-11-28)
#   bash scripts/test.sh --fast   the fast tier, to run before every commit: unit tests and the
#                                 in-process integration tests, no `slow` test (tests/conftest.py)
#   bash scripts/test.sh --containers  the container tier (root, podman): installs podman and
#                                 podman-compose, builds the base, the image and a PostgreSQL
#                                 stand-in (scripts/containers.sh), brings the HA group of
#                                 deploy/compose.yaml up and runs scripts/containers_tier.py on it
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--containers" ]; then
  shift
  start=$SECONDS
  bash scripts/setup.sh
  bash scripts/containers.sh setup
  bash scripts/containers.sh image --local-base
  bash scripts/containers.sh postgres
  status=0
  .venv/bin/python scripts/containers_tier.py "$@" || status=$?
  echo "container tier: $((SECONDS - start)) s, exit $status" >&2
  exit "$status"
fi
FAST=0
if [ "${1:-}" = "--fast" ]; then FAST=1; shift; fi
bash scripts/setup.sh
. .venv/bin/activate
# Test modules and the package are assertion-rewritten at import; with bytecode kept, the second
# run on a checkout collects in half the time.
unset PYTHONDONTWRITEBYTECODE
if [ "$FAST" = 1 ]; then
  exec python -m pytest -q -p no:cacheprovider -p no:schemathesis -m "not slow" -n 2 "$@"
fi
status=0
python -m pytest -q -p no:cacheprovider -m "not serial" -n "${DT_TEST_PROCESSES:-5}" --dist worksteal "$@" || status=$?
serial=0
python -m pytest -q -p no:cacheprovider -m serial "$@" || serial=$?
[ "$serial" = 5 ] && serial=0  # 5: no serial test among those selected
[ "$status" = 0 ] && status=$serial
exit "$status"
