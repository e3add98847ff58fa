"""pytest plugin: collect locally, run the tests on the fleet, report them as if they ran here.

Registered through the ``pytest11`` entry point (name ``distributed_testing``); inert unless
``--dt-coordinator URL`` is given. Then, after local collection (so ``-k``, ``-m``, ``--deselect``
and paths select as usual):

* The selected tests are grouped into ``test`` tasks: one per module and ``dt`` marker
  requirement. ``@pytest.mark.dt(hardware="cuda", tags=["gpu-a"])`` (``hardware``: one name or a
  list) becomes the task's ``requirements``, so only workers that meet it run the test; unmarked
  tests go to any worker. The task's ``test_file`` and ``test_args`` are the tests' node ids
  relative to ``--dt-test-root``.
* **Files are not shipped**: each worker runs them from its own ``--test-root``, which must hold
  the same tree as ``--dt-test-root`` here (default: pytest's rootdir): a shared or synchronised
  checkout.
* Every test's outcome comes back as a normal report: pass, fail (with the remote traceback as
  the report's longrepr), skip, xfail, error; the terminal summary, ``--junitxml`` (each test
  case gets a ``dt_worker`` property naming the worker that ran it), ``-x`` / ``--maxfail``
  (remaining tasks are cancelled) and pytest's exit codes work unchanged. A test a task did not
  report (the task failed before running it, or timed out) is reported failed with the task's
  error.

Credentials: ``--dt-api-key`` or ``DT_API_KEY`` (a submitter key or JWT); ``--dt-ca-file`` or
``DT_CA_FILE`` for a private CA. ``--dt-timeout S`` (default 3600) bounds the whole wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from .cli.http import ApiClient, ApiError
from .config import env_pick, environ, parse_urls
from .errors import ConfigError
from .security import tls
from .tasks.pytest_marker import DT_MARKER

WAIT_CHUNK_S = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distributed_testing", "run the tests on a distributed_testing fleet")
    group.addoption("--dt-coordinator", metavar="URL", help="run the collected tests on this coordinator's workers (or the comma-separated URLs of an HA group)")
    group.addoption("--dt-api-key", metavar="KEY", help="submitter API key or JWT (env DT_API_KEY)")
    group.addoption("--dt-ca-file", metavar="PATH", help="PEM CA bundle for an https coordinator (env DT_CA_FILE)")
    group.addoption("--dt-test-root", metavar="DIR",
                    help="local directory that the workers' --test-root mirrors (default: the rootdir)")
    group.addoption("--dt-timeout", type=float, default=3600.0, metavar="S",
                    help="give up waiting for the fleet after S seconds (default 3600)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", DT_MARKER)
    if config.getoption("--dt-coordinator"):
        config.pluginmanager.register(FleetRunner(config), "distributed_testing-fleet")


@dataclass
class Group:
    """One test task: tests of one module with one requirement."""

    test_path: str
    requirements: dict[str, Any]
    items: list[pytest.Item] = field(default_factory=list)
    remote_ids: list[str] = field(default_factory=list)


def requirements_of(item: pytest.Item) -> dict[str, Any]:
    """The ``dt`` marker as a task's ``requirements`` (empty without the marker)."""
    marker = item.get_closest_marker("dt")
    if marker is None:
        return {}
    unknown = set(marker.kwargs) - {"hardware", "tags"}
    if marker.args or unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.dt takes hardware= and tags= only, "
                                f"got {list(marker.args) + sorted(unknown)}")
    hardware = marker.kwargs.get("hardware")
    tags = marker.kwargs.get("tags", ())
    req: dict[str, Any] = {}
    if hardware:
        req["hardware"] = [hardware] if isinstance(hardware, str) else list(hardware)
    if tags:
        req["tags"] = [tags] if isinstance(tags, str) else list(tags)
    return req


def remote_id(item: pytest.Item, root: Path) -> str:
    """The item's node id relative to ``root`` (the worker's test root)."""
    try:
        rel = item.path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError as exc:
        raise pytest.UsageError(f"{item.nodeid}: {item.path} is not under --dt-test-root {root}") from exc
    _, sep, rest = item.nodeid.partition("::")
    return rel + sep + rest


def group_items(items: Iterable[pytest.Item], root: Path) -> list[Group]:
    """Items grouped by (module, requirements), in collection order."""
    groups: dict[tuple[str, str], Group] = {}
    for item in items:
        rid = remote_id(item, root)
        req = requirements_of(item)
        path = rid.partition("::")[0]
        g = groups.setdefault((path, repr(sorted(req.items()))), Group(path, req))
        g.items.append(item)
        g.remote_ids.append(rid)
    return list(groups.values())


def task_doc(g: Group, index: int, run_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"task_id": f"pytest-{run_id}-{index}", "type": "test",
                           "config": {"test_file": g.remote_ids[0], "test_args": g.remote_ids[1:]}}
    if g.requirements:
        doc["requirements"] = g.requirements
    return doc


