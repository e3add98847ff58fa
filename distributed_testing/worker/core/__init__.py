"""The worker's pure parts: events in, instructions out. Nothing here imports asyncio, socket,
time, logging or a store (``tests/unit/worker/test_worker_core_pure.py``)."""
