"""The REST client ``dt`` uses: the one coordinator client of ``distributed_testing/client.py``
(member list, timeouts, failover, and where credentials may go), under the names the CLI's
modules import."""

from __future__ import annotations

from ..client import FAILOVER_S, MAX_REDIRECTS, ROUND_PAUSE_S, ApiClient, ApiError

__all__ = ["FAILOVER_S", "MAX_REDIRECTS", "ROUND_PAUSE_S", "ApiClient", "ApiError"]
