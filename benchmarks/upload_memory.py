"""The coordinator's memory (RSS) while blobs are uploaded at once, for issue 40 ("eight concurrent
99 MB uploads took the coordinator from 178 to 1,310 MiB"): ``PUT /api/v1/blobs/{d}`` streams
each body to disk, so RSS should not grow with the blobs' sizes.

Starts ``run_coordinator.py`` (a DuckDB file in a temporary directory, ``--max-blob-mb-per-key 0``
so one key may store them all), then ``--uploads`` threads each send one blob of ``--mb`` MB of
random bytes (generated and hashed in 1 MiB chunks, never held whole), while the coordinator's
RSS is sampled every 20 ms. Prints RSS before, the peak during, and after.

    python benchmarks/upload_memory.py [--uploads 8] [--mb 99]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distributed_testing.testing import Procs, Rest, start_coordinator_process  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHUNK = 1 << 20


def chunks(seed: int, size: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    left = size
    while left:
        n = min(CHUNK, left)
        yield rng.randbytes(n)
        left -= n


def upload(port: int, key: str, seed: int, size: int, out: list[int]) -> None:
    h = hashlib.sha256()
    for c in chunks(seed, size):
        h.update(c)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("PUT", f"/api/v1/blobs/{h.hexdigest()}", body=chunks(seed, size),
                 headers={"Authorization": f"Bearer {key}", "Content-Length": str(size)})
    resp = conn.getresponse()
    resp.read()
    out.append(resp.status)
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=8)
    ap.add_argument("--mb", type=float, default=99.0, help="MB (10^6 bytes) per blob (default 99)")
    args = ap.parse_args()
    size = int(args.mb * 1e6)
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp), cwd=REPO)
        try:
            p, port = start_coordinator_process(procs, Path(tmp) / "c.duckdb", args=["--max-blob-mb-per-key", "0"])
            rest = Rest(f"http://127.0.0.1:{port}", (Path(tmp) / "admin.key").read_text().strip())
            key = str(rest.ok("POST", "/api/v1/keys", json={"role": "submitter", "allow_code": True})["key"])
            proc = psutil.Process(p.pid)
            before = proc.memory_info().rss
            statuses: list[int] = []
            threads = [threading.Thread(target=upload, args=(port, key, i, size, statuses)) for i in range(args.uploads)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            peak = before
            while any(t.is_alive() for t in threads):
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.02)
            took = time.perf_counter() - t0
            after = proc.memory_info().rss
            print(f"{args.uploads} uploads of {args.mb:g} MB at once: HTTP {sorted(statuses)} in {took:.1f} s; "
                  f"coordinator RSS {before / 2**20:.1f} MiB before, {peak / 2**20:.1f} MiB peak, "
                  f"{after / 2**20:.1f} MiB after")
        finally:
            procs.close()


if __name__ == "__main__":
    main()