def _client(config: pytest.Config) -> ApiClient:
    env = environ()
    urls = parse_urls(config.getoption("--dt-coordinator"), "--dt-coordinator")
    key, _ = env_pick(config.getoption("--dt-api-key"), env, "DT_API_KEY")
    if not key:
        raise pytest.UsageError("--dt-coordinator needs credentials: pass --dt-api-key or set DT_API_KEY")
    ca, ca_src = env_pick(config.getoption("--dt-ca-file"), env, "DT_CA_FILE")
    try:
        context = tls.client_context(Path(ca) if ca else None, "--dt-ca-file" if ca_src == "flag" else ca_src)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    return ApiClient(urls, key, ssl_context=context if any(u.startswith("https://") for u in urls) else None)


class FleetRunner:
    """Replaces pytest's run loop with submit, wait and report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        root = config.getoption("--dt-test-root")
        self.root = Path(root) if root else Path(config.rootpath)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        if session.config.option.collectonly or not session.items:
            return True
        api = _client(self.config)
        try:
            self._run(session, api)
        except ApiError as exc:
            raise pytest.UsageError(f"distributed_testing: {exc}") from exc
        return True

    def _run(self, session: pytest.Session, api: ApiClient) -> None:
        groups = group_items(session.items, self.root)
        run_id = f"{int(time.time() * 1000):x}"
        accepted = api.post("/api/v1/tasks", [task_doc(g, i, run_id) for i, g in enumerate(groups)],
                            repeatable=True)["tasks"]  # every task has its id: a re-send is the same tasks
        task_ids = [a["task_id"] for a in accepted]
        deadline = time.monotonic() + self.config.getoption("--dt-timeout")
        for n, (g, task_id) in enumerate(zip(groups, task_ids, strict=True)):
            self._report_group(g, _wait(api, task_id, deadline))
            if session.shouldfail or session.shouldstop:
                for left in task_ids[n + 1:]:
                    _cancel(api, left)
                break

    def _report_group(self, g: Group, task: dict[str, Any]) -> None:
        result = task.get("result") or {}
        output = result.get("output") or {}
        worker = result.get("worker_id") or "-"
        by_id = {t.get("nodeid"): t for t in output.get("tests") or [] if isinstance(t, dict)}
        outcome = task.get("outcome") or {}
        missing = (f"not reported by task {task['task_id']} ({task.get('state')}): "
                   f"{outcome.get('error') or result.get('error') or 'no result'}")
        for item, rid in zip(g.items, g.remote_ids, strict=True):
            report_item(item, by_id.get(rid), worker, missing)


def _wait(api: ApiClient, task_id: str, deadline: float) -> dict[str, Any]:
    while True:
        left = deadline - time.monotonic()
        t: dict[str, Any] = api.get(f"/api/v1/tasks/{task_id}", {"wait": f"{max(0.0, min(WAIT_CHUNK_S, left)):.3f}"})
        if t.get("outcome") is not None or left <= 0:
            return t if t.get("outcome") is not None else {**t, "outcome": {"error": "--dt-timeout ran out"}}


def _cancel(api: ApiClient, task_id: str) -> None:
    """Cancel a task no longer needed; one that finished meanwhile (409) is left as it is."""
    try:
        api.post(f"/api/v1/tasks/{task_id}/cancel", None)
    except ApiError as exc:
        if exc.status != 409:
            raise


def report_item(item: pytest.Item, entry: dict[str, Any] | None, worker: str, missing: str) -> None:
    """Emit setup/call/teardown reports for one test as pytest's runner would."""
    hook = item.ihook
    hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    props = [("dt_worker", worker)]
    outcome = entry.get("outcome") if entry else "error"
    text = (entry or {}).get("longrepr") or (entry or {}).get("message") or missing
    duration = float((entry or {}).get("duration_s") or 0.0)

    def rep(when: Literal["setup", "call", "teardown"], result: Literal["passed", "failed", "skipped"],
            longrepr: Any = None, dur: float = 0.0) -> pytest.TestReport:
        return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, result, longrepr, when,
                                 user_properties=props, duration=dur)

    if outcome == "skipped":
        path, line, _ = item.location
        reports = [rep("setup", "skipped", (str(path), (line or 0) + 1, f"Skipped: {(entry or {}).get('message')}"))]
    elif outcome == "error":
        reports = [rep("setup", "failed", f"[dt worker {worker}]\n{text}")]
    else:
        result: Literal["passed", "failed", "skipped"] = (
            "passed" if outcome == "passed" else "skipped" if outcome == "xfailed" else "failed")
        call = rep("call", result,
                   None if outcome in ("passed", "xfailed") else f"[dt worker {worker}]\n{text}", duration)
        if outcome == "xfailed":
            call.wasxfail = str((entry or {}).get("message") or "")
        reports = [rep("setup", "passed"), call]
    reports.append(rep("teardown", "passed"))
    for r in reports:
        hook.pytest_runtest_logreport(report=r)
    hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
