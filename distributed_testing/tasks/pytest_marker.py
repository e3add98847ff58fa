"""The ``dt`` marker alone, as a pytest plugin for test tasks on workers.

Test tasks run with this project's pytest plugin disabled (``-p no:distributed_testing``: its
``--dt-*`` options would let a task send requests anywhere), but the files they run may carry
``@pytest.mark.dt(...)`` (the plugin groups tests by it), which must stay a registered marker
there, or ``--strict-markers`` would fail them. The worker loads this module instead
(``-p distributed_testing.tasks.pytest_marker``); it adds no option and no hook but this one.
Standalone: it imports nothing of this package, so a shipped run loads a copy of this file in an
environment without the package (``worker/executors/test.py``, ``STANDALONE_PLUGINS``).
"""

from __future__ import annotations

from typing import Any

DT_MARKER = "dt(hardware=None, tags=()): run only on workers that have this hardware and these tags (with --dt-coordinator)"


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", DT_MARKER)
