#!/usr/bin/env python3
"""Start a worker (same as the ``dt-worker`` console script)."""
import sys

from distributed_testing.cli.worker import entry

if __name__ == "__main__":
    sys.exit(entry())
