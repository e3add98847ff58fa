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
