"""Storage access for metadata and data: a small FileIO over fsspec (local, memory, S3)."""

from flinkish_spark.io.fileio import FileIO, storage_options_from

__all__ = ["FileIO", "storage_options_from"]
