"""``dt``: the command line for people and CI.

Reads DT_COORDINATOR_URL (one URL, or the comma-separated members of an HA group: see
``cli/http.py``), DT_API_KEY and DT_CA_FILE; ``--coordinator``, ``--api-key`` and ``--ca-file``
override. An https coordinator's certificate is always verified (``--ca-file`` for a
private CA, else the system's CAs). Exit codes:
0 success (every waited-for task succeeded), 1 a task failed, errored, timed out or was
cancelled, 2 invalid input, bad credentials, an unreachable coordinator or a refused request, 3 ``submit
--fail-if-unschedulable`` stopped the wait (a task no connected worker can run), 4 ``submit
--timeout`` ran out before every task finished, 130 interrupted (Ctrl-C; during ``submit --wait``
one line says that the tasks keep running and the ``dt cancel`` command that stops them) (``dt
compare`` and ``--baseline`` exit 1 when a benchmark got slower, 2 when a task id has no result or
none is a benchmark result; ``dt cancel`` of a task that had already finished exits 0 and says on
stderr that nothing was cancelled, of an unknown id 2 after trying the other ids; a reader that
closes stdout early, as ``| head`` does, ends the command quietly with 0); errors go to stderr,
once. Only the requested
data goes to stdout. Each subcommand is added by a ``register(sub)`` function in ``REGISTRARS``
that sets the ``run`` default to its handler ``(ApiClient, Namespace) -> exit code``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from ..config import DEFAULT_COORDINATOR_URL, environ, parse_urls
from ..errors import ConfigError
from ..security import tls
from ..tasks.states import WORKER_STATES
from . import compare, logs, runs, status, submit
from .common import positive_seconds
from .http import FAILOVER_S, ApiClient, ApiError
from .options import SWITCH, Setting, add_settings, resolve
from .report import print_results, print_table, with_iso_times
from .submit import EXIT_FAILED, EXIT_GAVE_UP, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNSCHEDULABLE, EXIT_USAGE

__all__ = ["EXIT_FAILED", "EXIT_GAVE_UP", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_UNSCHEDULABLE", "EXIT_USAGE",
           "build_parser", "main"]

EPILOG = """exit codes:
  0  success (with --wait: every task succeeded)
  1  a task failed, errored, timed out or was cancelled
  2  invalid input, bad credentials, an unreachable coordinator or a request it refused (4xx)
  3  submit --fail-if-unschedulable: a task had no connected worker able to run it for S seconds
  4  submit --timeout ran out before every task finished (the tasks stay queued)
  130  interrupted (Ctrl-C); submit --wait then prints the dt cancel command for the tasks that
       keep running
  (dt compare, and submit --baseline: 1 when a benchmark got slower, 2 when a task id has no
   result or none is a benchmark result; dt cancel of a finished task: 0, and stderr says that
   nothing was cancelled; of an unknown id: 2, after the other ids were tried)
