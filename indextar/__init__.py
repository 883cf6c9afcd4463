"""indextar: random access to WebDataset-style tar shards.

An indexer scans uncompressed tar shards into one SQLite offset table per shard;
a map-style dataset then reads any sample with one seek.
"""

from ._version import __version__
from .errors import (
    CompressedShardError,
    IndexFormatError,
    IndextarError,
    IndexWriteError,
    MissingIndexError,
    SampleFormatError,
    SamplerStateError,
    ShardFormatError,
    ShardNotFoundError,
    StaleIndexError,
    TruncatedShardError,
    UnsupportedMemberError,
)
from .index import IndexMeta, SampleTable, ShardIndex, build_index, index_path, open_index
from .naming import split_name
from .patterns import expand_shards
from .sampler import ResumableSampler
from .tarscan import TarScan, scan_tar

__all__ = [
    "__version__",
    # indexing
    "build_index",
    "open_index",
    "index_path",
    "ShardIndex",
    "IndexMeta",
    "SampleTable",
    "scan_tar",
    "TarScan",
    "split_name",
    "expand_shards",
    # sampling
    "ResumableSampler",
    # errors
    "IndextarError",
    "ShardFormatError",
    "TruncatedShardError",
    "CompressedShardError",
    "UnsupportedMemberError",
    "SampleFormatError",
    "IndexFormatError",
    "StaleIndexError",
    "MissingIndexError",
    "ShardNotFoundError",
    "IndexWriteError",
    "SamplerStateError",
]
