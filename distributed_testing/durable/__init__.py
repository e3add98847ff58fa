"""Durable local storage below the coordinator's store and the worker's result store: the
append-only journal (``journal``), DuckDB file helpers (``duckfile``) and ``fsync_dir``
(``fsutil``)."""
