"""Versioned Arrow/Parquet serialisation of source checkpoints.

Format (version 1): one Parquet file per source per epoch, one row per split,
with the columns of :data:`SPLIT_SCHEMA`, and the checkpoint-level fields in
the Arrow schema metadata under ``flinkish.*`` keys, ``flinkish.format_version``
among them.

Evolution rule: a new field is a new column (or metadata key) with a default in
:data:`COLUMN_DEFAULTS`, and ``FORMAT_VERSION`` goes up by one. Readers accept
every version up to their own and fill missing columns with the default; a file
from a newer version is refused with an error naming both versions. There is
one decoder for all versions; no serializer subclass per version.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.errors import (
    CorruptMetadataError,
    ForeignMetadataError,
    UnsupportedFormatVersionError,
)

FORMAT_VERSION = 1
MAGIC_KEY = b"flinkish.format_version"
KIND_KEY = b"flinkish.file_kind"
SOURCE_FILE_KIND = b"source-checkpoint"

SPLIT_SCHEMA = pa.schema(
    [
        pa.field("split_id", pa.string(), nullable=False),
        pa.field("start", pa.int64(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("end", pa.int64()),
        pa.field("finished", pa.bool_(), nullable=False),
        pa.field("finished_in", pa.int64()),
        pa.field("payload", pa.string()),
    ]
)

# Columns added after version 1 go here with the value older files imply.
COLUMN_DEFAULTS: dict[str, Any] = {"end": None, "finished_in": None, "payload": None}


def encode_source_checkpoint(ckpt: SourceCheckpoint) -> bytes:
    splits = ckpt.splits
    table = pa.table(
        {
            "split_id": pa.array([s.split_id for s in splits], pa.string()),
            "start": pa.array([s.start for s in splits], pa.int64()),
            "position": pa.array([s.position for s in splits], pa.int64()),
            "end": pa.array([s.end for s in splits], pa.int64()),
            "finished": pa.array([s.finished for s in splits], pa.bool_()),
            "finished_in": pa.array([s.finished_in for s in splits], pa.int64()),
            "payload": pa.array([s.payload for s in splits], pa.string()),
        },
        schema=SPLIT_SCHEMA,
    )
    metadata = {
        MAGIC_KEY: str(FORMAT_VERSION).encode(),
        KIND_KEY: SOURCE_FILE_KIND,
        b"flinkish.uid": ckpt.uid.encode(),
        b"flinkish.source_kind": ckpt.kind.encode(),
        b"flinkish.ckpt_id": str(ckpt.ckpt_id).encode(),
        b"flinkish.parent_id": b"" if ckpt.parent_id is None else str(ckpt.parent_id).encode(),
        b"flinkish.created_ms": str(ckpt.created_ms).encode(),
        b"flinkish.config": ckpt.config.encode(),
        b"flinkish.no_more_splits": b"1" if ckpt.no_more_splits else b"0",
        b"flinkish.status": ckpt.status.encode(),
        b"flinkish.enumerator_state": ckpt.enumerator_state,
    }
    buf = io.BytesIO()
    # Dictionary + zstd keep 100k mostly-finished splits well under a megabyte.
    # store_schema=False + explicit key-value metadata: otherwise pyarrow stores the
    # metadata a second time, base64-encoded, inside its ARROW:schema entry.
    writer = pq.ParquetWriter(buf, SPLIT_SCHEMA, compression="zstd", use_dictionary=True, store_schema=False)
    writer.write_table(table)
    writer.add_key_value_metadata(metadata)
    writer.close()
    return buf.getvalue()


def read_format_version(metadata: dict[bytes, bytes] | None, path: str) -> int:
    if not metadata or MAGIC_KEY not in metadata:
        raise ForeignMetadataError(
            f"{path} is a Parquet file but not flinkish checkpoint metadata (no "
            f"'{MAGIC_KEY.decode()}' key). Point the 'checkpoint' option at a directory "
            "used only by flinkish_spark."
        )
    try:
        version = int(metadata[MAGIC_KEY])
    except ValueError:
        raise CorruptMetadataError(f"{path}: format_version {metadata[MAGIC_KEY]!r} is not a number") from None
    if version > FORMAT_VERSION:
        raise UnsupportedFormatVersionError(
            f"{path} has metadata format_version {version}, but this flinkish_spark reads "
            f"versions up to {FORMAT_VERSION}. Upgrade flinkish_spark to read this checkpoint."
        )
    if version < 1:
        raise CorruptMetadataError(f"{path}: format_version {version} is not valid")
    return version


def decode_source_checkpoint(data: bytes, path: str) -> SourceCheckpoint:
    """Decode one checkpoint file; every failure names ``path``."""
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
        # The footer's key-value metadata, not the Arrow schema's: files are written
        # without the ARROW:schema copy (store_schema=False).
        footer_md = parquet.metadata.metadata
        table = parquet.read()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        if len(data) >= 4 and data[:4] == b"PAR1":
            raise CorruptMetadataError(
                f"{path} is truncated or corrupt ({exc}). Restore it from a backup, or remove the "
                "checkpoint directory to start over."
            ) from None
        raise CorruptMetadataError(
            f"{path} is not a Parquet file ({len(data)} bytes). The checkpoint directory may hold a "
            "foreign or damaged file; remove it or point 'checkpoint' elsewhere."
        ) from None
    md = dict(footer_md or {})
    read_format_version(md, path)
    if md.get(KIND_KEY) != SOURCE_FILE_KIND:
        raise ForeignMetadataError(f"{path} is flinkish metadata of kind {md.get(KIND_KEY)!r}, not a source checkpoint")
    try:
        columns = {name: table.column(name).to_pylist() for name in table.column_names}
        n = table.num_rows
        for name, default in COLUMN_DEFAULTS.items():
            columns.setdefault(name, [default] * n)
        splits = tuple(
            SplitRecord(
                split_id=columns["split_id"][i],
                start=columns["start"][i],
                position=columns["position"][i],
                end=columns["end"][i],
                finished=bool(columns["finished"][i]),
                finished_in=columns["finished_in"][i],
                payload=columns["payload"][i],
            )
            for i in range(n)
        )
        parent = md[b"flinkish.parent_id"]
        return SourceCheckpoint(
            uid=md[b"flinkish.uid"].decode(),
            kind=md[b"flinkish.source_kind"].decode(),
            ckpt_id=int(md[b"flinkish.ckpt_id"]),
            parent_id=int(parent) if parent else None,
            created_ms=int(md[b"flinkish.created_ms"]),
            config=md[b"flinkish.config"].decode(),
            enumerator_state=md.get(b"flinkish.enumerator_state", b""),
            no_more_splits=md[b"flinkish.no_more_splits"] == b"1",
            splits=splits,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptMetadataError(f"{path}: required field missing or invalid ({exc!r})") from None
