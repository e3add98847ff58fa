"""A gang member cannot run code in another member's rank (issue 27 item 3).

Two real rank processes on gloo: rank 0 is the real ``worker_main``; rank 1 trains like any rank
but then sends, in the summary exchange, what ``all_gather_object`` sends: a pickle whose
``__reduce__`` writes a marker file and then yields a well-formed summary (so that a rank which
unpickled it would even report success). Rank 0 must not run it: the marker never appears, no
result is written, and rank 0 fails naming rank 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from distributed_testing.errors import ExecutionError
from distributed_testing.training.exchange import RankSummary, decode_summary

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

CONFIG = {"model": "mlp", "nodes": 2, "nproc_per_node": 1, "batch_size": 4, "steps": 1, "warmup_steps": 0,
          "backend": "gloo", "precision": "fp32", "load_balance": "none", "rebalance_interval": 10}

MALICIOUS_RANK = """
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distributed_testing.training import worker_main
from distributed_testing.training.task_config import ResolvedTrainingConfig

MARKER = sys.argv[1]
env = worker_main.RankEnv.from_environ(os.environ)
config = ResolvedTrainingConfig.from_dict(json.loads(sys.argv[2]))
dist.init_process_group("gloo")
summary, _ = worker_main.train(config, env, torch.device("cpu"), None)


class Payload:
    def __reduce__(self):
        expr = f"(__import__('pathlib').Path({MARKER!r}).write_text('pwned'), __import__('json').loads({json.dumps(summary)!r}))[1]"
        return (eval, (expr,))


dist.all_gather_object([None, None], Payload())
dist.barrier()
"""


def rank_env(rank: int, port: int) -> dict[str, str]:
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def test_a_pickle_from_a_peer_rank_is_never_unpickled(tmp_path: Path, free_port: int) -> None:
    marker, result = tmp_path / "pwned", tmp_path / "result.json"
    (tmp_path / "malicious_rank.py").write_text(MALICIOUS_RANK)
    config = json.dumps(CONFIG)
    honest = subprocess.Popen(
        [sys.executable, "-m", "distributed_testing.training.worker_main", "--config-json", config,
         "--result-path", str(result), "--collective-timeout-s", "60"],
        env=rank_env(0, free_port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    attacker = subprocess.Popen([sys.executable, str(tmp_path / "malicious_rank.py"), str(marker), config],
                                env=rank_env(1, free_port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=tmp_path)
    try:
        output, _ = honest.communicate(timeout=180)
    finally:
        for p in (honest, attacker):
            p.kill()
            p.wait()
    text = output.decode(errors="replace")
    assert not marker.exists(), text[-3000:]
    assert honest.returncode != 0 and not result.exists(), text[-3000:]
    assert "rank 1 sent a summary that is not plain data" in text, text[-3000:]


def summary(rank: int) -> RankSummary:
    return RankSummary(rank=rank, node_rank=0, local_rank=0, hostname="h", device="cpu", samples=1, steps=1,
                       measured_s=1.0, samples_per_s=1.0, compute_samples_per_s=1.0, mean_step_s=1.0,
                       mean_compute_s=1.0, allreduce_wait_s=0.0, mean_allreduce_wait_s=0.0, rebalance_gather_s=0.0,
                       peak_memory_bytes=1, peak_memory_kind="process_max_rss", last_loss=float("nan"),
                       last_local_batch=1)


def test_decode_accepts_only_a_summary_of_the_sender() -> None:
    good = msgspec.msgpack.encode(summary(1))
    decoded = decode_summary(good, 1)
    assert decoded.rank == 1 and decoded.last_loss != decoded.last_loss  # NaN survives
    import pickle  # only to build what an attacker sends

    for bad in (pickle.dumps({"rank": 1}), msgspec.msgpack.encode({"rank": 1}), b"",
                msgspec.msgpack.encode({**msgspec.to_builtins(summary(1)), "extra": 1}), torch.zeros(3).numpy().tobytes()):
        with pytest.raises(ExecutionError, match="rank 1 sent a summary that is not plain data"):
            decode_summary(bad, 1)
    with pytest.raises(ExecutionError, match="rank 1 sent the summary of rank 0"):
        decode_summary(msgspec.msgpack.encode(summary(0)), 1)


def test_no_training_module_uses_a_pickling_collective() -> None:
    """The ``*_object`` collectives unpickle what peers send; no rank code may call them."""
    package = Path(__file__).resolve().parents[3] / "distributed_testing" / "training"
    for source in package.glob("*.py"):
        text = source.read_text()
        for needle in (".all_gather_object(", ".broadcast_object_list(", ".gather_object(", ".scatter_object_list(",
                       ".recv_object_list(", ".send_object_list(", "import pickle", "pickle.load"):
            assert needle not in text, f"{source.name} uses {needle}"
