"""One rank's DDP training loop: the weighted step, all-reduce timing and rebalancing.

**Uneven local batches.** Each rank computes the *mean* loss over its ``n_r`` local samples and
scales it by ``n_r * world_size / global_batch`` before ``backward``. DDP averages gradients over
``world_size`` ranks, so the averaged gradient is ``sum_r (n_r / B) * grad(mean_r)``, which is
exactly the gradient of the mean loss over the concatenated global batch ``B = sum_r n_r``.

**Separating compute from the all-reduce.** DDP keeps its normal overlap of backward and gradient
all-reduce; a DDP comm hook (:func:`timed_allreduce_hook`, wrapping the stock allreduce hook)
records when the *last* gradient bucket became ready, i.e. when this rank's backward compute was
done. The time from then until ``backward()`` returns (DDP waits there for every bucket's
all-reduce) is the rank's *all-reduce wait*: exposed communication plus waiting for slower ranks.
Everything else in the step (forward, backward up to the last bucket, optimizer) is *compute*.
A rank's capacity, the throughput load balancing uses, is ``samples / compute time``, which does
not shrink when a fast rank idles waiting for a slow one. On CUDA the hook synchronizes the
compute stream at the last bucket, and the step synchronizes after ``backward``, so the host clock
brackets the device work; the all-reduce itself runs on NCCL's stream and is not serialized.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.
import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import Tensor
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from distributed_testing.training.balance import Balancer

SETUP_STEPS = 2
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class AllReduceTimer:
    """State for :func:`timed_allreduce_hook`: when this step's gradient buckets became ready."""

    def __init__(self, process_group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.process_group = process_group
        self.device = device
        self.first_ready: float | None = None
        self.last_ready: float | None = None

    def reset(self) -> None:
        self.first_ready = None
        self.last_ready = None


def timed_allreduce_hook(state: AllReduceTimer, bucket: GradBucket) -> torch.futures.Future[Tensor]:
    """The stock allreduce hook, noting when the first and the last bucket were ready."""
    if state.first_ready is None:
        state.first_ready = time.perf_counter()
    if bucket.is_last():
        if state.device.type == "cuda":
            torch.cuda.current_stream(state.device).synchronize()
        state.last_ready = time.perf_counter()
    return default_hooks.allreduce_hook(state.process_group, bucket)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepTiming:
    """Host-clock timings of one step on one rank, in seconds."""

    samples: int
    step_s: float
    compute_s: float
    allreduce_wait_s: float


@dataclass
class StepRunner:
    """Runs weighted DDP steps for one rank. ``scaler`` is set for fp16 only."""

    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    timer: AllReduceTimer
    global_batch: int
    world_size: int
    precision: str
    scaler: torch.amp.GradScaler | None = None
    last_loss: Tensor | None = None

    def step(self, inputs: Tensor, targets: Tensor) -> StepTiming:
        """One optimizer step on this rank's local batch; see the module doc for the weighting."""
        device = self.timer.device
        local = inputs.shape[0]
        start = time.perf_counter()
        self.timer.reset()
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            logits = self.model(inputs)
        loss = F.cross_entropy(logits.float(), targets)
        weighted = loss * (local * self.world_size / self.global_batch)
        to_backward: Tensor = self.scaler.scale(weighted) if self.scaler else weighted
        to_backward.backward()  # type: ignore[no-untyped-call]
        _sync(device)
        backward_end = time.perf_counter()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        _sync(device)
        end = time.perf_counter()
        self.last_loss = loss.detach()
        last_ready = self.timer.last_ready if self.timer.last_ready is not None else backward_end
        return StepTiming(
            samples=local,
            step_s=end - start,
            compute_s=(last_ready - start) + (end - backward_end),
            allreduce_wait_s=backward_end - last_ready,
        )

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.timer.device.type, dtype=dtype)


def build_runner(
    model: torch.nn.Module,
    device: torch.device,
    *,
    global_batch: int,
    world_size: int,
    precision: str,
    learning_rate: float = 0.01,
) -> StepRunner:
    """Wrap ``model`` (already on ``device``) in DDP with the timing hook and an SGD optimizer."""
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids)
    timer = AllReduceTimer(None, device)
    ddp.register_comm_hook(timer, timed_allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=learning_rate)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    return StepRunner(ddp, optimizer, timer, global_batch, world_size, precision, scaler)


@dataclass
class RankTotals:
    """Sums over the measured steps of one rank."""

    steps: int = 0
    samples: int = 0
    step_s: float = 0.0
    compute_s: float = 0.0
    allreduce_wait_s: float = 0.0

    def add(self, timing: StepTiming) -> None:
        self.steps += 1
        self.samples += timing.samples
        self.step_s += timing.step_s
        self.compute_s += timing.compute_s
        self.allreduce_wait_s += timing.allreduce_wait_s


@dataclass
class LoopResult:
    totals: RankTotals
    measured_s: float
    balancer: Balancer
    last_local_batch: int
    rebalances: int = 0
    gather_s: float = 0.0


def window_throughput(window: list[tuple[int, StepTiming]]) -> float:
    """This rank's capacity over a window: the median of per-step ``samples / compute time``.

    Steps 0 and 1 are left out while later steps remain (DDP builds its buckets in step 0 and
    rebuilds them in step 1; a constant added to every rank's time would pull the split towards
    equal). The median ignores the odd step that the OS preempted.
    """
    kept = [timing for step, timing in window if step >= SETUP_STEPS] or [timing for _, timing in window]
    rates = [t.samples / t.compute_s for t in kept if t.compute_s > 0 and math.isfinite(t.compute_s)]
    if not rates:
        raise RuntimeError(f"cannot measure throughput: no step with a positive compute time in {len(kept)}")
    return float(statistics.median(rates))


def gather_throughputs(value: float, world_size: int, device: torch.device) -> list[float]:
    """All ranks exchange one float; every rank gets the same list in rank order."""
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    return [float(t.item()) for t in everyone]


def run_loop(
    runner: StepRunner,
    pool: tuple[Tensor, Tensor],
    balancer: Balancer,
    *,
    rank: int,
    warmup_steps: int,
    steps: int,
    on_step: Callable[[int, int], None] | None = None,
) -> LoopResult:
    """Run warmup then measured steps, rebalancing when the policy says so."""
    inputs, targets = pool
    total = warmup_steps + steps
    totals = RankTotals()
    window: list[tuple[int, StepTiming]] = []
    measure_start = time.perf_counter()
    rebalances = 0
    gather_s = 0.0
    for step in range(total):
        if step == warmup_steps:
            dist.barrier()
            measure_start = time.perf_counter()
        local = balancer.shares[rank]
        timing = runner.step(inputs[:local], targets[:local])
        if step >= warmup_steps:
            totals.add(timing)
        window.append((step, timing))
        if balancer.due(step, total):
            gather_start = time.perf_counter()
            throughputs = gather_throughputs(window_throughput(window), balancer.world_size, runner.timer.device)
            balancer.rebalance(step, throughputs)
            gather_s += time.perf_counter() - gather_start
            rebalances += 1
            window.clear()
        if on_step is not None:
            on_step(step, total)
    measured_s = time.perf_counter() - measure_start
    return LoopResult(totals, measured_s, balancer, balancer.shares[rank], rebalances, gather_s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
