"""The pytest plugin's parts beside its run loop (:mod:`distributed_testing.pytest_plugin`):
:mod:`.invocation` (which local pytest options travel with each task) and :mod:`.replay` (the
workers' reports replayed as local pytest's, with local paths)."""
