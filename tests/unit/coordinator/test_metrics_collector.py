"""The scrape-time collector: worker load from heartbeats, GPU included, and one registry per runtime."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics import disable_created_metrics, enable_created_metrics
from prometheus_client.parser import text_string_to_metric_families

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.metrics import (
    LATENCY_BUCKETS,
    RECORD_BUCKETS,
    LoopCounter,
    LoopHistogram,
    _LoopInstruments,
)
from distributed_testing.coordinator.runtime import Runtime
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.protocol import messages as m


def samples(rt: Runtime) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = rt.metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def runtime() -> Runtime:
    return Runtime(CoordinatorConfig(db_path="memory://"), MemoryStore())


def test_heartbeat_load_becomes_per_worker_gauges() -> None:
    rt = runtime()
    for wid, gpu in (("gpu-box", 87.5), ("cpu-box", None)):
        rt.state.register(m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={},
                                     capabilities=["cpu"], tags=[], max_concurrent=1), f"s-{wid}", 0.0, key_id="k")
        rt.state.heartbeat(wid, m.Heartbeat(state="constrained" if gpu else "ready", running=[], cpu_percent=10.0,
                                            memory_percent=20.0, free_slots=1, gpu_percent=gpu), 1.0)
    got = samples(rt)
    labels = (("name", "gpu-box"), ("worker_id", "gpu-box"))
    assert got[("dt_worker_gpu_percent", labels)] == 87.5
    assert ("dt_worker_gpu_percent", (("name", "cpu-box"), ("worker_id", "cpu-box"))) not in got
    assert got[("dt_worker_cpu_percent", labels)] == 10.0
    assert got[("dt_workers", (("state", "constrained"),))] == 1
    assert got[("dt_workers", (("state", "ready"),))] == 1


def test_each_runtime_reports_only_its_own() -> None:
    a, b = runtime(), runtime()
    a.metrics.submitted.inc(5)
    assert samples(a)[("dt_tasks_submitted_total", ())] == 5
    assert samples(b)[("dt_tasks_submitted_total", ())] == 0



def test_loop_instruments_render_as_prometheus_client_would() -> None:
    """LoopHistogram and LoopCounter (the task path's cheap instruments) give the samples of
    prometheus-client's Histogram and Counter for the same observations, bucket bounds and the
    ``_created`` series (what a dashboard or alert on the old output may read) included."""

    def text_samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): 0.0 if s.name.endswith("_created") else s.value
                for f in text_string_to_metric_families(generate_latest(reg).decode()) for s in f.samples}

    values = [0.0, 0.001, 0.0011, 0.5, 2.5, 7.0, 3600.0, 1e9, 4, 4096, 4097]
    for buckets in (LATENCY_BUCKETS, RECORD_BUCKETS):
        theirs, ours = CollectorRegistry(), CollectorRegistry()
        h, c = Histogram("h", "doc", buckets=buckets, registry=theirs), Counter("c", "doc", registry=theirs)
        lh, lc = LoopHistogram("h", "doc", buckets), LoopCounter("c", "doc")
        ours.register(_LoopInstruments([lh, lc]))
        for v in values:
            h.observe(v)
            lh.observe(v)
        c.inc(3)
        lc.inc(3)
        assert text_samples(ours) == text_samples(theirs)
        assert {("c_created", ()), ("h_created", ())} <= text_samples(ours).keys()
        disable_created_metrics()  # PROMETHEUS_DISABLE_CREATED_SERIES: neither exports them then
        try:
            assert text_samples(ours) == text_samples(theirs)
            assert ("c_created", ()) not in text_samples(ours)
        finally:
            enable_created_metrics()
