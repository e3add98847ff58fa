"""The HA group's timing that its clients depend on, in one place: the coordinator's leader lease
(``coordinator/group.py``) runs on these, and a client's failover bound (``client.FAILOVER_S``)
is derived from them. Pure constants (docs/operations.md, "High availability")."""

from __future__ import annotations

# A leader that stops renewing (paused, cut off) keeps the lease this long after its last renewal;
# the standbys keep naming it meanwhile.
LEASE_TTL_S = 5.0
# How often a standby looks for a lease that expired or whose holder's database session ended.
STANDBY_POLL_S = 0.2
# A standby's takeover once it holds the lease: fence the store, load the active work, serve.
# Measured 0.1-1.2 s on a loaded 2-core machine (benchmarks/RESULTS.md, "Failover as clients see
# it"); about four times the worst of that.
TAKEOVER_S = 5.0
# The longest a group is without a leader that answers after its leader fell silent.
FAILOVER_WINDOW_S = LEASE_TTL_S + STANDBY_POLL_S + TAKEOVER_S
