"""How far can the benchmark engine's numbers be trusted? Two measurements on this machine.

0. Harness floor: the fixed time per measured round that the engine's loop adds, from an empty
   step timed by the engine and by Timer.
1. Overhead and repeatability. For each model, the engine's median latency
   (``run_benchmark``) is compared with a bare loop over the *same* model and inputs timed by
   ``torch.utils.benchmark.Timer.blocked_autorange`` (same thread count, inside
   ``torch.inference_mode``). Runs alternate engine / Timer ``--repeats`` times so drift hits
   both alike. Overhead = median(engine medians) / median(Timer medians) - 1 (target <= 2 %);
   CV = std / mean of the engine medians over the repeats (target <= 3 % on an idle machine).
   "mean ovh" compares mean time per call, which does not depend on how each tool aggregates.
2. Batched vs unbatched. ``--tasks`` tasks that share one model (different batch sizes) run
   (a) in this process through ``run_benchmark_batch`` (model loaded once), (b) in one fresh
   child process as one request (model loaded once, plus one process start), and (c) each in
   its own fresh ``python -m distributed_testing.bench.child`` (N process starts, N loads).

3. ``--table``: ours vs ``torch.utils.benchmark`` vs a bare loop, quiet and with a pure-Python
   busy loop on every core but one (issue 29), for tiny and default ``mlp``, ``cnn`` and a tiny
   bert at batch sizes 1, 4, 16, 64. "ours" is the benchmark child as a default worker starts it
   (one intra-op thread), plus the same with every core (the old default) and its verdict; Timer
   and the bare loop use one thread on the model the engine built.

Usage::

    .venv/bin/python benchmarks/fidelity.py --table --min-time 0.5

    .venv/bin/python benchmarks/fidelity.py                       # defaults below
    .venv/bin/python benchmarks/fidelity.py --models mlp --repeats 7 --min-time 3

The load average is printed before and after: on a shared machine, other processes' work shows
up as CV and overhead, not as a property of the engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as tbench

from distributed_testing.bench import run_benchmark, run_benchmark_batch

MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": "mlp"},
    "bert-tiny": {"model": "bert-base-uncased", "tiny": True, "sequence_length": 128},
    "bert-base": {"model": "bert-base-uncased", "weights": "random", "sequence_length": 128},
    "resnet-50": {"model": "resnet-50", "weights": "random"},
}


def _bare_ms(prepared: Any, batch: int, min_time: float) -> tuple[float, float]:
    """Median and mean per-call time of ``model(*args, **kwargs)`` on the engine's own model and
    inputs (Timer's median is over block means, the engine's over single calls, so under noise
    the engine's median sits lower; the means compare total time per call)."""
    inputs = prepared.built.make_inputs(batch, torch.Generator().manual_seed(0), False)
    timer = tbench.Timer(
        stmt="model(*args, **kwargs)",
        num_threads=torch.get_num_threads(),
        globals={"model": prepared.engine.module, "args": inputs.args, "kwargs": inputs.kwargs},
    )
    with torch.inference_mode():
        measurement = timer.blocked_autorange(min_run_time=min_time)
    return float(measurement.median) * 1000.0, float(measurement.mean) * 1000.0


def overhead(name: str, batch: int, repeats: int, min_time: float) -> dict[str, Any]:
    cache: dict[Any, Any] = {}
    config = {**MODELS[name], "batch_sizes": [batch], "warmup": 5, "iterations": 20, "min_duration_s": min_time}
    engine, bare, engine_means, bare_means = [], [], [], []
    for _ in range(repeats):
        result = run_benchmark(config, model_cache=cache)
        engine.append(result["batch_results"][0]["latency_ms"]["median"])
        engine_means.append(result["batch_results"][0]["latency_ms"]["mean"])
        (prepared,) = cache.values()
        median_ms, mean_ms = _bare_ms(prepared, batch, min_time)
        bare.append(median_ms)
        bare_means.append(mean_ms)
    engine_median, bare_median = statistics.median(engine), statistics.median(bare)
    return {
        "model": name,
        "batch": batch,
        "engine_median_ms": engine_median,
        "timer_median_ms": bare_median,
        "overhead_pct": (engine_median / bare_median - 1.0) * 100.0,
        "mean_overhead_pct": (statistics.median(engine_means) / statistics.median(bare_means) - 1.0) * 100.0,
        "engine_cv_pct": statistics.stdev(engine) / statistics.mean(engine) * 100.0,
        "timer_cv_pct": statistics.stdev(bare) / statistics.mean(bare) * 100.0,
        "engine_runs_ms": engine,
        "timer_runs_ms": bare,
    }


def _noop() -> None:
    return None


def harness_floor(rounds: int, min_time: float) -> dict[str, float]:
    """Per-round cost of the timing harness itself: an empty step timed by the engine's loop
    and by Timer. The difference is the fixed time the engine adds to every measured round,
    independent of the model (and far less sensitive to other load than a model is)."""
    from distributed_testing.bench.measure import CpuRssTracker, Workload, measure

    work = Workload(step=_noop, batch_size=1, memory=CpuRssTracker())
    engine_ns = measure(work, 1, rounds, 0.0)["latency_ms"]["median"] * 1e6
    timer = tbench.Timer(stmt="noop()", globals={"noop": _noop})
    timer_ns = float(timer.blocked_autorange(min_run_time=min_time).median) * 1e9
    return {"engine_round_ns": engine_ns, "timer_call_ns": timer_ns, "added_ns": engine_ns - timer_ns}


def _task_configs(model: str, tasks: int) -> list[dict[str, Any]]:
    """Tasks that differ only in batch size; short measurements, so model loading dominates."""
    return [
        {
            **MODELS[model],
            "sequence_length": 32,
            "batch_sizes": [1 + i % 2],
            "warmup": 1,
            "iterations": 3,
            "min_duration_s": 0.0,
            "name": f"task{i}",
        }
        for i in range(tasks)
    ]


def _child(configs: list[dict[str, Any]], threads: int) -> list[dict[str, Any]]:
    request = json.dumps({"id": 1, "configs": configs}) + "\n"
    proc = subprocess.run(
        [sys.executable, "-m", "distributed_testing.bench.child", "--threads", str(threads)],
        input=request,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    results: list[dict[str, Any]] = json.loads(proc.stdout.splitlines()[0])["results"]
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"child reported errors: {errors}")
    return results


def batching(model: str, tasks: int) -> dict[str, Any]:
    configs = _task_configs(model, tasks)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    in_process = run_benchmark_batch(configs)
    in_process_s = time.perf_counter() - start
    loads = sum(1 for r in in_process if not r["cached"])
    start = time.perf_counter()
    _child(configs, threads)
    one_child_s = time.perf_counter() - start
    start = time.perf_counter()
    for config in configs:
        _child([config], threads)
    per_task_s = time.perf_counter() - start
    return {
        "model": model,
        "tasks": tasks,
        "in_process_batch_s": in_process_s,
        "in_process_model_loads": loads,
        "one_child_batch_s": one_child_s,
        "fresh_child_per_task_s": per_task_s,
        "saving_pct": (1.0 - one_child_s / per_task_s) * 100.0,
    }


def _print_overhead(rows: list[dict[str, Any]], repeats: int, min_time: float) -> None:
    print(
        f"\n1) Engine vs torch.utils.benchmark.Timer (median of {repeats} alternating runs, "
        f">= {min_time:.1f} s each, {torch.get_num_threads()} threads)"
    )
    header = (
        f"{'model':<10} {'batch':>5} {'engine ms':>10} {'Timer ms':>10} {'overhead':>9} "
        f"{'mean ovh':>9} {'engine CV':>10} {'Timer CV':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['model']:<10} {r['batch']:>5} {r['engine_median_ms']:>10.4f} "
            f"{r['timer_median_ms']:>10.4f} {r['overhead_pct']:>+8.2f}% {r['mean_overhead_pct']:>+8.2f}% "
            f"{r['engine_cv_pct']:>9.2f}% {r['timer_cv_pct']:>8.2f}%"
        )
    print("targets: overhead <= 2 %, engine CV <= 3 % (idle machine)")


def _print_batching(row: dict[str, Any]) -> None:
    print(f"\n2) {row['tasks']} tasks sharing {row['model']} (wall time, includes model build)")
    print(
        f"   in-process run_benchmark_batch : {row['in_process_batch_s']:8.2f} s "
        f"({row['in_process_model_loads']} model load)"
    )
    print(f"   one child, one request         : {row['one_child_batch_s']:8.2f} s")
    print(f"   fresh child per task           : {row['fresh_child_per_task_s']:8.2f} s")
    print(f"   saving of batching             : {row['saving_pct']:8.1f} %")


TABLE_MODELS: dict[str, dict[str, Any]] = {
    "mlp tiny": {"model": "mlp", "tiny": True},
    "mlp": {"model": "mlp"},
    "cnn": {"model": "cnn"},
    "bert tiny": {"model": "bert-base-uncased", "tiny": True, "sequence_length": 128},
}
TABLE_BATCHES = [1, 4, 16, 64]


def _ours(config: dict[str, Any], threads: int | None) -> list[dict[str, Any]]:
    request = {"id": 1, "configs": [config if threads is None else {**config, "threads": threads}]}
    env = {k: v for k, v in os.environ.items() if k != "DT_BENCH_THREADS"}
    proc = subprocess.run([sys.executable, "-m", "distributed_testing.bench.child"], input=json.dumps(request) + "\n",
                          capture_output=True, text=True, env=env, timeout=1800, check=True)
    result = json.loads(proc.stdout)["results"][0]
    if "error" in result:
        raise RuntimeError(result["error"])
    return list(result["batch_results"])


def _bare_loop_ms(prepared: Any, batch: int, min_time: float) -> float:
    inputs = prepared.built.make_inputs(batch, torch.Generator().manual_seed(0), False)
    module, samples, start = prepared.engine.module, [], time.perf_counter()
    with torch.inference_mode():
        module(*inputs.args, **inputs.kwargs)
        while time.perf_counter() - start < min_time or len(samples) < 10:
            t0 = time.perf_counter_ns()
            module(*inputs.args, **inputs.kwargs)
            samples.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(samples)


def table(min_time: float, busy: int, names: list[str]) -> list[dict[str, Any]]:
    """One row per model and batch size: ours (1 thread, all cores with verdict), Timer, bare,
    and the 1-minute load average when the row was done (the machine may be shared)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    rows = []
    try:
        for name in names:
            model = TABLE_MODELS[name]
            config = {**model, "batch_sizes": TABLE_BATCHES, "warmup": 3, "iterations": 10, "min_duration_s": min_time}
            ours, wide = _ours(config, None), _ours(config, os.cpu_count() or 1)
            torch.set_num_threads(1)
            cache: dict[Any, Any] = {}
            run_benchmark({**model, "batch_sizes": [1], "iterations": 1, "min_duration_s": 0}, model_cache=cache)
            (prepared,) = cache.values()
            for i, batch in enumerate(TABLE_BATCHES):
                rows.append({"model": name, "batch_size": batch, "busy": busy,
                             "ours_ms": ours[i]["latency_ms"]["median"], "ours_verdict": ours[i]["verdict"],
                             "all_cores_ms": wide[i]["latency_ms"]["median"], "all_cores_verdict": wide[i]["verdict"],
                             "timer_ms": _bare_ms(prepared, batch, min_time)[0],
                             "bare_ms": _bare_loop_ms(prepared, batch, min_time), "load1": os.getloadavg()[0]})
                print(rows[-1], flush=True)
    finally:
        for proc in procs:
            proc.kill()
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| model | bs | busy | ours ms (verdict) | ours/Timer | ours/bare | all cores ms (verdict) | Timer ms | bare ms "
          "| load 1 min |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch_size']} | {r['busy']} | {r['ours_ms']:.4g} ({r['ours_verdict']}) | "
              f"{r['ours_ms'] / r['timer_ms']:.2f} | {r['ours_ms'] / r['bare_ms']:.2f} | "
              f"{r['all_cores_ms']:.4g} ({r['all_cores_verdict']}) | {r['timer_ms']:.4g} | {r['bare_ms']:.4g} | "
              f"{'—' if r.get('load1') is None else format(r['load1'], '.1f')} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "bert-tiny"], choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per timed run")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--batch-model", default="bert-base", choices=sorted(MODELS))
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads here and in the children (default: torch's)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--table", action="store_true", help="only the quiet/busy table of ours, Timer and bare loop")
    parser.add_argument("--table-models", nargs="+", default=list(TABLE_MODELS), choices=list(TABLE_MODELS),
                        metavar="NAME", help=f"rows of --table (default all: {', '.join(TABLE_MODELS)})")
    parser.add_argument("--from-json", nargs="+", metavar="FILE", help="print the --table of rows saved by --json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.from_json:
        _print_table([row for name in args.from_json for row in json.loads(Path(name).read_text())])
        return 0
    if args.table:
        print("command:", " ".join([os.path.relpath(sys.executable), *sys.argv]))
        print(f"load average before: {os.getloadavg()}  cpu_count: {os.cpu_count()}  torch {torch.__version__}")
        busy = max(1, (os.cpu_count() or 2) - 1)
        rows = table(args.min_time, 0, args.table_models) + table(args.min_time, busy, args.table_models)
        _print_table(rows)
        print(f"\nload average after: {os.getloadavg()}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print("command:", " ".join([os.path.relpath(sys.executable), *sys.argv]))
    print(f"load average before: {os.getloadavg()}  cpu_count: {os.cpu_count()}  torch {torch.__version__}")
    floor = harness_floor(200_000, 1.0)
    print(
        f"\n0) Harness floor (empty step): engine round {floor['engine_round_ns']:.0f} ns, "
        f"Timer call {floor['timer_call_ns']:.0f} ns -> the engine adds "
        f"{floor['added_ns']:.0f} ns per measured round"
    )
    rows = [overhead(name, args.batch_size, args.repeats, args.min_time) for name in args.models]
    _print_overhead(rows, args.repeats, args.min_time)
    for row in rows:
        print(f"   harness share of {row['model']}: {floor['added_ns'] / (row['timer_median_ms'] * 1e6) * 100:.4f} %")
    batch_row = batching(args.batch_model, args.tasks)
    _print_batching(batch_row)
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"harness_floor": floor, "overhead": rows, "batching": batch_row}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
