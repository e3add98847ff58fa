"""Suite-wide settings. Processes the tests start inherit the environment set here."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_testing.testing import Procs

# Every journal (coordinator store, worker outbox), in-process or in a child process, checks that
# each record decodes back before accepting it: a record built with a wrong field type fails the
# test that made it instead of poisoning a segment. Production leaves this off (docs/operations.md).
os.environ.setdefault("DT_JOURNAL_VALIDATE", "1")


# PostgreSQL (the real server on 127.0.0.1:5432, see distributed_testing.testing): one database per
# test session, created on first use and dropped at the end; each test that asks for ``pg_url``
# gets an empty schema of its own in it, much cheaper than a database per test.


@pytest.fixture(scope="session")
def pg_database_url() -> Iterator[str]:
    from distributed_testing.testing import pg_database_sync

    with pg_database_sync() as url:
        yield url


@pytest.fixture
def pg_url(pg_database_url: str, request: pytest.FixtureRequest) -> str:
    """A URL whose sessions see only a new, empty schema of this test (``?search_path=``)."""
    from distributed_testing.testing import pg_schema_url, run_sync

    schema = "t_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:20]
    return run_sync(pg_schema_url(pg_database_url, schema))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Child processes started from the repository root (its launchers), all stopped after the test."""
    ps = Procs(tmp_path, cwd=Path(__file__).resolve().parents[1])
    try:
        yield ps
    finally:
        ps.close()


# ---------------------------------------------------------------------------------- test tiers
# `scripts/test.sh --fast` runs what is not `slow`: the pure unit tests and the integration tests
# that talk to an in-process coordinator or a real store (integration/api, integration/store).
# Everything that starts workers, benchmark children, pytest runs or launcher processes is slow:
# the other integration folders, e2e, chaos and fuzz, any test using the `procs` fixture, and any
# test marked so. `serial` tests measure time or CPU against the machine's other load: the full
# run keeps them out of its parallel phase and runs them alone afterwards (scripts/test.sh).
_FAST_FOLDERS = {("unit",), ("integration", "api"), ("integration", "store")}


def _is_slow(item: pytest.Item, tests_root: Path) -> bool:
    if item.get_closest_marker("serial") is not None or "procs" in getattr(item, "fixturenames", ()):
        return True
    try:
        parts = Path(str(item.fspath)).resolve().relative_to(tests_root).parts
    except ValueError:
        return False
    if len(parts) == 1:  # top-level checks: static analysis, import layers
        return parts[0] == "test_static_checks.py"
    return tuple(parts[:1]) not in _FAST_FOLDERS and tuple(parts[:2]) not in _FAST_FOLDERS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).resolve().parent
    for item in items:
        if _is_slow(item, tests_root):
            item.add_marker(pytest.mark.slow)
