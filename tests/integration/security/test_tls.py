"""TLS end to end with a private CA made at test time (trustme): the coordinator serves https and
wss (through the lean HTTP front and its hand-over to aiohttp), and ``dt`` and a worker with the
CA run a task through it. The attacks: an eavesdropper between ``dt`` and the coordinator, a
coordinator impostor whose certificate the clients do not trust, and a plain-http client."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from security_support import Sniffer

from distributed_testing.testing import (
    Procs,
    TlsFiles,
    hidden_accelerators,
    make_tls_files,
    run_cluster,
    start_coordinator_process,
)

ROOT = Path(__file__).resolve().parents[3]
NOOP = {"type": "custom", "config": {"name": "noop"}}
DT_VARS = ("DT_COORDINATOR_URL", "DT_API_KEY", "DT_CA_FILE", "DT_TLS_CERT", "DT_TLS_KEY")



@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path / "tls")


def dt(*argv: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in DT_VARS}
    return subprocess.run([sys.executable, "-m", "distributed_testing.cli.dt", *argv], capture_output=True, text=True,
                          timeout=90, env={**base, **(env or {})}, input=stdin, cwd=ROOT)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_in_process_cluster_over_tls(tmp_path: Path, tls_files: TlsFiles) -> None:
    """The lean front answers the submission itself over TLS; the WebSocket handshake and the
    other routes are handed to aiohttp on the same TLS transport."""
    async with run_cluster(tmp_path, workers=1, tls_cert=tls_files.cert, tls_key=tls_files.key,
                           ca_file=tls_files.ca) as c:
        assert c.base_url.startswith("https://")
        [task_id] = await c.submit(NOOP)
        task = await c.wait(task_id)
        assert task["state"] == "succeeded", task
        status, body = await c.request("GET", "/api/v1/workers")  # aiohttp's side, after the fast path
        assert status == 200 and [w["worker_id"] for w in body["workers"]] == ["w0"]


@pytest.mark.timeout(180)
def test_dt_and_a_worker_run_a_task_over_tls_and_strangers_are_refused(
        tmp_path: Path, procs: Procs, tls_files: TlsFiles) -> None:
    db = tmp_path / "state" / "c.duckdb"
    _, port = start_coordinator_process(procs, db, make_dir=False,
                                        env={"DT_TLS_CERT": str(tls_files.cert), "DT_TLS_KEY": str(tls_files.key)})
    admin = (db.parent / "admin.key").read_text().strip()
    url = f"https://127.0.0.1:{port}"
    sniffer = Sniffer(port)
    try:
        via_sniffer = f"https://127.0.0.1:{sniffer.port}"
        made = dt("--coordinator", via_sniffer, "--api-key", admin, "--ca-file", str(tls_files.ca),
                  "keys", "create", "--role", "worker")
        assert made.returncode == 0, made.stderr
        worker_key = made.stdout.strip()

        worker_log = tmp_path / "worker.log"
        worker = procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", url, "--api-key", worker_key,
                              "--worker-id", "tls-w", "--reconnect-attempts", "2"], worker_log,
                             env={"DT_CA_FILE": str(tls_files.ca), **hidden_accelerators(tmp_path)},
                             drop_env=[v for v in DT_VARS if v != "DT_CA_FILE"])
        submitted = dt("--coordinator", via_sniffer, "--api-key", admin, "submit", "-", "--wait", "--timeout", "90",
                       env={"DT_CA_FILE": str(tls_files.ca)}, stdin=json.dumps(NOOP))
        assert submitted.returncode == 0, f"{submitted.stderr}\n{worker_log.read_text()[-3000:]}"
        assert "succeeded" in submitted.stderr
        assert worker.poll() is None, worker_log.read_text()[-3000:]
    finally:
        sniffer.close()
    # the eavesdropper saw a TLS handshake and ciphertext, never a credential or a request
    assert sniffer.captured, "nothing went through the relay"
    for secret in (admin, worker_key, "Authorization", "/api/v1/"):
        assert secret.encode() not in sniffer.captured, f"{secret[:12]}... crossed the network in clear"

    # dt without the CA, or trusting another one (an impostor's), refuses with one clear line
    other = make_tls_files(tmp_path / "other")
    for extra in ([], ["--ca-file", str(other.ca)]):
        refused = dt("--coordinator", url, "--api-key", admin, *extra, "workers")
        assert refused.returncode == 2, refused
        assert "is not trusted" in refused.stderr and "pass --ca-file" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    missing = dt("--coordinator", url, "--api-key", admin, "--ca-file", str(tmp_path / "nope.pem"), "workers")
    assert missing.returncode == 2 and "--ca-file: cannot load CA certificates" in missing.stderr, missing.stderr

    # a worker without the CA stops at once with the reason, not after its reconnect attempts
    lost_log = tmp_path / "untrusting.log"
    untrusting = procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", url, "--api-key", worker_key,
                              "--worker-id", "no-ca"], lost_log, env=hidden_accelerators(tmp_path), drop_env=DT_VARS)
    assert untrusting.wait(90) == 2, lost_log.read_text()[-3000:]
    text = lost_log.read_text()
    assert f"dt-worker: the TLS certificate of {url} is not trusted" in text and "--ca-file" in text, text[-3000:]
    assert "Traceback" not in text

    # plain http to the TLS port gets no HTTP answer at all
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        conn.request("GET", "/api/v1/healthz")
        conn.getresponse()
    conn.close()
