"""indextar: random access to WebDataset-style tar shards.

An indexer scans uncompressed tar shards into one SQLite offset table per shard;
a map-style dataset then reads any sample with one seek.
"""

from ._version import __version__
from .errors import (
    CacheFullError,
    ChecksumMismatchError,
    CompressedShardError,
    ConvertError,
    DecodeError,
    DecodeSpecError,
    EncodeError,
    ExportError,
    IndexFormatError,
    IndextarError,
    IndexWriteError,
    JoinError,
    ManifestError,
    MissingAttributesError,
    MissingIndexError,
    PipeRefusedError,
    RemoteReadError,
    SampleAttributeError,
    SampleFormatError,
    SampleIndexError,
    SampleKeyError,
    SamplerStateError,
    SelectionError,
    ShardFormatError,
    ShardNotFoundError,
    StaleIndexError,
    TruncatedShardError,
    UnsafeMemberError,
    UnsupportedMemberError,
    WriterError,
)
from .index.attribute_import import import_attributes
from .index.build import build_indexes
from .index.manifest import append_to_manifest, read_manifest, write_manifest
from .index.meta import IndexMeta
from .index.naming import split_name
from .index.shard import ShardIndex, build_index, index_path, open_index
from .order.buckets import BucketBatchSampler
from .order.packing import PackPlan, plan_packs
from .order.readahead import ReadAheadBatches
from .order.sampler import ResumableSampler
from .read.dataset import IndexedTarDataset
from .read.encoded import EncodedBatch, encoded_collate
from .read.gpu import ImageStage
from .read.image import image_decoder
from .read.joined import JoinedDataset
from .read.mixture import MixtureDataset
from .read.packed import Pack, PackedDataset, collate_packs
from .read.pooled import pooled_collate
from .read.selection import bucket_ids
from .read.staged import StagedLoader, StageTimings, on_gpu
from .read.subset import KeySubset
from .source.patterns import expand_shards
from .tar.scan import TarScan, scan_tar
from .write.convert import ConvertResult, convert
from .write.export_parquet import export_parquet
from .write.shardwriter import ShardWriter
from .write.sidecar import SidecarShard, write_sidecar
from .write.tarwriter import TarWriter

__all__ = [
    "__version__",
    # indexing
    "build_index",
    "open_index",
    "index_path",
    "ShardIndex",
    "IndexMeta",
    "scan_tar",
    "TarScan",
    "split_name",
    "expand_shards",
    "build_indexes",
    "import_attributes",
    # reading
    "IndexedTarDataset",
    "StreamingTarDataset",
    "MixtureDataset",
    "KeySubset",
    "JoinedDataset",
    "image_decoder",
    # decoding on the GPU
    "on_gpu",
    "encoded_collate",
    "ImageStage",
    "EncodedBatch",
    "StageTimings",
    "StagedLoader",
    "write_manifest",
    "read_manifest",
    "append_to_manifest",
    "bucket_ids",
    # packing
    "PackedDataset",
    "Pack",
    "collate_packs",
    "pooled_collate",
    "plan_packs",
    "PackPlan",
    # sampling
    "ResumableSampler",
    "BucketBatchSampler",
    "ReadAheadBatches",
    # writing
    "TarWriter",
    "ShardWriter",
    "convert",
    "ConvertResult",
    "export_parquet",
    "write_sidecar",
    "SidecarShard",
    # errors
    "IndextarError",
    "ShardFormatError",
    "TruncatedShardError",
    "ChecksumMismatchError",
    "CompressedShardError",
    "UnsupportedMemberError",
    "SampleFormatError",
    "IndexFormatError",
    "StaleIndexError",
    "MissingIndexError",
    "ShardNotFoundError",
    "IndexWriteError",
    "SamplerStateError",
    "DecodeError",
    "UnsafeMemberError",
    "DecodeSpecError",
    "SampleKeyError",
    "SampleIndexError",
    "ManifestError",
    "WriterError",
    "EncodeError",
    "ExportError",
    "ConvertError",
    "RemoteReadError",
    "PipeRefusedError",
    "CacheFullError",
    "SampleAttributeError",
    "SelectionError",
    "MissingAttributesError",
    "JoinError",
]


def __getattr__(name: str) -> object:
    # StreamingTarDataset subclasses torch's IterableDataset: import torch only when asked.
    if name == "StreamingTarDataset":
        from .read.streaming import StreamingTarDataset

        return StreamingTarDataset
    raise AttributeError(f"module 'indextar' has no attribute {name!r}")
