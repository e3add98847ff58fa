"""Load-balancing benchmark: two DDP "nodes" on this machine, one of them slowed.

Each node is a separate **worker process** (``run_worker_example.py --interface ...``) in its own
network namespace with its own address (10.77.0.1 and 10.77.0.2 on veths joined by a bridge in
the root namespace, whose address 10.77.0.254 the coordinator listens on). A coordinator
(``run_coordinator.py``) reserves both workers as a gang for each task submitted over the REST
API, picks the rendezvous, and stores the combined result; the global samples/s come from it. So
gloo traffic, the pre-flight and the worker <-> coordinator WebSockets really cross interfaces.
Worker ``a`` (and its ranks) is pinned to CPU 0, worker ``b`` to CPU 1, and CPU-burning neighbours
pinned to CPU 1 (two by default) take most of b's core: a heterogeneous pair. Each worker runs in
its own cgroup-v1 cpu group (see :func:`cpu_groups`). The same task then runs once per
load-balancing policy (``--repeat`` rounds, median shown) and the global samples/s are reported
with the speed-up over ``none``.

``--direct`` skips the coordinator and workers: each namespace runs
``python -m distributed_testing.training.launch`` for its node (the node side alone).

Needs root (``ip netns``) and two CPUs. Namespaces, bridge, cgroups, burners and processes are
removed in ``finally``.

    sudo .venv/bin/python benchmarks/ddp.py                      # none, proportional, dynamic
    sudo .venv/bin/python benchmarks/ddp.py --policies none,hybrid --steps 60 --json-out out.json
    sudo .venv/bin/python benchmarks/ddp.py --direct
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
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
sys.path.insert(0, str(REPO_ROOT))
from distributed_testing.cli.http import ApiClient  # noqa: E402  (after the path fix-up)

SUBNET_PREFIX = "10.77.0"
BRIDGE_ADDRESS = f"{SUBNET_PREFIX}.254"
BASE_PORT = 29710
WORKER_START_S = 300.0  # hardware detection imports torch in a child; slow on a loaded machine
TASK_TIMEOUT_S = 300.0

logger = logging.getLogger("benchmarks.ddp")


@dataclass(frozen=True)
class Node:
    name: str
    namespace: str
    interface: str  # the veth end inside the namespace
    host_end: str  # its peer in the root namespace, on the bridge
    address: str
    cpu: int


CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CGROUP_SHARES = 8192


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def namespaces(tag: str) -> Iterator[tuple[Node, Node]]:
    """Two namespaces, each with a veth whose peer is on a bridge in the root namespace (which
    gets BRIDGE_ADDRESS); always deleted on exit."""
    nodes = (
        Node("a", f"dtddp{tag}a", f"dtv{tag}a", f"dth{tag}a", f"{SUBNET_PREFIX}.1", 0),
        Node("b", f"dtddp{tag}b", f"dtv{tag}b", f"dth{tag}b", f"{SUBNET_PREFIX}.2", 1),
    )
    bridge = f"dtbr{tag}"
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for node in nodes:
            _ip("netns", "add", node.namespace)
            _ip("link", "add", node.interface, "netns", node.namespace, "type", "veth", "peer", "name", node.host_end)
            _ip("link", "set", node.host_end, "master", bridge)
            _ip("link", "set", node.host_end, "up")
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node.interface)
            _ip("-n", node.namespace, "link", "set", node.interface, "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
        yield nodes
    finally:
        for node in nodes:
            result = subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True, text=True)
            if result.returncode != 0 and "No such file" not in result.stderr:
                logger.error("could not delete namespace %s: %s", node.namespace, result.stderr.strip())
        result = subprocess.run(["ip", "link", "del", bridge], capture_output=True, text=True)
        if result.returncode != 0 and "Cannot find device" not in result.stderr:
            logger.error("could not delete bridge %s: %s", bridge, result.stderr.strip())


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


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


def run_policy_direct(
    nodes: tuple[Node, Node], groups: list[Path | None], config: dict[str, Any], port: int, workdir: Path
) -> dict[str, Any]:
    """``--direct``: run one task on both nodes with the node launcher; return node 0's metrics."""
    procs = [
        subprocess.Popen(
            node_command(node, rank, nodes[0], port, config, workdir / f"node{rank}" / "result.json"),
            env=_env(),
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


@dataclass
class Cluster:
    """A coordinator in the root namespace and one worker process per namespace."""

    api: ApiClient
    tag: str
    workers: list[str]


def _stop(proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.terminate()  # a worker drains (nothing runs by now) and says goodbye
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0fs; killing it", what, timeout_s)
            proc.kill()
            proc.wait()


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}; see its log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not write {path} within {timeout_s:.0f}s")
        time.sleep(0.1)
    return path.read_text().strip()


@contextmanager
def cluster(
    tag: str, nodes: tuple[Node, Node], groups: list[Path | None], workdir: Path
) -> Iterator[Cluster]:
    """Start the coordinator on the bridge address and a worker in each namespace (pinned to its
    node's CPU, in its cgroup, ``--interface`` its veth); wait until both are ready."""
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        with (workdir / "coordinator.log").open("wb") as log:
            coordinator = subprocess.Popen(
                [sys.executable, "run_coordinator.py", "--host", BRIDGE_ADDRESS, "--port", "0",
                 "--port-file", str(workdir / "port"), "--db-path", str(workdir / "coordinator.duckdb")],
                env=_env(), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        procs.append(("coordinator", coordinator))
        port = _wait_file(workdir / "port", coordinator, "coordinator", 60)
        url = f"http://{BRIDGE_ADDRESS}:{port}"
        admin = ApiClient(url, _wait_file(workdir / "admin.key", coordinator, "coordinator", 10))
        key = admin.post("/api/v1/keys", {"role": "worker", "name": f"ddp-bench-{tag}"})["key"]
        bench_tag = f"ddp-bench-{tag}"
        ids = []
        for node in nodes:
            worker_id = f"ddp-{tag}-{node.name}"
            ids.append(worker_id)
            with (workdir / f"worker-{node.name}.log").open("wb") as log:
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", node.namespace, "taskset", "-c", str(node.cpu),
                     sys.executable, "run_worker_example.py", "--coordinator", url, "--api-key", key,
                     "--interface", node.interface, "--worker-id", worker_id, "--name", worker_id,
                     "--tags", bench_tag, "--db-path", str(workdir / f"worker-{node.name}.duckdb"),
                     "--drain-timeout", "10"],
                    env=_env(), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_joiner(groups[nodes.index(node)]),
                )  # fmt: skip
            procs.append((f"worker {node.name}", proc))
        _wait_ready(admin, ids, dict(procs[1:]), WORKER_START_S)
        yield Cluster(admin, bench_tag, ids)
    finally:
        for what, proc in reversed(procs):
            _stop(proc, what)


def _wait_ready(api: ApiClient, ids: list[str], procs: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        workers = {w["worker_id"]: w for w in api.get("/api/v1/workers")["workers"]}
        if all(workers.get(i, {}).get("state") == "ready" for i in ids):
            logger.info("workers ready: %s", ", ".join(f"{i} ({workers[i]['name']})" for i in ids))
            return
        for what, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with status {proc.returncode}; see its log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {ids} not ready within {timeout_s:.0f}s: {workers}")
        time.sleep(0.5)


def run_policy_cluster(c: Cluster, config: dict[str, Any]) -> dict[str, Any]:
    """Submit one 2-node task for the two workers over the REST API, wait for it, and return
    node 0's metrics with the coordinator's ``global_samples_per_s`` and node placement."""
    task = {"type": "training", "config": config, "timeout_s": TASK_TIMEOUT_S,
            "requirements": {"tags": [c.tag]}}  # fmt: skip
    [accepted] = c.api.post("/api/v1/tasks", task)["tasks"]
    task_id = accepted["task_id"]
    deadline = time.monotonic() + TASK_TIMEOUT_S + 60
    while True:
        view = c.api.get(f"/api/v1/tasks/{task_id}", {"wait": "30"})
        if view.get("outcome") is not None:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"task {task_id} still {view['state']} after {TASK_TIMEOUT_S + 60:.0f}s")
    if view["state"] != "succeeded":
        raise RuntimeError(f"task {task_id} ended {view['state']}: {(view['outcome'] or {}).get('error')}")
    output = view["result"]["output"]
    metrics: dict[str, Any] = dict(output["metrics"])
    metrics["global_samples_per_s"] = float(output["global_samples_per_s"])
    metrics["placement"] = [f"node {n['node_rank']}: {n['worker_id']} ({n['address']})" for n in output["nodes"]]
    logger.info("task %s: %s", task_id, "; ".join(metrics["placement"]))
    return metrics


def summarize(policy: str, metrics: dict[str, Any], baseline: float | None) -> str:
    ranks = metrics["ranks"]
    capacity = "/".join(f"{r['compute_samples_per_s']:.0f}" for r in ranks)
    wait = "/".join(f"{1000 * r['mean_allreduce_wait_s']:.1f}" for r in ranks)
    speedup = f"{metrics['global_samples_per_s'] / baseline:.2f}x" if baseline else "1.00x"
    placement = f"  ({'; '.join(metrics['placement'])})" if metrics.get("placement") else ""
    return (
        f"{policy:<13} {metrics['global_samples_per_s']:>9.1f} {speedup:>8}  final shares "
        f"{str(metrics['shares']['final']):<12} capacity/rank {capacity:<11} all-reduce wait ms {wait}{placement}"
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
    parser.add_argument(
        "--direct", action="store_true", help="run the node launcher in each namespace, without coordinator and workers"
    )
    parser.add_argument("--keep", type=Path, default=None, help="copy the logs (coordinator, workers, runs) here")
    return parser.parse_args(argv)


def task_config(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": args.model, "nodes": 2, "nproc_per_node": 1,
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
        try:
            if args.direct:
                with cpu_burners(args.burners, nodes[1].cpu, groups[1]):
                    _rounds(args, policies, runs, lambda policy, port, workdir: run_policy_direct(
                        nodes, groups, task_config(args, policy), port, workdir), Path(tmp))
            else:  # workers start (and detect their hardware) before b is slowed
                with cluster(tag, nodes, groups, Path(tmp)) as c, cpu_burners(args.burners, nodes[1].cpu, groups[1]):
                    _rounds(args, policies, runs, lambda policy, port, workdir: run_policy_cluster(
                        c, task_config(args, policy)), Path(tmp))
        finally:
            if args.keep:
                shutil.copytree(tmp, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.duckdb*"))
    results = {policy: _median_run(found) for policy, found in runs.items()}
    baseline = results["none"]["global_samples_per_s"] if "none" in results else None
    mode = "direct launcher" if args.direct else "coordinator + 2 worker processes"
    slowed = "node 1" if args.direct else "worker b"
    print(f"{mode}: model={args.model} global_batch={args.batch_size} steps={args.steps} "
          f"slowed={slowed} ({args.burners} CPU burner(s) on its core) "
          f"repeat={args.repeat} total {time.monotonic() - started:.0f}s")  # fmt: skip
    print(f"{'policy':<13} {'samples/s':>9} {'vs none':>8}")
    for policy, metrics in results.items():
        print(summarize(policy, metrics, baseline))
    if args.json_out:
        args.json_out.write_text(json.dumps(runs, indent=1))
    return 0


def _rounds(
    args: argparse.Namespace,
    policies: list[str],
    runs: dict[str, list[dict[str, Any]]],
    run: Callable[[str, int, Path], dict[str, Any]],
    tmp: Path,
) -> None:
    for round_ in range(args.repeat):
        for index, policy in enumerate(policies):
            logger.info("round %d: running %s", round_ + 1, policy)
            workdir = tmp / f"{policy}-{round_}"
            workdir.mkdir()
            runs[policy].append(run(policy, BASE_PORT + round_ * len(policies) + index, workdir))


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda m: float(m["global_samples_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


if __name__ == "__main__":
    sys.exit(main())
