"""The coordinator's pure core: events in, commands out. No awaits, no clock, no sockets, no
logging, no store: every method takes ``now`` and returns what the transport must do.

- ``state``: ``CoordinatorState``, the scheduling state machine the transport drives; its parts:
  ``queues`` (pending tasks in dispatch order), ``gang`` (multi-node tasks placed all-or-nothing),
  ``takeback`` (tasks sent ahead moved off a stuck worker), ``recovery`` (restore after a restart,
  reconcile a worker that registers, lose one that does not come back).
- ``commands``: what its events return for the transport to do.
- ``policy``: its settings, and the liveness contract it grants a worker session.
- ``entities``: the tasks (with a multi-node task's gang placement) and workers it holds.
- ``rows``: the records it hands the store to persist, and the snapshot it is rebuilt from.
- ``placement``: which worker may run which task, and the index that picks one.
- ``pipeline``: how many tasks a worker may hold ahead of its slots.
- ``identity``: which key owns a worker id, and which attempts a worker was given.
- ``quota``: what one API key may keep queued.

``tests/test_import_layers.py`` reads the imports of every ``core`` package and holds it to this.
"""
