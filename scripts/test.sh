#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the tests; extra arguments go to pytest.
#   bash scripts/test.sh          the whole suite (what .ci/run runs): the independent tests on two
#                                 processes (pytest-xdist; DT_TEST_PROCESSES=N for another number),
#                                 then the `serial` ones (they measure time or CPU) alone. Three
#                                 processes were tried: the parallel phase took as long (910 s against
#                                 817 s for two) and a load-sensitive test failed once
#                                 (benchmarks/RESULTS.md, "Test suite time")
#   bash scripts/test.sh --fast   the fast tier, to run before every commit: unit tests and the
#                                 in-process integration tests, no `slow` test (tests/conftest.py)
set -euo pipefail
cd "$(dirname "$0")/.."
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
python -m pytest -q -p no:cacheprovider -m "not serial" -n "${DT_TEST_PROCESSES:-2}" --dist worksteal "$@" || status=$?
serial=0
python -m pytest -q -p no:cacheprovider -m serial "$@" || serial=$?
[ "$serial" = 5 ] && serial=0  # 5: no serial test among those selected
[ "$status" = 0 ] && status=$serial
exit "$status"
