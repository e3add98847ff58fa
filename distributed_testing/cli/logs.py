"""``dt logs TASK [-f]``: a task's output (``GET /api/v1/tasks/{id}/logs``).

Prints what the task wrote (its stdout and stderr; for a test task pytest's own report), as the
coordinator keeps it: the first 32 KiB and the last 224 KiB, what lies between as one
``[... N bytes left out ...]`` line. ``-f`` follows a running (or queued) task, printing its output
as it comes, until the task ends; the exit status is then that of the task's final state, as for
``dt submit --wait`` (0 succeeded, 1 otherwise). Each request is one long poll that the client
repeats through a failover like any other read (``cli/http.py``), from the offset read so far.
When the task moves on to another attempt (a retry on another worker), a line on stderr says so
and that attempt's output follows from its start.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse

from .http import ApiClient
from .submit import EXIT_FAILED, EXIT_OK

FOLLOW_WAIT_S = 20  # one long poll's bound (the coordinator allows 60; the client adds it to its first-byte bound)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = ("print a task's output (stdout, stderr; for a test task pytest's report), its first 32 KiB and last "
            "224 KiB; -f follows a running task until it ends")
    lg = sub.add_parser("logs", help=text, description=text)
    lg.add_argument("task_id", help="the task's id")
    lg.add_argument("-f", "--follow", action="store_true",
                    help="keep printing a running or queued task's output until it ends; exit 0 when it succeeded, "
                         "1 when it failed, errored, timed out or was cancelled")
    lg.set_defaults(run=cmd_logs)


def cmd_logs(api: ApiClient, ns: argparse.Namespace) -> int:
    path = f"/api/v1/tasks/{urllib.parse.quote(ns.task_id, safe='')}/logs"
    offset, attempt = 0, None
    while True:
        params = {"offset": str(offset)}
        if attempt is not None:
            params["attempt"] = str(attempt)
        if ns.follow:
            params.update(follow="1", wait=str(FOLLOW_WAIT_S))
        page = api.get(path, params)
        if attempt is not None and page["attempt"] != attempt:
            print(f"dt: {ns.task_id} moved on to attempt {page['attempt']}; its output follows", file=sys.stderr)
        attempt, offset = page["attempt"], page["next_offset"]
        if page["text"]:
            sys.stdout.write(page["text"])
            sys.stdout.flush()
        if not ns.follow:
            return EXIT_OK
        if page["complete"]:
            return EXIT_OK if page["state"] == "succeeded" else EXIT_FAILED