"""

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


# dt's own flags (every subcommand's are in its register function); cli/options.py reads them
DT_SETTINGS: tuple[Setting, ...] = (
    Setting("--coordinator", env="DT_COORDINATOR_URL", default=(DEFAULT_COORDINATOR_URL,), check=parse_urls,
            help="coordinator URL (a coordinator, or a load balancer in front of an HA group), or the "
                 "comma-separated URLs of a group: a redirect to the leader is followed, and a failover is waited "
                 f"out for up to {FAILOVER_S:g} s (what is safe to repeat is sent again after a timeout, a dropped "
                 f"connection or a 502/503/504, to the next URL if there is one) (default {DEFAULT_COORDINATOR_URL})"),
    Setting("--api-key", env="DT_API_KEY", help="API key or JWT"),
    Setting("--ca-file", type=Path, env="DT_CA_FILE", field="ssl_context", check=tls.client_context,
            help="PEM CA bundle to verify an https coordinator's certificate with (default: the system's CAs)"),
    runs.DASHBOARD_SETTING,
    Setting("--local-time", type=SWITCH, read=False,
            help="show times in the local zone with its offset (default: UTC, ISO 8601 with Z)"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt", description="Submit and inspect distributed_testing tasks.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings(p, DT_SETTINGS)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return p


def register_keys(sub: SubParsers) -> None:
    keys = sub.add_parser("keys", help="manage API keys (admin)")
    keys.set_defaults(run=cmd_keys)
    ksub = keys.add_subparsers(dest="keys_cmd", required=True, metavar="ACTION")
    kc = ksub.add_parser("create", help="create a key; prints only the key")
    kc.add_argument("--role", required=True, choices=["admin", "submitter", "worker", "viewer"],
                    help="what the key may do (see docs/security.md)")
    kc.add_argument("--name", help="a label shown by keys list (default: <role>-key)")
    kc.add_argument("--expires-in", type=positive_seconds, metavar="S", help="expire after S seconds")
    kc.add_argument("--allow-code", action="store_true",
                    help="the key may upload bundles and submit tasks that run them (submitter or admin; "
                         "see docs/security.md, \"Shipped code\")")
    ksub.add_parser("list", help="list keys (never their secrets)")
    kr = ksub.add_parser("revoke", help="revoke a key now (and every JWT derived from it)")
    kr.add_argument("key_id", help="the key's id, as keys list shows it")


def register_token(sub: SubParsers) -> None:
    tk = sub.add_parser("token", help="exchange the API key (or a JWT) for a short-lived JWT; prints only the token")
    tk.add_argument("--json", action="store_true",
                    help="print the whole answer: token, expires_at, role, key_id, session_expires_at")
    tk.set_defaults(run=cmd_token)


def register_tasks(sub: SubParsers) -> None:
    text = ("show one task: on a terminal its state, worker, duration, result, error and failed tests (each with "
            "its crash message and file:line); elsewhere (a pipe, a file) the whole task as JSON")
    st = sub.add_parser("status", help=text, description=text)
    st.add_argument("task_id", help="the task's id")
    shape = st.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_const", const="json", dest="shape",
                       help="the whole task as JSON (times in ISO 8601), also on a terminal")
    shape.add_argument("--text", action="store_const", const="text", dest="shape",
                       help="the human format, also when stdout is no terminal")
    st.set_defaults(run=cmd_status)
    text = ("cancel pending or running tasks, each reported on its own line (a finished one stays as it is: stderr "
            "says nothing was cancelled, exit 0; an unknown id exits 2 after the others were tried); --run RUN "
            "cancels every unfinished task of a run; --state, --type, --tag, --worker and --submitted-by cancel "
            "the unfinished tasks that match them all (within --run's run where given)")
    cn = sub.add_parser("cancel", help=text, description=text)
    cn.add_argument("task_ids", nargs="*", metavar="TASK_ID", help="the tasks' ids")
    cn.add_argument("--run", metavar="RUN", dest="cancel_run", help="cancel every unfinished task of this run")
    for flag, dest, extra in CANCEL_FILTERS:
        cn.add_argument(flag, dest=dest, **extra)
    cn.set_defaults(run=cmd_cancel)


def register_workers(sub: SubParsers) -> None:
    wk = sub.add_parser("workers", help="list workers (or: workers drain|release WORKER_ID)")
    wk.set_defaults(run=cmd_workers)
    wsub = wk.add_subparsers(dest="workers_cmd", metavar="ACTION")
    state_help = ("only workers in this state (disconnected: not connected now; forgotten after the "
                  "coordinator's --worker-retention)")
    wk.add_argument("--state", choices=WORKER_STATES, help=state_help)
    wl = wsub.add_parser("list", help="list workers (the default)")
    wl.add_argument("--state", dest="list_state", choices=WORKER_STATES, help=state_help)
    wd = wsub.add_parser("drain", help="ask a worker to finish or hand back its tasks and leave (admin)")
    wd.add_argument("worker_id", help="the worker's id, as workers list shows it")
    wd.add_argument("--deadline", type=positive_seconds, metavar="S",
                    help="seconds its running tasks may finish before they are handed back (default 30)")
    wd.add_argument("--reason", metavar="TEXT", help="shown as the worker's state reason and in the task history")
    wr = wsub.add_parser("release", help="free a disconnected worker's id from the key it is bound to, so a worker "
                                         "with another key may take it (admin)")
    wr.add_argument("worker_id", help="the worker's id, as workers list shows it")


RESULT_FILTERS = {"task-id": "only this task's results", "worker-id": "only results from this worker",
                  "status": "only results with this status (succeeded, failed, timed_out, error, cancelled)",
                  "model": "only benchmark results of this model", "precision": "only results at this precision",
                  "hardware": "only results measured on this device kind (cpu, cuda, ...)"}


def register_results(sub: SubParsers) -> None:
    rs = sub.add_parser("results", help="list results, newest first")
    rs.add_argument("--format", choices=["table", "json", "csv"], default="table",
                    help="table and csv show finished_at in ISO 8601; json is the API's answer (epoch seconds)")
    for flag, text in RESULT_FILTERS.items():
        rs.add_argument(f"--{flag}", help=text)
    rs.add_argument("--batch-size", type=int, help="only benchmark results with this batch size")
    rs.add_argument("--limit", type=int, default=100, help="at most this many results (default 100)")
    rs.set_defaults(run=cmd_results)


def client_from_args(ns: argparse.Namespace) -> ApiClient:
    v = resolve(DT_SETTINGS, ns, environ())
    if not v["api_key"]:
        raise ConfigError("no credentials: pass --api-key or set DT_API_KEY")
    urls = v["coordinator"]
    context = v["ssl_context"] or tls.client_context(None)
    return ApiClient(urls, v["api_key"], ssl_context=context if any(u.startswith("https://") for u in urls) else None)


def cmd_keys(api: ApiClient, ns: argparse.Namespace) -> int:
    if ns.keys_cmd == "create":
        body: dict[str, Any] = {"role": ns.role}
        if ns.name:
            body["name"] = ns.name
        if ns.expires_in is not None:
            body["expires_in_s"] = ns.expires_in
        if ns.allow_code:
            body["allow_code"] = True
        print(api.post("/api/v1/keys", body)["key"])
    elif ns.keys_cmd == "list":
        print_table(with_iso_times(api.get("/api/v1/keys")["keys"], ns.local_time),
                    ["key_id", "name", "role", "created_at", "expires_at", "revoked_at"])
    else:
        api.post(f"/api/v1/keys/{urllib.parse.quote(ns.key_id, safe='')}/revoke", None)
        print(f"revoked {ns.key_id}", file=sys.stderr)
    return EXIT_OK


def cmd_token(api: ApiClient, ns: argparse.Namespace) -> int:
    answer = api.post("/api/v1/auth/token", None)
    print(json.dumps(answer, indent=2) if ns.json else answer["token"])
    return EXIT_OK


def cmd_status(api: ApiClient, ns: argparse.Namespace) -> int:
    """The human format (:mod:`.status`) on a terminal or with ``--text``; else, and with
    ``--json``, the whole task as JSON, as scripts read it."""
    task = api.get(f"/api/v1/tasks/{urllib.parse.quote(ns.task_id, safe='')}")
    if ns.shape == "text" or (ns.shape is None and sys.stdout.isatty()):
        print("\n".join(status.render(task, ns.local_time)))
    else:
        print(json.dumps(with_iso_times(task, ns.local_time), indent=2))
    return EXIT_OK


def cmd_cancel(api: ApiClient, ns: argparse.Namespace) -> int:
    """Cancel each task in turn, one ``ID: STATE`` line each on stdout. A task that had already
    finished is not running, as asked: stderr says that nothing was cancelled, and it counts as
    done (0). A refused id (unknown: 404; not the caller's: 403) is said on stderr and the rest are
    still tried; the exit status is then that of the refusal (2). An unreachable coordinator
    stops at once: every other id would wait out the same failover bound."""
    filters = {field: value for _flag, field, _extra in CANCEL_FILTERS if (value := getattr(ns, field)) is not None}
    if not ns.task_ids and not ns.cancel_run and not filters:
        raise ConfigError("dt cancel: name the tasks (TASK_ID ...), a run (--run RUN) or filters "
                          "(--state, --type, --tag, --worker, --submitted-by)")
    code, task_ids = EXIT_OK, list(ns.task_ids)
    if filters:
        matched = unfinished_matching(api, filters | ({"run_id": ns.cancel_run} if ns.cancel_run else {}))
        print(f"dt: {len(matched)} unfinished task(s) match the filters", file=sys.stderr)
        task_ids += matched
    elif ns.cancel_run:
        code = runs.cancel_run(api, ns.cancel_run)
    for task_id in dict.fromkeys(task_ids):
        path = f"/api/v1/tasks/{urllib.parse.quote(task_id, safe='')}"
        try:
            before = api.get(path)["state"]
            t = api.post(f"{path}/cancel", None, repeatable=True)  # a second cancel changes nothing: safe to re-send
        except ApiError as exc:
            if exc.status == 0:
                raise
            print(f"dt: {task_id}: {exc}", file=sys.stderr)
            code = max(code, api_error_code(exc))
            continue
        print(f"{t['task_id']}: {t['state']}", flush=True)
        if t["state"] == before and t["state"] not in ("pending", "assigned", "running"):
            print(f"dt: nothing cancelled: task {t['task_id']} had already finished ({t['state']})", file=sys.stderr)
    return code


UNFINISHED = ("pending", "assigned", "running")
# dt cancel's filters: flag, the GET /api/v1/tasks field it sets (also the Namespace attribute), its argparse options
CANCEL_FILTERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--state", "state", {"choices": UNFINISHED, "help": "only unfinished tasks in this state"}),
    ("--type", "type", {"metavar": "TYPE", "help": "only tasks of this type (test, benchmark, custom, training)"}),
    ("--tag", "tag", {"metavar": "TAG", "help": "only tasks whose requirements name this tag"}),
    ("--worker", "worker_id", {"metavar": "WORKER_ID", "help": "only tasks on this worker"}),
    ("--submitted-by", "submitted_by", {"metavar": "KEY_ID", "help": "only tasks this key submitted"}),
)


PAGE = 1000


def unfinished_matching(api: ApiClient, filters: dict[str, str]) -> list[str]:
    """The ids of the unfinished tasks that match every one of ``filters`` (GET /api/v1/tasks
    fields), oldest first, in pages of ``PAGE``."""
    found: list[tuple[float, str]] = []
    for state in [filters["state"]] if "state" in filters else UNFINISHED:
        offset = 0
        while True:
            page = api.get("/api/v1/tasks", {**filters, "state": state, "limit": str(PAGE), "offset": str(offset)})
            found += [(t["submitted_at"], t["task_id"]) for t in page["tasks"]]
            offset += len(page["tasks"])
            if not page["tasks"] or offset >= page["total"]:
                break
    return [task_id for _at, task_id in sorted(found)]


def api_error_code(exc: ApiError) -> int:
    """A refused request (4xx) or an unreachable coordinator is input to fix (2); a coordinator's
    own failure (5xx) is 1."""
    return EXIT_USAGE if exc.status == 0 or 400 <= exc.status < 500 else EXIT_FAILED


def cmd_workers(api: ApiClient, ns: argparse.Namespace) -> int:
    if ns.workers_cmd == "drain":
        return cmd_drain(api, ns)
    if ns.workers_cmd == "release":
        api.post(f"/api/v1/workers/{urllib.parse.quote(ns.worker_id, safe='')}/release", None)
        print(f"{ns.worker_id}: released; the next worker key to register it takes it")
        return EXIT_OK
    only = getattr(ns, "list_state", None) or ns.state
    rows = [{**w, "capabilities": ",".join(w["capabilities"]), "tags": ",".join(w["tags"]), "running": len(w["running"])}
            for w in api.get("/api/v1/workers" + (f"?state={only}" if only else ""))["workers"]]
    print_table(rows, ["worker_id", "name", "state", "reason", "capabilities", "tags", "running", "max_concurrent"])
    return EXIT_OK


def cmd_drain(api: ApiClient, ns: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if ns.deadline is not None:
        body["deadline_s"] = ns.deadline
    if ns.reason is not None:
        body["reason"] = ns.reason
    out = api.post(f"/api/v1/workers/{urllib.parse.quote(ns.worker_id, safe='')}/drain", body)
    print(f"{out['worker_id']}: draining (deadline {out['deadline_s']:g}s)")
    return EXIT_OK


def cmd_results(api: ApiClient, ns: argparse.Namespace) -> int:
    params = {k: str(v) for k, v in {"task_id": ns.task_id, "worker_id": ns.worker_id, "status": ns.status,
                                     "model": ns.model, "precision": ns.precision, "hardware": ns.hardware,
                                     "batch_size": ns.batch_size, "limit": ns.limit}.items() if v is not None}
    print_results(api.get("/api/v1/results", params)["results"], ns.format, ns.local_time)
    return EXIT_OK


Registrar = Callable[[SubParsers], None]
# one entry per subcommand family; a new subcommand adds its module's register function here
REGISTRARS: list[Registrar] = [register_keys, register_token, submit.register, register_tasks, register_workers,
                               register_results,
                               compare.register, logs.register, runs.register]


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of a closed pipe stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is no real file (captured in a test): there is no flush to silence


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        code: int = ns.run(client_from_args(ns), ns)
        return code
    except BrokenPipeError:
        # the reader stopped (dt results | head): nothing more to say and no one to say it to
        _silence_stdout()
        return EXIT_OK
    except ConfigError as exc:
        print(f"dt: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        print(f"dt: {exc}", file=sys.stderr)
        return api_error_code(exc)  # refused: not a task's failure
    except KeyboardInterrupt:  # Ctrl-C outside a wait (submit --wait says what keeps running itself)
        print("dt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
