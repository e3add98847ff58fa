"""One DDP step with uneven local batches equals one single-process step on the whole batch."""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from distributed_testing.training.loop import build_runner
from distributed_testing.training.models import mlp

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

LOCAL_BATCHES = (3, 5)
GLOBAL_BATCH = sum(LOCAL_BATCHES)
LEARNING_RATE = 0.5


def fixed_model_and_batch() -> tuple[torch.nn.Module, Tensor, Tensor]:
    torch.manual_seed(7)
    model, make_batch = mlp(in_features=16, hidden=32, depth=2)
    inputs, targets = make_batch(GLOBAL_BATCH)
    return model, inputs, targets


def rank_main(rank: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    # a file store in the test's directory, not a TCP port chosen before the ranks start: another test's
    # process took such a port once in CI, and a rank waited on it until the test's 150 s ran out
    dist.init_process_group("gloo", init_method=f"file://{Path(out_dir) / 'store'}", rank=rank,
                            world_size=len(LOCAL_BATCHES), timeout=datetime.timedelta(seconds=60))
    try:
        model, inputs, targets = fixed_model_and_batch()
        start = sum(LOCAL_BATCHES[:rank])
        local = slice(start, start + LOCAL_BATCHES[rank])
        runner = build_runner(
            model,
            torch.device("cpu"),
            global_batch=GLOBAL_BATCH,
            world_size=len(LOCAL_BATCHES),
            precision="fp32",
            learning_rate=LEARNING_RATE,
        )
        timing = runner.step(inputs[local], targets[local])
        assert timing.samples == LOCAL_BATCHES[rank]
        assert timing.compute_s > 0 and timing.allreduce_wait_s >= 0
        torch.save([p.detach() for p in model.parameters()], Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def sgd_step(model: torch.nn.Module, loss: Tensor) -> list[Tensor]:
    loss.backward()
    with torch.no_grad():
        return [p - LEARNING_RATE * p.grad for p in model.parameters()]  # type: ignore[operator]


def run_ranks(out_dir: str) -> None:
    """Both ranks, forked from this process once it imported what DDP needs (torch._dynamo: ~2 s
    spared per rank)."""
    import torch._dynamo  # noqa: F401

    mp.start_processes(rank_main, args=(out_dir,), nprocs=len(LOCAL_BATCHES), join=True, start_method="fork")


def test_uneven_local_batches_match_single_process(tmp_path: Path) -> None:
    # The ranks are forked from a fresh interpreter that runs this module (``__main__`` below),
    # never from the pytest process: a fork of an xdist worker copies whatever its threads held
    # (execnet's I/O thread, the OpenMP pool of benchmarks that ran there) and a rank once hung for
    # good that way. A fresh interpreter, unlike a forkserver, leaves nothing running after it.
    done = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(len(LOCAL_BATCHES))]

    model, inputs, targets = fixed_model_and_batch()
    expected = sgd_step(model, F.cross_entropy(model(inputs), targets))

    model, inputs, targets = fixed_model_and_batch()
    first, second = F.cross_entropy(model(inputs[:3]), targets[:3]), F.cross_entropy(model(inputs[3:]), targets[3:])
    naive = sgd_step(model, (first + second) / 2)  # what plain DDP averaging of local means gives

    for params in ranks:
        for got, want in zip(params, expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert max((n - e).abs().max().item() for n, e in zip(naive, expected, strict=True)) > 1e-3


if __name__ == "__main__":
    run_ranks(sys.argv[1])
