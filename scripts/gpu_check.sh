#!/usr/bin/env bash
# The CUDA paths checked for real on a machine with an NVIDIA GPU (CI has none, so these only run
# here by hand). Run from a checkout, with a python that has torch with CUDA and this project's
# dependencies (PY=..., default python3; the package is taken from the checkout via PYTHONPATH):
#   bash scripts/gpu_check.sh            writes logs and results.json to $OUT (default /tmp/dt-gpu-check)
# Optional: DT_WHEELS=DIR installs the wheels in DIR first (a machine without a package index),
# DT_BWRAP_DEB=FILE unpacks bubblewrap from a .deb when bwrap is missing (workers' default sandbox).
# Steps: hardware detection; the `gpu`-marked tests; a coordinator and two workers with default flags
# on the one GPU running fp16/bf16 benchmarks, autocast training, a 1-node nccl and a 2-node gloo
# training job, a pytest task that uses the GPU inside its confinement; --max-gpu-percent turning a worker `constrained` under a matmul load and `ready`
# after it; a 2-node nccl job on two workers that share the GPU (must fail, naming the shared GPU);
# both workers exiting on SIGTERM. Figures from a run are in benchmarks/RESULTS.md ("GPU check").
set -u
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/dt-gpu-check}; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=$ROOT
if [ -n "${DT_WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/dt-gpu-site "$DT_WHEELS"/*.whl || exit 9
  export PYTHONPATH=/tmp/dt-gpu-site:$ROOT
fi
if [ -n "${DT_BWRAP_DEB:-}" ] && ! command -v bwrap >/dev/null; then
  dpkg -x "$DT_BWRAP_DEB" /tmp/dt-gpu-bw && export PATH=/tmp/dt-gpu-bw/usr/bin:$PATH
fi
BIN=$(mktemp -d /tmp/dt-gpu-bin.XXXX)
for n in dt:dt dt-coordinator:coordinator dt-worker:worker; do
  printf '#!/bin/sh\nexec %s -m distributed_testing.cli.%s "$@"\n' "$(command -v "$PY")" "${n#*:}" > "$BIN/${n%%:*}"
  chmod +x "$BIN/${n%%:*}"
done
export PATH=$BIN:$PATH
step() { echo; echo "=== $* ($(date +%T))"; }

step versions
nvidia-smi -L 2>&1 | head -3
"$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())"
command -v bwrap >/dev/null && bwrap --version

step detect
timeout 120 "$PY" -m distributed_testing.worker.hardware > "$OUT/hardware.json" 2>&1; echo "rc=$?"
grep -A10 '"cuda"' "$OUT/hardware.json"

step gpu-tests
(cd "$ROOT" && timeout 200 "$PY" -m pytest -q -p no:cacheprovider -p no:schemathesis --timeout 150 \
  tests/integration/bench/test_bench_gpu.py tests/unit/worker/test_worker_hardware.py 2>&1 | tail -n 25)

step cluster
T=$(mktemp -d /tmp/dt-gpu.XXXX); mkdir -p "$T/state"; cd "$T"
PORT=${PORT:-8080}
dt-coordinator --host 127.0.0.1 --port "$PORT" --db-path state/c.duckdb > "$OUT/coordinator.log" 2>&1 &
export DT_COORDINATOR_URL=http://127.0.0.1:$PORT
for _ in $(seq 100); do [ -s state/admin.key ] && DT_API_KEY=$(cat state/admin.key) dt workers >/dev/null 2>&1 && break; sleep 0.3; done
DT_API_KEY=$(cat state/admin.key); export DT_API_KEY
(umask 077; dt keys create --role worker --name gpu > state/w.key)
# two workers with default flags (bwrap sandbox) on the one GPU; the second with a GPU limit
dt-worker --api-key-file state/w.key --name g1 > "$OUT/worker1.log" 2>&1 &
dt-worker --api-key-file state/w.key --name g2 --max-gpu-percent 20 --limit-cooldown 2 > "$OUT/worker2.log" 2>&1 &
for _ in $(seq 60); do [ "$(dt workers 2>/dev/null | grep -c ready)" -ge 2 ] && break; sleep 0.5; done
dt workers

step tasks
cat > test_gpu_visible.py <<'P'
import torch


def test_the_gpu_is_visible_inside_the_confinement():
    assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
    assert float((torch.ones(4, device="cuda") * 2).sum()) == 8.0
P
cat > tasks.json <<J
[{"task_id": "gpu-bert-fp16", "type": "benchmark", "config": {"model": "bert-base-uncased", "device": "cuda", "precision": "fp16", "batch_sizes": [1, 8, 32], "iterations": 20, "min_duration_s": 0.2}, "requirements": {"hardware": ["cuda"]}, "timeout_s": 240},
 {"task_id": "gpu-gpt2-bf16", "type": "benchmark", "config": {"model": "gpt2", "device": "cuda", "precision": "bf16", "batch_sizes": [1, 8], "iterations": 20, "min_duration_s": 0.2}, "requirements": {"hardware": ["cuda"]}, "timeout_s": 240},
 {"task_id": "gpu-resnet-amp-train", "type": "benchmark", "config": {"model": "resnet-50", "device": "cuda", "autocast": true, "mode": "training", "batch_sizes": [16], "iterations": 10, "min_duration_s": 0.2}, "requirements": {"hardware": ["cuda"]}, "timeout_s": 240},
 {"task_id": "gpu-pytest", "type": "test", "config": {"test_file": "test_gpu_visible.py"}, "requirements": {"hardware": ["cuda"]}, "timeout_s": 120},
 {"task_id": "train-nccl-1", "type": "training", "config": {"model": "mlp", "nodes": 1, "batch_size": 256, "steps": 30, "backend": "nccl", "precision": "bf16"}, "timeout_s": 240},
 {"task_id": "train-gloo-2", "type": "training", "config": {"model": "mlp", "nodes": 2, "batch_size": 256, "steps": 30, "backend": "gloo"}, "timeout_s": 240}]
J
timeout 240 dt submit tasks.json --wait; echo "submit rc=$? (0: every task succeeded)"
dt results --format json > "$OUT/results.json" 2>&1

step gpu-limit
"$PY" - <<'P' &
import time
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 12
while time.time() < end:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
P
LOAD=$!
for _ in $(seq 6); do sleep 2; dt workers | grep -E " g2 " | cut -c1-120; done
wait "$LOAD"; sleep 4; echo "after the load:"; dt workers | grep -E " g2 " | cut -c1-120

step nccl-on-a-shared-gpu
cat > shared.json <<J
[{"task_id": "train-nccl-2", "type": "training", "config": {"model": "mlp", "nodes": 2, "batch_size": 256, "steps": 10, "backend": "nccl"}, "timeout_s": 90}]
J
timeout 90 dt submit shared.json --wait > shared.out; rc=$?; tail -n 3 shared.out; echo "rc=$rc (1 expected: the job failed)"

step stop
kill %1 %2 %3 2>/dev/null
for i in $(seq 40); do jobs -r | grep -q . || break; sleep 1; done
echo "after SIGTERM: $(jobs -r | wc -l) process(es) still running after ${i} s"
jobs -l
