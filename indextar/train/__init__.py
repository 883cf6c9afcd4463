"""Exact resume inside trainers: PyTorch Lightning and Hugging Face Accelerate.

``progress`` counts the batches a training loop has trained on in the sampler's pass
and turns them into a :class:`~indextar.ResumableSampler` state; ``lightning`` has
``ResumableDataLoader``, a DataLoader whose state Lightning saves in its checkpoints
and restores; ``accelerate`` has ``prepare_loader``, ``accelerator.prepare`` plus that
state registered for ``save_state`` / ``load_state``. Each trainer is an optional dependency (the
``lightning`` and ``accelerate`` extras), imported only by its own module, never by
``import indextar``.

May import: the shared modules, ``order/`` and ``read/``.
Must not import: ``tar/``, ``source/``, ``index/``, ``write/``, ``cli/``.
"""
