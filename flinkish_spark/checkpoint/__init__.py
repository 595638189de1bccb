"""Checkpoint metadata: the model, its versioned Arrow/Parquet serde, layout, store and retention."""

from flinkish_spark.checkpoint.model import SourceCheckpoint, SourceStatus, SplitRecord
from flinkish_spark.checkpoint.serde import FORMAT_VERSION, decode_source_checkpoint, encode_source_checkpoint
from flinkish_spark.checkpoint.store import SourceCheckpointStore

__all__ = [
    "FORMAT_VERSION",
    "SourceCheckpoint",
    "SourceCheckpointStore",
    "SourceStatus",
    "SplitRecord",
    "decode_source_checkpoint",
    "encode_source_checkpoint",
]
