"""What training ranks send each other besides gradients: plain data only, never Python objects.

The ranks of one gang run on different workers, each started by a different worker key. A rank
that unpickled a peer's data (``all_gather_object`` and the other ``*_object`` collectives of
``torch.distributed`` do) would run whatever that peer's ``__reduce__`` says: one gang member's
operator, or whoever holds its worker key, would run code on every other member. So the
per-rank summaries travel as MessagePack (numbers and strings, nothing that names code) in a
uint8 tensor, decoded by msgspec against :class:`RankSummary`, which refuses anything else:

1. every rank all-gathers its payload's length (one int64); a length outside
   ``1..MAX_SUMMARY_BYTES`` stops every rank before anything is allocated for it;
2. every rank all-gathers its payload padded to the longest length (uint8);
3. each slot is decoded as a :class:`RankSummary` whose ``rank`` must be the sender's rank.

Every honest rank sees the same gathered bytes, so all of them fail alike (an
:class:`~distributed_testing.errors.ExecutionError` naming the rank and the problem) instead of
some waiting for the others until the collective timeout. Nothing here calls pickle.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import torch
import torch.distributed as dist

from distributed_testing.errors import ExecutionError

MAX_SUMMARY_BYTES = 64 * 1024  # a summary is about 600 bytes
Text = Annotated[str, msgspec.Meta(max_length=1024)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class RankSummary(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One rank's metrics for the result document (see :mod:`.metrics` for their meaning)."""

    rank: Count
    node_rank: Count
    local_rank: Count
    hostname: Text
    device: Text
    samples: Count
    steps: Count
    measured_s: float
    samples_per_s: float
    compute_samples_per_s: float
    mean_step_s: float
    mean_compute_s: float
    allreduce_wait_s: float
    mean_allreduce_wait_s: float
    rebalance_gather_s: float
    peak_memory_bytes: Count
    peak_memory_kind: Text
    last_loss: float
    last_local_batch: Count


_DECODER = msgspec.msgpack.Decoder(RankSummary)


def decode_summary(data: bytes, sender: int) -> RankSummary:
    """The summary rank ``sender`` sent; ExecutionError when it is anything else."""
    try:
        summary = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ExecutionError(f"rank {sender} sent a summary that is not plain data of the expected form ({exc}); "
                             "ranks exchange MessagePack summaries only, never Python objects") from exc
    if summary.rank != sender:
        raise ExecutionError(f"rank {sender} sent the summary of rank {summary.rank}")
    return summary


def all_gather_summaries(summary: dict[str, Any], world_size: int, device: torch.device) -> list[dict[str, Any]]:
    """Every rank's summary, in rank order, on every rank (a collective: all ranks call it)."""
    payload = msgspec.msgpack.encode(msgspec.convert(summary, RankSummary))
    if len(payload) > MAX_SUMMARY_BYTES:
        raise ExecutionError(f"this rank's summary is {len(payload)} bytes, over the {MAX_SUMMARY_BYTES}-byte limit")
    size = torch.tensor([len(payload)], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    lengths = [int(t.item()) for t in sizes]
    for sender, length in enumerate(lengths):
        if not 0 < length <= MAX_SUMMARY_BYTES:
            raise ExecutionError(f"rank {sender} announced a {length}-byte summary (limit {MAX_SUMMARY_BYTES})")
    longest = max(lengths)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8, device=device)
    slots = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world_size)]
    dist.all_gather(slots, mine)
    return [msgspec.to_builtins(decode_summary(bytes(slot[:length].tolist()), sender))
            for sender, (slot, length) in enumerate(zip(slots, lengths, strict=True))]
