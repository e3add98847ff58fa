"""--token / --token-file over time: renewal against a coordinator with a 3 s --token-ttl, a
renewal request that fails once, and a token file rotated after the worker has renewed."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from flags_support import Proxy, StartWorker

from distributed_testing.testing import Cluster, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(45)]


async def issue(c: Cluster, key: str) -> dict[str, Any]:
    status, body = await c.request("POST", "/api/v1/auth/token", key=key)
    assert status == 200, body
    return dict(body)


async def test_token_renewal_survives_one_failed_renewal_request(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0, token_ttl_s=3) as c:
        async with Proxy(urlsplit(c.base_url).port or 0) as proxy:
            first = await issue(c, await c.create_key("worker"))
            await start_cli_worker(c, ["--coordinator", f"http://127.0.0.1:{proxy.port}", "--token", first["token"],
                                       "--worker-id", "jwt", "--reconnect-interval", "0.05"])
            agent_task = c.agent_tasks[-1]
            proxy.refusing = True  # the live WebSocket stays up; the renewal request cannot connect
            await wait_for(lambda: proxy.refused >= 1, timeout=10, what="the worker's renewal request")
            proxy.refusing = False
            await wait_for(lambda: (c.runtime.sessions["jwt"].token_exp or 0) > first["expires_at"]
                           if "jwt" in c.runtime.sessions else agent_task.done(), timeout=15,
                           what="a renewed token (or the worker to give up)")
            assert not agent_task.done(), f"worker stopped: {agent_task.exception()!r}"


async def test_token_file_is_re_read_at_reconnect_even_after_a_renewal(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    token_file = tmp_path / "worker.jwt"
    async with run_cluster(tmp_path, workers=0, token_ttl_s=3) as c:
        first = await issue(c, await c.create_key("worker"))
        token_file.write_text(first["token"])
        await start_cli_worker(c, ["--coordinator", c.base_url, "--token-file", str(token_file),
                                   "--worker-id", "filed", "--reconnect-interval", "0.05"])
        s1 = c.runtime.sessions["filed"]
        await wait_for(lambda: (s1.token_exp or 0) > first["expires_at"], timeout=10, what="a renewal")

        second = await issue(c, await c.create_key("worker"))
        token_file.write_text(second["token"])  # rotated by an external tool, to another key
        s1.close("test: force a reconnect")
        # the id "filed" is bound to the first key until an admin releases it (the worker retries meanwhile)
        await wait_for(lambda: not c.runtime.state.workers["filed"].connected, what="the disconnect")
        status, body = await c.request("POST", "/api/v1/workers/filed/release")
        assert status == 200, body
        await wait_for(lambda: c.runtime.sessions.get("filed") not in (None, s1), timeout=10, what="a reconnect")
        assert c.runtime.sessions["filed"].key_id == second["key_id"]
