"""Multi-node DDP training-throughput tasks (the node side).

* :mod:`.config`      validate the ``training`` task config; resolve ``auto`` per node
* :mod:`.balance`     pure policies splitting the global batch over ranks
* :mod:`.launch`      :func:`~.launch.launch`: pre-flight, torchrun, supervision (the executor's entry)
* :mod:`.preflight`   check-in barrier on the rendezvous port before torch starts
* :mod:`.worker_main` one rank under ``torch.distributed.run``; :mod:`.loop` its training loop
* :mod:`.metrics`     the result document (the coordinator computes the scaling efficiency)
* :mod:`.models`      built-in model sources (mlp, cnn, transformer) and ``module:factory`` loading

This package's ``__init__`` imports nothing, so light modules (config, balance, launch) stay free of
torch; only the rank processes import it.
"""
