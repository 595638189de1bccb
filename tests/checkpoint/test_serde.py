"""Versioned serde: round trips, kept fixtures of every version, and every bad-file error."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.serde import (
    FORMAT_VERSION,
    MAGIC_KEY,
    decode_source_checkpoint,
    encode_source_checkpoint,
)
from flinkish_spark.errors import CorruptMetadataError, ForeignMetadataError, UnsupportedFormatVersionError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "checkpoint"


def sample_checkpoint() -> SourceCheckpoint:
    """The checkpoint every versioned fixture encodes (tests/fixtures/checkpoint/make_fixtures.py)."""
    return SourceCheckpoint(
        uid="orders",
        kind="flinkish.files",
        ckpt_id=17,
        parent_id=16,
        created_ms=1_700_000_000_000,
        config='{"bounded": true, "format": "parquet", "path": "s3://b/in"}',
        enumerator_state=b'{"cleaned_through": 15, "discovered_once": true}',
        no_more_splits=True,
        splits=(
            SplitRecord("s3://b/in/a.parquet", 1, 1, 1, True, 3, None),
            SplitRecord("s3://b/in/b.parquet", 0, 1, 1, True, 17, "meta-b"),
            SplitRecord("s3://b/in/c.parquet", 0, 0, 1, False, None, "meta-c"),
        ),
    )


def test_round_trip() -> None:
    ckpt = sample_checkpoint()
    assert decode_source_checkpoint(encode_source_checkpoint(ckpt), "x") == ckpt
    assert ckpt.status == "PARTIALLY_FINISHED"


@pytest.mark.parametrize("version", range(1, FORMAT_VERSION + 1))
def test_every_kept_version_fixture_reads(version: int) -> None:
    path = FIXTURES / f"v{version}" / "source-checkpoint.parquet"
    assert path.exists(), f"keep a fixture for format version {version} (run make_fixtures.py)"
    assert decode_source_checkpoint(path.read_bytes(), str(path)) == sample_checkpoint()


def _rewrite_metadata(data: bytes, **changes: bytes) -> bytes:
    table = pq.read_table(io.BytesIO(data))
    md = dict(table.schema.metadata)
    md.update({k.encode(): v for k, v in changes.items()})
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(md), buf)
    return buf.getvalue()


def test_newer_version_is_refused_naming_both_versions() -> None:
    data = _rewrite_metadata(encode_source_checkpoint(sample_checkpoint()), **{MAGIC_KEY.decode(): b"99"})
    with pytest.raises(UnsupportedFormatVersionError) as err:
        decode_source_checkpoint(data, "meta/sources/orders/000000000017.parquet")
    msg = str(err.value)
    assert "format_version 99" in msg and f"up to {FORMAT_VERSION}" in msg
    assert "000000000017.parquet" in msg


def test_truncated_file_names_the_file() -> None:
    data = encode_source_checkpoint(sample_checkpoint())
    with pytest.raises(CorruptMetadataError, match=r"cut\.parquet is truncated or corrupt"):
        decode_source_checkpoint(data[: len(data) // 2], "cut.parquet")


def test_non_parquet_file_names_the_file() -> None:
    with pytest.raises(CorruptMetadataError, match=r"notes\.parquet is not a Parquet file"):
        decode_source_checkpoint(b"hello, I am a text file\n", "notes.parquet")


def test_foreign_parquet_file_is_refused() -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"a": [1, 2]}), buf)
    with pytest.raises(ForeignMetadataError, match=r"other\.parquet is a Parquet file but not flinkish"):
        decode_source_checkpoint(buf.getvalue(), "other.parquet")


def test_100k_splits_with_99k_finished_stay_under_1mb() -> None:
    splits = [
        SplitRecord(f"s3://bucket/input/2026/11/22/part-{i:06d}.parquet", 1, 1, 1, True, i // 100, None)
        for i in range(99_000)
    ] + [
        SplitRecord(f"s3://bucket/input/2026/11/22/part-{i:06d}.parquet", 0, 0, 1, False, None, None)
        for i in range(99_000, 100_000)
    ]
    ckpt = SourceCheckpoint("u", "flinkish.files", 5000, 4999, 0, "{}", b"", False, tuple(splits))
    data = encode_source_checkpoint(ckpt)
    assert len(data) < 1_000_000, f"{len(data)} bytes"
    assert decode_source_checkpoint(data, "big").splits[-1] == splits[-1]
