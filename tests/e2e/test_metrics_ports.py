"""``--metrics-port`` through the real launchers, set by DT_METRICS_PORT: the coordinator's and a
worker's metrics on open ports of their own, moving with a real task."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from distributed_testing.testing import (
    Procs,
    Rest,
    free_port,
    hidden_accelerators,
    start_coordinator_process,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(90)


def scrape(port: int) -> dict[str, float]:
    """Unlabelled samples of ``http://127.0.0.1:PORT/metrics``, fetched with no credential."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def reachable(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_metrics_ports_of_coordinator_and_worker(tmp_path: Path) -> None:
    procs = Procs(tmp_path, cwd=ROOT)
    coord_metrics, worker_metrics = free_port(), free_port()
    try:
        _, port = start_coordinator_process(procs, tmp_path / "state" / "c.duckdb",
                                            env={"DT_METRICS_PORT": str(coord_metrics), "DT_METRICS": "off"})
        rest = Rest(f"http://127.0.0.1:{port}", (tmp_path / "state" / "admin.key").read_text().strip())
        assert rest.request("GET", "/metrics")[0] == 404  # DT_METRICS=off: only the open port serves them
        key = rest.create_key("worker")
        procs.start(["run_worker_example.py", "--worker-id", "wm", "--coordinator", rest.base_url,
                     "--heartbeat-interval", "0.5"], tmp_path / "worker.log",
                    env={"DT_API_KEY": key, "DT_METRICS_PORT": str(worker_metrics), **hidden_accelerators(tmp_path)})
        wait_until(lambda: reachable(worker_metrics) and scrape(worker_metrics)["dt_worker_connected"] == 1, 60,
                   "the worker to register and serve its metrics")
        before = scrape(worker_metrics)
        assert before["dt_worker_slots"] == 1 and before["dt_worker_running_tasks"] == 0
        assert scrape(coord_metrics)["dt_tasks_submitted_total"] == 0

        rest.submit({"task_id": "metrics-1", "type": "custom", "config": {"name": "noop"}})
        body = rest.ok("GET", "/api/v1/tasks/metrics-1", params={"wait": 30})
        assert body["state"] == "succeeded", body
        coord = scrape(coord_metrics)
        assert coord["dt_tasks_submitted_total"] == 1 and coord["dt_task_submit_to_outcome_seconds_count"] == 1
        assert coord["dt_worker_sessions"] == 1
        wait_until(lambda: scrape(worker_metrics)["dt_worker_unacked_results"] == 0, 10, "the result to be acked")
        assert 0 <= scrape(worker_metrics)["dt_worker_host_memory_percent"] <= 100
    finally:
        procs.close()
