"""How the training executor words and classifies a failed launch, and what it reads from the
detected hardware. Pure: no processes, no loop."""

from __future__ import annotations

import pytest

from distributed_testing.worker.executors.training import classify_failure
from distributed_testing.worker.factory import cuda_device_count

KILLED = """
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 13396)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 13396
"""

PEER_LOST = """
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 11)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 10)
  traceback : RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error
  [127.0.0.1]:29863: Connection reset by peer.
"""

# node 0 of a 2-node gloo job whose peer's rank was SIGKILLed (seen in CI, one run in six here): its
# rank raised gloo's read error inside DDP's allreduce hook and then aborted
PEER_LOST_THEN_ABORTED = """
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 7580)  (SIGABRT)
  traceback : Traceback (most recent call last):
    File "/work/main/distributed_testing/training/loop.py", line 102, in step
      to_backward.backward()  # type: ignore[no-untyped-call]
  RuntimeError: Got the following error when running the callback: RuntimeError: \
[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:36778: \
Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.
  At:
    /torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py(31): <lambda>
"""

SEGFAULT = """
Root Cause (first observed failure):
[0]:
  exitcode  : -11 (pid: 10)  (SIGSEGV)
  traceback : Signal 11 (SIGSEGV) received by PID 10
"""

MODEL_BUG = """
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 10)
  traceback : ValueError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)
"""

# as NCCL 2.28.9 wrote it on an H200 host where two workers shared the one GPU (2-node nccl job)
DUPLICATE_GPU = """
[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, \
invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 10)
"""


@pytest.mark.parametrize(("log", "status", "reason"), [
    (DUPLICATE_GPU, "failed", "two ranks of the job share a GPU (Duplicate GPU detected : rank 0 and rank 1"),
    (KILLED, "error", "a local rank was killed by signal 9 (out-of-memory killer or an outside kill)"),
    (PEER_LOST_THEN_ABORTED, "error", "a peer node or the network failed during training (gloo/transport)"),
    (SEGFAULT, "error", "a local rank died of signal 11 (SIGSEGV)"),
    (PEER_LOST, "error", "a peer node or the network failed during training (gloo/transport)"),
    (MODEL_BUG, "failed", "a training rank failed"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen", "error", "a peer node or the network"),
    ("", "failed", "a training rank failed"),
])
def test_classify_failure(log: str, status: str, reason: str) -> None:
    got_status, got_reason = classify_failure(log)
    assert got_status == status and got_reason.startswith(reason)


def test_only_the_root_cause_counts_for_a_killed_rank() -> None:
    """Ranks the agent stopped after the first failure (SIGTERM, -15) are listed under Failures:
    that is the agent's cleanup, not why the node failed."""
    assert classify_failure(PEER_LOST)[0] == "error" and "signal" not in classify_failure(PEER_LOST)[1]


@pytest.mark.parametrize(("hardware", "count"), [
    ({"devices": {"cuda": {"available": True, "count": 4}}}, 4),
    ({"devices": {"cuda": {"available": False, "count": 0, "reason": "no driver"}}}, 0),
    ({"devices": {}}, 0),
    ({"hostname": "test"}, 0),
])
def test_cuda_device_count_from_detected_hardware(hardware: dict[str, object], count: int) -> None:
    assert cuda_device_count(hardware) == count  # type: ignore[arg-type]
