#!/usr/bin/env python3
"""Start the coordinator (same as the ``dt-coordinator`` console script)."""
import sys

from distributed_testing.cli.coordinator import main

if __name__ == "__main__":
    sys.exit(main())
