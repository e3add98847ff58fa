"""``dt results`` shows multi-node training results: model, nodes, world size, backend, load
balancing, global samples/s and scaling efficiency, in every ``--format``, against a real
coordinator whose store holds the rows (as the coordinator writes them for a gang's attempt)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from flags_support import ThreadCluster

from distributed_testing.cli import dt
from distributed_testing.coordinator.core.rows import ResultRow

pytestmark = pytest.mark.timeout(60)

METRICS = {"kind": "training", "model": "mlp", "backend": "gloo", "precision": "fp32", "load_balance": "dynamic",
           "rebalance_interval": 4, "nnodes": 2, "world_size": 4, "global_batch": 64, "steps": 10,
           "warmup_steps": 2, "global_samples_per_s": 1234.5, "measured_s": 0.5, "final_loss": 0.1,
           "shares": {"initial": [16] * 4, "final": [16] * 4, "history": []}, "ranks": []}
NODE0 = {"node_rank": 0, "nnodes": 2, "nproc_per_node": 2, "backend": "gloo", "local_address": "10.0.0.1",
         "master": "10.0.0.1:29500", "wall_s": 3.0, "log_path": "/x/result.json.node0.log", "metrics": METRICS}
NODES = [{"node_rank": 0, "worker_id": "wa", "address": "10.0.0.1", "status": "succeeded", "wall_s": 3.0, "error": None},
         {"node_rank": 1, "worker_id": "wb", "address": "10.0.0.2", "status": "succeeded", "wall_s": 3.0, "error": None}]

ROWS = [
    ResultRow(task_id="t-ddp", attempt=1, worker_id="wa", status="succeeded", started_at=10.0, finished_at=13.0,
              received_at=300.0, task_type="training",
              output={**NODE0, "model": "mlp", "precision": "fp32", "global_batch": 64,
                      "global_samples_per_s": 1234.5, "nodes": NODES, "scaling_efficiency": 0.8125,
                      "scaling_baseline": {"task_id": "t-one", "attempt": 1, "global_samples_per_s": 760.0, "nnodes": 1}}),
    ResultRow(task_id="t-ddp-failed", attempt=1, worker_id="wb", status="error", started_at=20.0, finished_at=21.0,
              received_at=200.0, task_type="benchmark", error="node 1: a peer node or the network failed",
              output={"node_rank": 1, "nnodes": 2, "master": "10.0.0.1:29501", "error_type": "RankFailure",
                      "metrics": None, "retryable": True, "nodes": NODES}),
    ResultRow(task_id="r-bert", attempt=1, worker_id="wa", status="succeeded", started_at=10.0, finished_at=12.5,
              received_at=100.0, task_type="benchmark",
              output={"model": "bert", "precision": "fp32", "device": "cpu",
                      "batch_results": [{"batch_size": 1, "latency_ms": {"median": 2.0}}]}),
]


@pytest.fixture
def results(thread_cluster: ThreadCluster, capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch) -> Any:
    async def seed() -> None:
        await thread_cluster.c.runtime.store.append(list(ROWS))

    thread_cluster.call(seed())

    def run(*argv: str) -> str:
        capsys.readouterr()
        code = dt.main(["--coordinator", thread_cluster.c.base_url, "--api-key", thread_cluster.c.admin_key,
                        "results", *argv])
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    return run


def test_json_adds_a_training_object_to_training_results_only(results: Any) -> None:
    by_id = {r["task_id"]: r for r in json.loads(results("--format", "json"))}
    assert by_id["t-ddp"]["training"] == {"model": "mlp", "nodes": 2, "world_size": 4, "backend": "gloo",
                                          "load_balance": "dynamic", "global_samples_per_s": 1234.5,
                                          "scaling_efficiency": 0.8125}
    assert by_id["t-ddp"]["output"]["metrics"] == METRICS  # the stored result itself is untouched
    assert by_id["t-ddp-failed"]["training"]["nodes"] == 2
    assert by_id["t-ddp-failed"]["training"]["global_samples_per_s"] is None
    assert "training" not in by_id["r-bert"]


def test_csv_has_the_training_columns(results: Any) -> None:
    rows = {r["task_id"]: r for r in csv.DictReader(io.StringIO(results("--format", "csv")))}
    ddp = rows["t-ddp"]
    # a training result is labelled training, also one stored as "benchmark" by an older coordinator
    assert (ddp["task_type"], rows["t-ddp-failed"]["task_type"], rows["r-bert"]["task_type"]) == (
        "training", "training", "benchmark")
    assert (ddp["model"], ddp["nodes"], ddp["world_size"], ddp["backend"], ddp["load_balance"]) == (
        "mlp", "2", "4", "gloo", "dynamic")
    assert (float(ddp["global_samples_per_s"]), float(ddp["scaling_efficiency"])) == (1234.5, 0.8125)
    assert rows["t-ddp-failed"]["status"] == "error" and rows["t-ddp-failed"]["scaling_efficiency"] == ""
    assert rows["r-bert"]["model"] == "" and rows["r-bert"]["summary"].startswith("bert fp32 cpu")


def test_table_shows_training_columns_when_a_training_result_is_listed(results: Any) -> None:
    header, *lines = results().splitlines()
    assert header.split() == ["TASK_ID", "ATTEMPT", "WORKER_ID", "TASK_TYPE", "STATUS", "MODEL", "NODES", "WORLD_SIZE",
                              "BACKEND", "LOAD_BALANCE", "GLOBAL_SAMPLES_PER_S", "SCALING_EFFICIENCY", "FINISHED_AT", "DURATION_S",
                              "SUMMARY", "ERROR"]
    ddp = next(line for line in lines if line.startswith("t-ddp "))
    assert ddp.split()[5:12] == ["mlp", "2", "4", "gloo", "dynamic", "1234.500", "0.812"]
    assert "mlp training, 2 node(s): 1234.5 samples/s" in ddp


def test_model_filter_finds_training_results(results: Any) -> None:
    assert [r["task_id"] for r in json.loads(results("--format", "json", "--model", "mlp"))] == ["t-ddp"]
