"""This process's world size and rank: given, or from ``torch.distributed``.

Read from ``sys.modules``, so that the sampler never imports torch itself.
"""

from __future__ import annotations

import sys

from .state import as_int

__all__ = ["resolve_world"]


def resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Fill in world size and rank from torch.distributed, without importing torch."""
    distributed = sys.modules.get("torch.distributed")
    initialised = bool(
        distributed is not None and distributed.is_available() and distributed.is_initialized()
    )
    if num_replicas is None:
        num_replicas = distributed.get_world_size() if initialised and distributed else 1
    if rank is None:
        rank = distributed.get_rank() if initialised and distributed else 0
    num_replicas, rank = as_int("num_replicas", num_replicas), as_int("rank", rank)
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1; got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}); got {rank}")
    return num_replicas, rank
