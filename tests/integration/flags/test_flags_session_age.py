"""--max-session-age: a JWT renews JWTs only within its session's maximum age. The attack: keep
trading each token for the next one, forever, without the API key. And a worker started with
--token that reaches the limit stops with a reason instead of retrying."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from flags_support import StartWorker

from distributed_testing.errors import ConfigError
from distributed_testing.testing import run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def test_a_chain_of_renewed_tokens_ends_at_the_maximum_session_age(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, token_ttl_s=2, max_session_age_s=4) as c:
        key = await c.create_key("submitter")
        status, body = await c.request("POST", "/api/v1/auth/token", key=key)
        assert status == 200, body
        began, token, first = time.time(), body["token"], body
        expiries = [body["expires_at"]]
        while time.time() < began + 15:  # before the fix: renewed forever
            status, body = await c.request("POST", "/api/v1/auth/token", key=token)
            if status != 200:
                break
            token = body["token"]
            expiries.append(body["expires_at"])
            await asyncio.sleep(0.5)
        assert status == 401, f"still renewing {time.time() - began:.1f} s into a 4 s session: {body}"
        assert body["message"] == "token has expired"
        assert time.time() - began < 4 + 1.5
        assert max(expiries) == expiries[0] - 2 + 4  # no renewed token outlived the session
        assert first["session_expires_at"] == max(expiries)
        status, body = await c.request("POST", "/api/v1/auth/token", key=key)  # the API key starts a new one
        assert status == 200, body


async def test_a_token_worker_stops_with_a_reason_at_the_maximum_session_age(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    # the token must outlive the worker's start, which took over 2 s beside a loaded CI run (its
    # first connect then met an expired token and it never registered)
    async with run_cluster(tmp_path, workers=0, token_ttl_s=6, max_session_age_s=12) as c:
        status, body = await c.request("POST", "/api/v1/auth/token", key=await c.create_key("worker"))
        assert status == 200, body
        await start_cli_worker(c, ["--coordinator", c.base_url, "--token", body["token"], "--worker-id", "jwt",
                                   "--reconnect-interval", "0.05"])
        agent_task = c.agent_tasks[-1]
        renewed = c.runtime.sessions["jwt"]
        await wait_for(lambda: (renewed.token_exp or 0) > body["expires_at"], timeout=12, what="a renewal")
        await wait_for(agent_task.done, timeout=25, what="the worker to stop at the end of its session")
        exc = agent_task.exception()
        assert isinstance(exc, ConfigError), repr(exc)
        assert "maximum session age (--max-session-age)" in str(exc)
        assert "restart the worker with --api-key or a fresh --token/--token-file" in str(exc)
        assert renewed.token_exp == body["session_expires_at"]
