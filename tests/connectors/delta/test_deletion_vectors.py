"""The deletion vector codec and file, checked against Delta's protocol examples and read back by delta-rs."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flinkish_spark.connectors.delta.deletion_vectors import (
    Descriptor, DvFileWriter, decode_bitmap, encode_bitmap, read_vector, z85_decode, z85_encode,
)
from flinkish_spark.connectors.delta.log import DeltaLog
from flinkish_spark.connectors.delta.state import load_state
from flinkish_spark.errors import CorruptMetadataError
from flinkish_spark.io.fileio import FileIO

deltalake = pytest.importorskip("deltalake")
pyroaring = pytest.importorskip("pyroaring")


def test_the_protocols_inline_examples_decode_to_their_rows() -> None:
    """PROTOCOL.md, "JSON Example 3 - Inline": rows 3, 4, 7, 11, 18, 29 -- written in the older "native"
    format; delta-kernel-rs's own test vector holds the same rows in the portable format we write."""
    native = Descriptor.from_json({"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
                                   "sizeInBytes": 40, "cardinality": 6})
    assert read_vector(native, None).tolist() == [3, 4, 7, 11, 18, 29]
    portable = Descriptor.from_json({"storageType": "i", "pathOrInlineDv": "^Bg9^0rr910000000000iXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
                                     "sizeInBytes": 44, "cardinality": 6})
    assert read_vector(portable, None).tolist() == [3, 4, 7, 11, 18, 29]
    assert encode_bitmap(np.array([3, 4, 7, 11, 18, 29])) == z85_decode(portable.path_or_inline)[:44]


def test_the_protocols_relative_path_example() -> None:
    """PROTOCOL.md, "JSON Example 1": prefix 'ab', the UUID d2c639aa-... in Z85."""
    d = Descriptor.from_json({"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4,
                              "sizeInBytes": 40, "cardinality": 6})
    assert d.relative_file() == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert z85_encode(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes) == "^-aqEH.-t@S}K{vb[*k^"
    assert d.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"


def test_bitmaps_round_trip_across_32_bit_buckets_as_pyroaring_writes_them() -> None:
    for positions in ([], [0], list(range(0, 200_000, 3)), [5, 2**32 - 1, 2**32, 2**32 + 7, 3 * 2**32]):
        data = encode_bitmap(np.array(positions, dtype=np.int64))
        assert decode_bitmap(data).tolist() == positions
        assert pyroaring.BitMap64.deserialize(data[4:]) == pyroaring.BitMap64(positions)
    with pytest.raises(CorruptMetadataError, match="magic number"):
        decode_bitmap(b"\0\0\0\0" + pyroaring.BitMap64([1]).serialize())


def _append(path: str, ids: range) -> None:
    deltalake.write_deltalake(path, pa.table({"id": pa.array(list(ids), pa.int64())}), mode="append")


def test_vectors_written_here_are_applied_by_delta_rs(tmp_path: Path) -> None:
    """One DV file below a sub-folder prefix (two vectors, one of 33,334 rows), one inline vector;
    delta-rs's scan() and deletion_vectors() apply them, also after a delta-rs checkpoint, and a
    state loaded from that checkpoint names the same vectors."""
    path = str(tmp_path / "t")
    deltalake.DeltaTable.create(path, pa.schema([("id", pa.int64())]), configuration={"delta.enableDeletionVectors": "true"})
    _append(path, range(0, 100_000))
    _append(path, range(100_000, 100_010))
    _append(path, range(200_000, 202_000))
    io = FileIO.for_url(path)
    state = load_state(DeltaLog(io, path), 10)
    files = sorted(state.files.values(), key=lambda f: f.num_records or 0)
    medium, small, big = files  # 10, 2,000 and 100,000 rows
    deleted = {big.path: np.arange(0, 100_000, 3), medium.path: np.array([0, 9]), small.path: np.arange(0, 2_000, 2)}
    writer = DvFileWriter("flinkish/u/e000000000001", uuid.uuid4())
    now = int(time.time() * 1000)
    actions = []
    descriptors = {}
    for f in files:
        d = writer.add(deleted[f.path])
        descriptors[f.path] = d
        actions += [f.remove_action(now), f.add_action(d)]
    assert descriptors[medium.path].storage_type == "i"  # 2 rows: inline
    assert descriptors[big.path].storage_type == "u" and descriptors[small.path].storage_type == "u"
    assert descriptors[small.path].offset == 1 + 4 + descriptors[big.path].size + 4 or descriptors[big.path].offset == 1 + 4 + descriptors[small.path].size + 4
    io.write_bytes(f"{path}/{writer.relative_path}", writer.bytes())
    payload = "\n".join(json.dumps(a) for a in [{"commitInfo": {"timestamp": now, "operation": "DELETE"}}, *actions])
    (tmp_path / "t" / "_delta_log" / f"{state.version + 1:020d}.json").write_text(payload + "\n")

    expected = set(range(100_000)) - set(range(0, 100_000, 3)) | {i for i in range(100_000, 100_010) if i not in (100_000, 100_009)} \
        | set(range(200_001, 202_000, 2))

    def check(table) -> None:
        assert set(pa.table(table.scan()).column("id").to_pylist()) == expected
        vectors = {r["filepath"].split("/")[-1]: r["selection_vector"] for r in pa.table(table.deletion_vectors()).to_pylist()}
        for f in files:
            keep = np.ones(f.num_records or 0, dtype=bool)
            keep[deleted[f.path]] = False
            assert vectors[f.path.split("/")[-1]] == keep.tolist()

    check(deltalake.DeltaTable(path))
    assert (tmp_path / "t" / "flinkish" / "u" / "e000000000001" / writer.relative_path.rsplit("/", 1)[1]).exists()
    deltalake.DeltaTable(path).create_checkpoint()
    check(deltalake.DeltaTable(path))
    again = load_state(DeltaLog(io, path), 100)  # from the checkpoint delta-rs wrote
    assert {p: f.dv for p, f in again.files.items()} == descriptors

    def read_range(where: str, start: int, end: int) -> bytes:
        return (tmp_path / "t" / where).read_bytes()[start:end]

    for f in files:
        assert read_vector(descriptors[f.path], read_range).tolist() == deleted[f.path].tolist()
    # a damaged file is a clear error, not wrong rows
    damaged = bytearray((tmp_path / "t" / writer.relative_path).read_bytes())
    damaged[-1] ^= 0xFF
    (tmp_path / "t" / writer.relative_path).write_bytes(bytes(damaged))
    last = max((descriptors[p] for p in (big.path, small.path)), key=lambda d: d.offset or 0)
    with pytest.raises(CorruptMetadataError, match="CRC-32"):
        read_vector(last, read_range)


def test_union_positions_is_union1d() -> None:
    from flinkish_spark.connectors.delta.deletion_vectors import union_positions

    rng = np.random.default_rng(4)
    cases = [(np.zeros(0, np.int64), np.zeros(0, np.int64)), (np.zeros(0, np.int64), np.array([5, 1, 5])),
             (np.array([3, 2**40]), np.array([1]))]  # far positions: the union1d fallback
    cases += [(np.unique(rng.integers(0, 10_000, n)), np.unique(rng.integers(0, 10_000, m))) for n, m in ((0, 50), (3000, 2000))]
    for a, b in cases:
        got = union_positions(a, b)
        assert got.dtype == np.int64 and got.tolist() == np.union1d(a, b).tolist()
