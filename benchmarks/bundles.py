"""Bundle upload and tree build on a real 10,000-file tree (issue 26: "an unchanged 10,000-file
tree uploads 0 bytes, a one-file change uploads one file, a cached tree is ready in <= 1 s").

The tree is a copy of real package sources: the first ``--files`` files (``__pycache__`` left
out) of the installed packages named by ``--packages`` (default: sympy, transformers, networkx,
mypy, pip, pygments, setuptools, numpy, schemathesis, huggingface_hub, mypyc, graphql, torchgen, hypothesis, _pytest,
rich, pydantic, mpmath, aiohttp from this environment's site-packages), so file sizes and directory depths are those of
real Python projects. A coordinator process (``run_coordinator.py``, DuckDB store in a temporary
directory) receives, through ``bundles.upload.upload_with_stats`` (what ``dt submit --bundle`` and
the pytest plugin call):

1. a cold upload (every blob sent),
2. the same tree again (0 blobs, 0 bytes expected),
3. the tree with one file changed (1 blob expected).

Then a worker's ``BundleProvider`` (with the uploader's key: a worker key reads only the bundles of
the tasks it holds) prepares the bundle's tree: cold (every
blob fetched into the cache, the tree built), for a later task of the same bundle (the kept tree:
issue goal <= 1 s), and on a restarted worker whose blob cache is warm (the manifest fetched, the
tree linked); ``build_tree`` alone is timed on the warm cache, and ``writable_view`` (a task's own
copy of a kept tree, made before each task of a sandboxed worker) on the built tree. Each figure is the median of
``--repeat`` runs where a repeat makes sense (2, 3, the worker's kept and warm trees, the build).

    python benchmarks/bundles.py [--files 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import site
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distributed_testing.bundles import manifest as mf  # noqa: E402
from distributed_testing.bundles.tree import build_tree, remove_tree, writable_view  # noqa: E402
from distributed_testing.bundles.upload import UploadStats, upload_with_stats  # noqa: E402
from distributed_testing.testing import Procs, Rest, start_coordinator_process  # noqa: E402
from distributed_testing.worker.bundles import BundleProvider  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sympy", "transformers", "networkx", "mypy", "pip", "pygments", "setuptools", "numpy", "schemathesis", "huggingface_hub", "mypyc", "graphql",
            "torchgen", "hypothesis", "_pytest", "rich", "pydantic", "mpmath", "aiohttp")


def make_tree(dest: Path, packages: list[str], limit: int) -> int:
    """Copy up to ``limit`` files of the installed ``packages`` into ``dest``; bytes copied."""
    roots = [Path(p) for p in site.getsitepackages()]
    copied = size = 0
    for name in packages:
        src = next((r / name for r in roots if (r / name).is_dir()), None)
        if src is None:
            raise SystemExit(f"package {name} is not installed here")
        for f in sorted(src.rglob("*")):
            if copied >= limit:
                return size
            if "__pycache__" in f.parts or not f.is_file() or f.is_symlink():
                continue
            out = dest / name / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)
            copied += 1
            size += out.stat().st_size
    if copied < limit:
        raise SystemExit(f"only {copied} files in {packages}; name more --packages")
    return size


def line(what: str, s: UploadStats) -> None:
    print(f"{what:<22} {s.seconds:7.2f} s  {s.blobs_sent:6d} blobs  {s.bytes_sent:11,d} bytes sent "
          f"(tree: {s.files} files, {s.total_bytes / 1e6:.1f} MB)", flush=True)


def median_upload(url: str, key: str, tree: Path, repeat: int) -> UploadStats:
    runs = [upload_with_stats(url, key, tree) for _ in range(repeat)]
    runs.sort(key=lambda s: s.seconds)
    return runs[len(runs) // 2]


async def worker_side(url: str, key: str, digest: str, work: Path, repeat: int) -> None:
    provider = BundleProvider(work / "cache", 10 * 1024 ** 3, trees_dir=work / "trees")
    t = time.perf_counter()
    async with provider.shared(url, key, digest):
        print(f"{'worker, cold cache':<22} {time.perf_counter() - t:7.2f} s  (manifest + every blob fetched, tree built)")
    kept = []
    for _ in range(repeat):
        t = time.perf_counter()
        async with provider.shared(url, key, digest):
            kept.append(time.perf_counter() - t)
    print(f"{'worker, tree kept':<22} {statistics.median(kept) * 1e3:7.2f} ms (a later task of the bundle; "
          f"runs: {', '.join(f'{k * 1e3:.2f}' for k in kept)} ms)")
    warm = []
    for i in range(repeat):  # a restarted worker: blobs cached, nothing else
        fresh = BundleProvider(work / "cache", 10 * 1024 ** 3, trees_dir=work / f"trees{i}")
        t = time.perf_counter()
        async with fresh.shared(url, key, digest):
            warm.append(time.perf_counter() - t)
    print(f"{'worker, warm cache':<22} {statistics.median(warm):7.2f} s  (restarted worker: manifest fetched, "
          f"tree linked; runs: {', '.join(f'{w:.2f}' for w in warm)})")
    m = mf.decode(await asyncio.to_thread(_manifest, url, key, digest))
    builds = []
    for i in range(repeat):
        t = time.perf_counter()
        build_tree(provider.cache, m, work / f"b{i}")
        builds.append(time.perf_counter() - t)
    print(f"{'build_tree alone':<22} {statistics.median(builds):7.2f} s  "
          f"(runs: {', '.join(f'{b:.2f}' for b in builds)})")
    views = []
    for i in range(repeat):  # what each task of a kept bundle gets before it starts (a root worker's)
        t = time.perf_counter()
        writable_view(work / "b0", m, work / f"v{i}", link_large=True)
        views.append(time.perf_counter() - t)
    print(f"{'writable_view':<22} {statistics.median(views):7.2f} s  (a task's own copies, files over 16 MiB "
          f"linked; runs: {', '.join(f'{v:.2f}' for v in views)})")
    t = time.perf_counter()
    remove_tree(work / "b0")
    print(f"{'remove_tree':<22} {time.perf_counter() - t:7.2f} s")


def _manifest(url: str, key: str, digest: str) -> bytes:
    import urllib.request

    req = urllib.request.Request(f"{url}/api/v1/bundles/{digest}", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--packages", nargs="+", default=list(PACKAGES))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        t = time.perf_counter()
        size = make_tree(tmp / "tree", args.packages, args.files)
        print(f"tree: {args.files} files, {size / 1e6:.1f} MB from {', '.join(args.packages)} "
              f"(copied in {time.perf_counter() - t:.1f} s)", flush=True)
        procs = Procs(tmp, cwd=REPO)
        try:
            _, port = start_coordinator_process(procs, tmp / "c" / "c.duckdb")
            url = f"http://127.0.0.1:{port}"
            rest = Rest(url, (tmp / "c" / "admin.key").read_text().strip(), timeout=120)
            key = str(rest.ok("POST", "/api/v1/keys", json={"role": "submitter", "allow_code": True})["key"])
            t = time.perf_counter()
            m, _ = mf.scan(tmp / "tree")
            print(f"{'scan (digest) alone':<22} {time.perf_counter() - t:7.2f} s  ({len(m.files)} files)")
            line("cold upload", upload_with_stats(url, key, tmp / "tree"))
            line("unchanged re-upload", median_upload(url, key, tmp / "tree", args.repeat))
            changed = sorted((tmp / "tree").rglob("*.py"))[len(m.files) // 2]
            changed.write_text(changed.read_text() + "\n# changed\n")
            one = upload_with_stats(url, key, tmp / "tree")
            line("one-file change", one)
            # a worker key reads only the bundles of tasks its workers hold: fetch with the uploader's
            asyncio.run(worker_side(url, key, one.digest, tmp / "w", args.repeat))
        finally:
            procs.close()


if __name__ == "__main__":
    main()
