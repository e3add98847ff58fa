"""Suite-wide settings. Processes the tests start inherit the environment set here."""

from __future__ import annotations

import os

# Every journal (coordinator store, worker outbox), in-process or in a child process, checks that
# each record decodes back before accepting it: a record built with a wrong field type fails the
# test that made it instead of poisoning a segment. Production leaves this off (docs/operations.md).
os.environ.setdefault("DT_JOURNAL_VALIDATE", "1")
