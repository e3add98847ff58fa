"""``dt``: the command line for people and CI.

Reads DT_COORDINATOR_URL, DT_API_KEY and DT_CA_FILE; ``--coordinator``, ``--api-key`` and
``--ca-file`` override. An https coordinator's certificate is always verified (``--ca-file`` for a
private CA, else the system's CAs). Exit codes:
0 success (every waited-for task succeeded), 1 a task failed, errored, was cancelled or timed out
(or the wait ran out), or ``dt compare`` / ``--baseline`` found a benchmark slower, 2 invalid input, bad credentials or an unreachable coordinator, with the
reason on stderr. Only the requested data goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import DEFAULT_COORDINATOR_URL, env_pick, environ, normalize_url
from ..errors import ConfigError
from ..security import tls
from . import compare
from .http import ApiClient, ApiError
from .report import print_results, print_table, write_junit

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
WAIT_CHUNK_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt", description="Submit and inspect distributed_testing tasks.")
    p.add_argument("--coordinator", help=f"coordinator URL (env DT_COORDINATOR_URL; default {DEFAULT_COORDINATOR_URL})")
    p.add_argument("--api-key", help="API key or JWT (env DT_API_KEY)")
    p.add_argument("--ca-file", type=Path,
                   help="PEM CA bundle to verify an https coordinator's certificate with (default: the system's CAs; "
                        "env DT_CA_FILE)")
    sub = p.add_subparsers(dest="cmd", required=True)

    keys = sub.add_parser("keys", help="manage API keys (admin)").add_subparsers(dest="keys_cmd", required=True)
    kc = keys.add_parser("create", help="create a key; prints only the key")
    kc.add_argument("--role", required=True, choices=["admin", "submitter", "worker", "viewer"])
    kc.add_argument("--name")
    kc.add_argument("--expires-in", type=float, metavar="S", help="expire after S seconds")
    keys.add_parser("list", help="list keys (never their secrets)")
    kr = keys.add_parser("revoke", help="revoke a key now (and every JWT derived from it)")
    kr.add_argument("key_id")

    sp = sub.add_parser("submit", help="submit a task JSON file (one task or a list)")
    sp.add_argument("file", type=Path, help="task JSON file, or - for stdin")
    sp.add_argument("--wait", action="store_true", help="wait for every task to finish")
    sp.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="give up waiting after S seconds (default 3600)")
    sp.add_argument("--junit", type=Path, metavar="PATH", help="write a JUnit XML report (implies --wait)")
    sp.add_argument("--json", type=Path, metavar="PATH", dest="json_out", help="write tasks and results as JSON (implies --wait)")
    compare.add_arguments(sp, for_submit=True)
    compare.add_arguments(sub.add_parser("compare", help="judge benchmark results against their history (exit 1 on a "
                                                         "regression)"))

    st = sub.add_parser("status", help="show one task")
    st.add_argument("task_id")
    cn = sub.add_parser("cancel", help="cancel a pending or running task")
    cn.add_argument("task_id")
    wk = sub.add_parser("workers", help="list workers (or: workers drain|release WORKER_ID)")
    wsub = wk.add_subparsers(dest="workers_cmd")
    wsub.add_parser("list", help="list workers (the default)")
    wd = wsub.add_parser("drain", help="ask a worker to finish or hand back its tasks and leave (admin)")
    wd.add_argument("worker_id")
    wd.add_argument("--deadline", type=float, metavar="S",
                    help="seconds its running tasks may finish before they are handed back (default 30)")
    wd.add_argument("--reason", metavar="TEXT", help="shown as the worker's state reason and in the task history")
    wr = wsub.add_parser("release", help="free a disconnected worker's id from the key it is bound to, so a worker "
                                         "with another key may take it (admin)")
    wr.add_argument("worker_id")
    rs = sub.add_parser("results", help="list results")
    rs.add_argument("--format", choices=["table", "json", "csv"], default="table")
    for f in ("task-id", "worker-id", "status", "model", "precision", "hardware"):
        rs.add_argument(f"--{f}")
    rs.add_argument("--batch-size", type=int)
    rs.add_argument("--limit", type=int, default=100)
    return p


def client_from_args(ns: argparse.Namespace) -> ApiClient:
    env = environ()
    url, src = env_pick(ns.coordinator, env, "DT_COORDINATOR_URL", DEFAULT_COORDINATOR_URL)
    key, _ = env_pick(ns.api_key, env, "DT_API_KEY")
    if not key:
        raise ConfigError("no credentials: pass --api-key or set DT_API_KEY")
    base = normalize_url(url or DEFAULT_COORDINATOR_URL, "--coordinator" if src == "flag" else src)
    ca, ca_src = env_pick(str(ns.ca_file) if ns.ca_file else None, env, "DT_CA_FILE")
    context = tls.client_context(Path(ca) if ca else None, "--ca-file" if ca_src == "flag" else ca_src)
    return ApiClient(base, key, ssl_context=context if base.startswith("https://") else None)


def cmd_keys(api: ApiClient, ns: argparse.Namespace) -> int:
    if ns.keys_cmd == "create":
        body: dict[str, Any] = {"role": ns.role}
        if ns.name:
            body["name"] = ns.name
        if ns.expires_in is not None:
            body["expires_in_s"] = ns.expires_in
        print(api.post("/api/v1/keys", body)["key"])
    elif ns.keys_cmd == "list":
        print_table(api.get("/api/v1/keys")["keys"], ["key_id", "name", "role", "created_at", "expires_at", "revoked_at"])
    else:
        api.post(f"/api/v1/keys/{ns.key_id}/revoke", None)
        print(f"revoked {ns.key_id}", file=sys.stderr)
    return EXIT_OK


def _load_doc(path: Path) -> Any:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc


def cmd_submit(api: ApiClient, ns: argparse.Namespace) -> int:
    accepted = api.post("/api/v1/tasks", _load_doc(ns.file))["tasks"]
    for a in accepted:
        print(a["task_id"])
    if not (ns.wait or ns.junit or ns.json_out or ns.baseline):
        return EXIT_OK
    deadline = time.monotonic() + ns.timeout
    final = [wait_task(api, a["task_id"], deadline) for a in accepted]
    for t in final:
        outcome = t.get("outcome") or {}
        print(f"{t['task_id']}: {t['state']}" + (f" ({outcome.get('error')})" if outcome.get("error") else ""), file=sys.stderr)
    if ns.junit:
        write_junit(ns.junit, final)
    if ns.json_out:
        ns.json_out.write_text(json.dumps({"tasks": final}, indent=2))
    code = EXIT_OK if all(t["state"] == "succeeded" for t in final) else EXIT_FAILED
    if ns.baseline:
        code = max(code, compare.run(api, [t["task_id"] for t in final], ns, junit=ns.junit, append_junit=True))
    return code


def wait_task(api: ApiClient, task_id: str, deadline: float) -> dict[str, Any]:
    """Long-poll one task until it is terminal or ``deadline`` (monotonic) passes."""
    while True:
        left = deadline - time.monotonic()
        t: dict[str, Any] = api.get(f"/api/v1/tasks/{task_id}", {"wait": f"{max(0.0, min(WAIT_CHUNK_S, left)):.3f}"})
        if t.get("outcome") is not None or left <= 0:
            if t.get("outcome") is None:
                t = {**t, "state": t["state"], "outcome": {"status": "wait_timeout", "error": "dt: gave up waiting"}}
            return t


def cmd_status(api: ApiClient, ns: argparse.Namespace) -> int:
    print(json.dumps(api.get(f"/api/v1/tasks/{ns.task_id}"), indent=2))
    return EXIT_OK


def cmd_cancel(api: ApiClient, ns: argparse.Namespace) -> int:
    t = api.post(f"/api/v1/tasks/{ns.task_id}/cancel", None)
    print(f"{t['task_id']}: {t['state']}")
    return EXIT_OK


def cmd_workers(api: ApiClient, ns: argparse.Namespace) -> int:
    if ns.workers_cmd == "drain":
        return cmd_drain(api, ns)
    if ns.workers_cmd == "release":
        api.post(f"/api/v1/workers/{urllib.parse.quote(ns.worker_id, safe='')}/release", None)
        print(f"{ns.worker_id}: released; the next worker key to register it takes it")
        return EXIT_OK
    rows = [{**w, "capabilities": ",".join(w["capabilities"]), "tags": ",".join(w["tags"]), "running": len(w["running"])}
            for w in api.get("/api/v1/workers")["workers"]]
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
    print_results(api.get("/api/v1/results", params)["results"], ns.format)
    return EXIT_OK


COMMANDS = {"keys": cmd_keys, "submit": cmd_submit, "status": cmd_status, "cancel": cmd_cancel,
            "workers": cmd_workers, "results": cmd_results, "compare": compare.cmd_compare}


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return COMMANDS[ns.cmd](client_from_args(ns), ns)
    except ConfigError as exc:
        print(f"dt: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        print(f"dt: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.status in (0, 400, 401, 403, 404, 409) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
