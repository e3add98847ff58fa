#!/usr/bin/env python3
"""Serve the web dashboard (same as the ``dt-dashboard`` console script)."""
import sys

from distributed_testing.cli.dashboard import main

if __name__ == "__main__":
    sys.exit(main())
