"""Load-balancing benchmark: two DDP "nodes" on this machine, one of them slowed.

Each node is a separate launcher process (``python -m distributed_testing.training.launch``) in
its own network namespace, joined by a veth pair (10.77.0.1 and 10.77.0.2, only inside the
namespaces created here), so gloo traffic and the pre-flight really cross an interface. Node 0 is
pinned to CPU 0, node 1 to CPU 1, and CPU-burning neighbours pinned to CPU 1 (two by default)
take most of node 1's core: a heterogeneous pair. Each node runs in its own cgroup-v1 cpu group
(see :func:`cpu_groups`). The same task then runs once per load-balancing policy (``--repeat``
rounds, median shown) and the global samples/s are reported with the speed-up over ``none``.

Needs root (``ip netns``) and two CPUs. Namespaces, cgroups and burners are removed in ``finally``.

    sudo .venv/bin/python benchmarks/ddp.py                      # none, proportional, dynamic
    sudo .venv/bin/python benchmarks/ddp.py --policies none,hybrid --steps 60 --json-out out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SUBNET_PREFIX = "10.77.0"
BASE_PORT = 29710

logger = logging.getLogger("benchmarks.ddp")


@dataclass(frozen=True)
class Node:
    namespace: str
    interface: str
    address: str
    cpu: int


CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CGROUP_SHARES = 8192


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def namespaces(tag: str) -> Iterator[tuple[Node, Node]]:
    """Two namespaces joined by a veth pair; always deleted on exit."""
    nodes = (
        Node(f"dtddp{tag}a", f"dtv{tag}a", f"{SUBNET_PREFIX}.1", 0),
        Node(f"dtddp{tag}b", f"dtv{tag}b", f"{SUBNET_PREFIX}.2", 1),
    )
    try:
        for node in nodes:
            _ip("netns", "add", node.namespace)
        a, b = nodes
        _ip("link", "add", a.interface, "netns", a.namespace, "type", "veth", "peer", "name", b.interface,
            "netns", b.namespace)  # fmt: skip
        for node in nodes:
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node.interface)
            _ip("-n", node.namespace, "link", "set", node.interface, "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
        yield nodes
    finally:
        for node in nodes:
            result = subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True, text=True)
            if result.returncode != 0 and "No such file" not in result.stderr:
                logger.error("could not delete namespace %s: %s", node.namespace, result.stderr.strip())


@contextmanager
def cpu_groups(tag: str, count: int) -> Iterator[list[Path | None]]:
    """One cgroup-v1 cpu group per node with a high ``cpu.shares``; removed on exit.

    Each node's processes (and node 1's burners) run in its group, so the split of node 1's core
    between rank and burners is fair within the group, and other work on a shared machine (whose
    sessions the kernel's autogroup scheduling weighs equally, whatever their nice value) takes
    a much smaller part of either core. Without a v1 cpu controller the nodes run ungrouped.
    """
    if not (CGROUP_CPU_ROOT / "cpu.shares").exists():
        logger.warning("no cgroup v1 cpu controller at %s; running without CPU isolation", CGROUP_CPU_ROOT)
        yield [None] * count
        return
    groups = [CGROUP_CPU_ROOT / f"dtddp{tag}{i}" for i in range(count)]
    try:
        for group in groups:
            group.mkdir()
            (group / "cpu.shares").write_text(str(CGROUP_SHARES))
        yield list(groups)
    finally:
        for group in groups:
            if group.exists():
                _remove_group(group)


def _remove_group(group: Path) -> None:
    leftover = (group / "cgroup.procs").read_text().split()
    for pid in leftover:
        (CGROUP_CPU_ROOT / "cgroup.procs").write_text(pid)
    group.rmdir()


def _joiner(group: Path | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` moving the child into ``group`` (this script is single-threaded)."""
    if group is None:
        return None
    procs = group / "cgroup.procs"

    def join() -> None:
        procs.write_text(str(os.getpid()))

    return join


@contextmanager
def cpu_burners(count: int, cpu: int, group: Path | None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` busy-looping neighbours pinned to ``cpu`` in ``group``; killed on exit."""
    burners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            burners.append(
                subprocess.Popen(
                    ["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"], preexec_fn=_joiner(group)
                )
            )
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def node_command(node: Node, rank: int, master: Node, port: int, config: dict[str, Any], out: Path) -> list[str]:
    return [
        "ip", "netns", "exec", node.namespace, "taskset", "-c", str(node.cpu),
        sys.executable, "-m", "distributed_testing.training.launch",
        "--config", json.dumps(config), "--node-rank", str(rank), "--nnodes", "2",
        "--master-addr", master.address, "--master-port", str(port), "--interface", node.interface,
        "--result-path", str(out), "--cuda-device-count", "0", "--timeout-s", "120",
    ]  # fmt: skip


def run_policy(
    nodes: tuple[Node, Node], groups: list[Path | None], config: dict[str, Any], port: int, workdir: Path
) -> dict[str, Any]:
    """Run one task on both nodes; return node 0's metrics."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            node_command(node, rank, nodes[0], port, config, workdir / f"node{rank}" / "result.json"),
            env=env,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_joiner(groups[rank]),
        )
        for rank, node in enumerate(nodes)
    ]
    outputs = [proc.communicate(timeout=150) for proc in procs]
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode != 0:
            raise RuntimeError(f"node {rank} failed ({proc.returncode}):\n{err[-4000:]}")
    metrics: dict[str, Any] = json.loads(outputs[0][0])["metrics"]
    return metrics


def summarize(policy: str, metrics: dict[str, Any], baseline: float | None) -> str:
    ranks = metrics["ranks"]
    capacity = "/".join(f"{r['compute_samples_per_s']:.0f}" for r in ranks)
    wait = "/".join(f"{1000 * r['mean_allreduce_wait_s']:.1f}" for r in ranks)
    speedup = f"{metrics['global_samples_per_s'] / baseline:.2f}x" if baseline else "1.00x"
    return (
        f"{policy:<13} {metrics['global_samples_per_s']:>9.1f} {speedup:>8}  final shares "
        f"{str(metrics['shares']['final']):<12} capacity/rank {capacity:<11} all-reduce wait ms {wait}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="none,proportional,dynamic")
    parser.add_argument("--model", default="cnn", help="compute-heavy with few parameters: little all-reduce")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch per step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=8, help="proportional profiles steps 2..warmup-1")
    parser.add_argument("--rebalance-interval", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="rounds over all policies; the median is shown")
    parser.add_argument(
        "--burners", type=int, default=2, help="CPU burners sharing node 1's core (0: unslowed control run)"
    )
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args(argv)


def task_config(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "kind": "training", "model": args.model, "nodes": 2, "nproc_per_node": 1,
        "batch_size": args.batch_size, "steps": args.steps, "warmup_steps": args.warmup_steps,
        "backend": "gloo", "load_balance": policy,
    }  # fmt: skip
    if policy in ("dynamic", "hybrid"):
        config["rebalance_interval"] = args.rebalance_interval
    return config


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        logger.error("needs root for ip netns; run with sudo")
        return 2
    if (os.cpu_count() or 1) < 2:
        logger.error("needs two CPUs")
        return 2
    policies = args.policies.split(",")
    runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in policies}
    started = time.monotonic()
    tag = str(os.getpid() % 100000)
    with (
        tempfile.TemporaryDirectory(prefix="dt-ddp-bench-") as tmp,
        namespaces(tag) as nodes,
        cpu_groups(tag, len(nodes)) as groups,
    ):
        with cpu_burners(args.burners, nodes[1].cpu, groups[1]):
            for round_ in range(args.repeat):
                for index, policy in enumerate(policies):
                    logger.info("round %d: running %s", round_ + 1, policy)
                    port = BASE_PORT + round_ * len(policies) + index
                    workdir = Path(tmp) / f"{policy}-{round_}"
                    runs[policy].append(run_policy(nodes, groups, task_config(args, policy), port, workdir))
    results = {policy: _median_run(found) for policy, found in runs.items()}
    baseline = results["none"]["global_samples_per_s"] if "none" in results else None
    print(f"model={args.model} global_batch={args.batch_size} steps={args.steps} "
          f"slowed=node 1 ({args.burners} CPU burner(s) on its core) "
          f"repeat={args.repeat} total {time.monotonic() - started:.0f}s")  # fmt: skip
    print(f"{'policy':<13} {'samples/s':>9} {'vs none':>8}")
    for policy, metrics in results.items():
        print(summarize(policy, metrics, baseline))
    if args.json_out:
        args.json_out.write_text(json.dumps(runs, indent=1))
    return 0


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda m: float(m["global_samples_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


if __name__ == "__main__":
    sys.exit(main())
