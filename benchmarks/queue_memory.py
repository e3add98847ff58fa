"""The coordinator's memory (RSS) per queued task, for sizing ``--max-queued-per-key`` and
``--max-payload-mb-per-key`` (docs/security.md, "Quotas").

Starts ``run_coordinator.py`` (memory:// store by default, so the figure is the process's own;
``--db-path duckdb`` for a DuckDB file) with no worker, with both quotas off, and submits tasks in batches of
``--batch`` that nothing can run (they stay queued), each carrying ``--payload`` bytes of model
config. Prints RSS before, after every ``--step`` tasks, and the bytes per task in the end.

``--shape objects`` makes the payload many tiny objects (``"parameters": {"p": [{}, {}, ...]}``,
3 bytes of JSON each: the most memory per byte a spec can ask for), and ``--default-quotas``
keeps the per-key quotas at their defaults and submits until the key is refused (issue 40: the
attack the quotas must bound).

    python benchmarks/queue_memory.py [--tasks 20000] [--payload 0] [--batch 500] [--shape objects] [--default-quotas]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distributed_testing.testing import Procs, Rest, start_coordinator_process  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def doc(i: int, payload: int, shape: str = "blob") -> dict[str, object]:
    params: dict[str, object] = {"blob": "x" * payload, "i": i} if shape == "blob" else {"p": [{}] * (payload // 3),
                                                                                        "i": i}
    return {"type": "custom", "config": {"name": "noop", "parameters": params}, "requirements": {"tags": ["nowhere"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--payload", type=int, default=0, help="bytes of config per task (default 0)")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--shape", choices=["blob", "objects"], default="blob",
                    help="the payload as one string (default) or as 3-byte empty objects")
    ap.add_argument("--default-quotas", action="store_true",
                    help="keep the per-key quotas at their defaults and stop at the first refusal")
    ap.add_argument("--db-path", default="memory://", help="memory:// (default), duckdb (a file in a temporary "
                                                          "directory) or a postgresql:// URL")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp), cwd=REPO)
        try:
            store = [] if args.db_path == "duckdb" else ["--db-path", args.db_path]
            p, port = start_coordinator_process(procs, Path(tmp) / "c.duckdb", args=[
                *store, "--admin-key-file", str(Path(tmp) / "admin.key"),
                *([] if args.default_quotas else ["--max-queued-per-key", "0", "--max-payload-mb-per-key", "0"])])
            rest = Rest(f"http://127.0.0.1:{port}", (Path(tmp) / "admin.key").read_text().strip(), timeout=120)
            proc = psutil.Process(p.pid)
            rest.ok("GET", "/api/v1/tasks")  # warm the request path before the first reading
            start = proc.memory_info().rss
            print(f"tasks 0: RSS {start / 2**20:.1f} MiB")
            done = 0
            while done < args.tasks:
                n = min(args.batch, args.tasks - done)
                status, body = rest.request("POST", "/api/v1/tasks",
                                            json=[doc(done + i, args.payload, args.shape) for i in range(n)])
                if status >= 300:
                    print(f"tasks {done}: refused with HTTP {status}: {body.get('message') or body.get('errors')}")
                    break
                done += n
                if done % max(args.batch, args.tasks // 5) == 0 or done == args.tasks:
                    print(f"tasks {done}: RSS {proc.memory_info().rss / 2**20:.1f} MiB")
            end = proc.memory_info().rss
            print(f"{done} queued tasks with {args.payload} B of {args.shape} payload each: RSS "
                  f"{start / 2**20:.1f} -> {end / 2**20:.1f} MiB, {(end - start) / max(done, 1) / 1024:.2f} KiB per task "
                  f"({(end - start) / 2**20:.1f} MiB in all)")
        finally:
            procs.close()


if __name__ == "__main__":
    main()
