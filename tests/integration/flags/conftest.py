"""Fixtures for the flag tests; the helpers live in flags_support.py."""

from flags_support import clean_env, fast_hardware, procs, start_cli_worker, thread_cluster

__all__ = ["clean_env", "fast_hardware", "procs", "start_cli_worker", "thread_cluster"]
