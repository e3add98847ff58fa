"""``python -m distributed_testing.cli.train_node``: one training node from the command line.

Runs :func:`~distributed_testing.training.launch.launch` and writes its result dict to stdout as
JSON (the command's output; logs go to stderr). Exit status 1 when the launch fails.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from distributed_testing.errors import ExecutionError
from distributed_testing.training.launch import NodeAssignment, launch

logger = logging.getLogger("distributed_testing.training.launch")


def _parse_cli(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m distributed_testing.cli.train_node")
    parser.add_argument("--config", required=True, help="task config JSON, or @path to a JSON file")
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--interface", default=None, help="NIC for gloo/NCCL and the pre-flight")
    parser.add_argument("--result-path", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--preflight-timeout-s", type=float, default=5.0)
    parser.add_argument(
        "--cuda-device-count", type=int, default=None, help="CUDA devices on this node (default: detect)"
    )
    parser.add_argument("--all-cuda", action="store_true", help="every node of the job has CUDA")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_cli(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raw = Path(args.config[1:]).read_text() if args.config.startswith("@") else args.config
    cuda_devices = args.cuda_device_count
    if cuda_devices is None:
        import torch  # noqa: PLC0415  (only the CLI pays for importing torch to detect devices)

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assignment = NodeAssignment(args.node_rank, args.nnodes, args.master_addr, args.master_port, args.interface)
    try:
        result = launch(
            json.loads(raw),
            assignment,
            args.result_path,
            cuda_device_count=cuda_devices,
            all_cuda=args.all_cuda,
            timeout_s=args.timeout_s,
            preflight_timeout_s=args.preflight_timeout_s,
        )
    except ExecutionError as exc:
        logger.error("%s", exc)
        return 1
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
