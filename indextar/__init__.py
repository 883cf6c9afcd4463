"""indextar: random access to WebDataset-style tar shards."""
from ._version import __version__
from .sampler import ResumableSampler

__all__ = ["__version__", "ResumableSampler"]
