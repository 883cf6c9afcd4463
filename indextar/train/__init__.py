"""Exact resume inside trainers: PyTorch Lightning and Hugging Face Accelerate.

``progress`` counts the batches a training loop has trained on in the sampler's pass
and turns them into a :class:`~indextar.ResumableSampler` state; ``lightning`` is a
Lightning callback that saves and restores that state with Lightning's checkpoints;
``accelerate`` prepares a loader with ``accelerator.prepare`` and registers its state
for ``save_state`` / ``load_state``. Each trainer is an optional dependency (the
``lightning`` and ``accelerate`` extras), imported only by its own module, never by
``import indextar``.

May import: the shared modules, ``order/`` and ``read/``.
Must not import: ``tar/``, ``source/``, ``index/``, ``write/``, ``cli/``.
"""
