"""indextar: random access to WebDataset-style tar shards."""
from ._version import __version__

__all__ = ["__version__"]
