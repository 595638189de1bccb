"""Key lookup: changed keys -> (file, position) of live rows, with pruning, deleted rows and a cached index."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from flinkish_spark.connectors.lakehouse import key_lookup
from flinkish_spark.connectors.lakehouse.key_lookup import CandidateFile, KeyIndexCache, KeyLookup
from flinkish_spark.io.fileio import FileIO


def write(tmp_path: Path, name: str, table: pa.Table) -> str:
    path = str(tmp_path / name)
    pq.write_table(table, path)
    return path


def test_integer_keys_with_pruning_deleted_rows_and_a_warm_cache(tmp_path: Path) -> None:
    io = FileIO.for_url(str(tmp_path))
    files = []
    for i in range(4):
        ids = np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64)
        url = write(tmp_path, f"f{i}.parquet", pa.table({"id": ids[::-1].copy(), "v": ids}))  # unsorted file
        files.append(CandidateFile(f"f{i}", url, 0, int(ids[0]), int(ids[-1]),
                                   (lambda: np.array([0, 1], dtype=np.int64)) if i == 0 else None))
    lookup = KeyLookup(io, ("id",), cache=KeyIndexCache())
    keys = pa.table({"id": pa.array([998, 999, 2500, 5000], pa.int64())})
    found = lookup.find(keys, files)
    assert lookup.files_read == 2  # f1 and f3 are pruned by min/max
    # f0 holds 999 at position 0 and 998 at 1, both deleted already; f2 holds 2500 at position 499
    assert {f: (p.tolist(), k.tolist()) for f, (p, k) in found.by_file.items()} == {"f2": ([499], [2])}
    again = lookup.find(keys, files)
    assert lookup.files_read == 0 and again.by_file.keys() == found.by_file.keys()


def test_string_and_composite_keys_are_verified_against_hash_collisions(tmp_path: Path, monkeypatch) -> None:
    io = FileIO.for_url(str(tmp_path))
    table = pa.table({"a": ["x", "y", "x", "z"], "b": [1, 1, 2, 1], "v": [0, 1, 2, 3]})
    f = CandidateFile("f", write(tmp_path, "f.parquet", table), 0)
    lookup = KeyLookup(io, ("a", "b"), cache=KeyIndexCache())
    keys = pa.table({"a": ["x", "z"], "b": pa.array([2, 1], pa.int64())})
    assert {k: (p.tolist(), i.tolist()) for k, (p, i) in lookup.find(keys, [f]).by_file.items()} == {"f": ([2, 3], [0, 1])}
    # every key hashing to the same code: only the verification tells the rows apart
    real = key_lookup.key_codes
    monkeypatch.setattr(key_lookup, "key_codes", lambda cols: np.zeros(len(cols[0]), dtype=np.uint64)
                        if not key_lookup.exact_codes([c.type for c in cols]) else real(cols))
    collided = KeyLookup(io, ("a", "b"), cache=KeyIndexCache()).find(keys, [f])
    assert {k: (p.tolist(), i.tolist()) for k, (p, i) in collided.by_file.items()} == {"f": ([2, 3], [0, 1])}


def test_a_live_column_and_date_keys(tmp_path: Path) -> None:
    io = FileIO.for_url(str(tmp_path))
    days = [dt.date(2024, 1, d) for d in (1, 2, 2, 3)]
    f = CandidateFile("f", write(tmp_path, "f.parquet", pa.table({"d": days, "_current": [True, False, True, None]})), 0,
                      dt.date(2024, 1, 1), dt.date(2024, 1, 3))
    lookup = KeyLookup(io, ("d",), live_column="_current", cache=KeyIndexCache())
    found = lookup.find(pa.table({"d": [dt.date(2024, 1, 2), dt.date(2024, 1, 3)]}), [f])
    assert {k: p.tolist() for k, (p, _) in found.by_file.items()} == {"f": [2]}  # the closed version 1 and the null are not live
    assert lookup.find(pa.table({"d": [dt.date(2025, 1, 1)]}), [f]).by_file == {}
    assert lookup.files_read == 0  # pruned


def test_the_cache_is_bounded_in_bytes(tmp_path: Path) -> None:
    io = FileIO.for_url(str(tmp_path))
    cache = KeyIndexCache(max_bytes=3 * 8 * 1000)
    files = [CandidateFile(f"f{i}", write(tmp_path, f"f{i}.parquet", pa.table({"id": np.arange(1000, dtype=np.int64)})), i)
             for i in range(5)]
    lookup = KeyLookup(io, ("id",), cache=cache)
    lookup.find(pa.table({"id": pa.array([5], pa.int64())}), files)
    assert lookup.files_read == 5 and cache.nbytes <= 3 * 8 * 1000  # two of five indexes evicted
    lookup.find(pa.table({"id": pa.array([5], pa.int64())}), files)
    assert lookup.files_read == 2


def test_keys_stored_in_another_physical_type_are_found(tmp_path: Path) -> None:
    """A table file written by another writer may hold the key in another Arrow type than the query's:
    Spark's Parquet writer stores timestamps as INT96 (read back as nanoseconds), delta-rs and pyiceberg
    write strings as large_string. The rows are found all the same -- one key alone and in a composite key."""
    io = FileIO.for_url(str(tmp_path))
    utc = dt.timezone.utc
    stamps = [dt.datetime(2024, 1, 1, tzinfo=utc) + dt.timedelta(seconds=s, microseconds=7) for s in range(5)]
    path = str(tmp_path / "int96.parquet")
    pq.write_table(pa.table({"ts": pa.array(stamps, pa.timestamp("us", tz="UTC")),
                             "name": pa.array([f"k{i}" for i in range(5)], pa.large_string())}),
                   path, use_deprecated_int96_timestamps=True)
    assert pq.read_table(path).schema.field("ts").type.unit == "ns"  # what a reader gets back
    files = [CandidateFile("f", path, 0)]
    query = pa.table({"ts": pa.array([stamps[3]], pa.timestamp("us", tz="UTC"))})
    found = KeyLookup(io, ("ts",), cache=KeyIndexCache()).find(query, files)
    assert {f: p.tolist() for f, (p, _) in found.by_file.items()} == {"f": [3]}
    query = pa.table({"name": pa.array(["k2"], pa.string()), "ts": pa.array([stamps[2]], pa.timestamp("us", tz="UTC"))})
    found = KeyLookup(io, ("name", "ts"), cache=KeyIndexCache()).find(query, files)
    assert {f: p.tolist() for f, (p, _) in found.by_file.items()} == {"f": [2]}


def test_a_cache_smaller_than_the_candidates_indexes_reads_each_file_once_per_lookup(tmp_path: Path, monkeypatch) -> None:
    """When the indexes of one lookup's candidates do not fit the cache (a large table, or the cache
    off), each candidate file is still read once -- not again for the search and again for the
    hash verification after the cache evicted what the reader threads built."""
    io = FileIO.for_url(str(tmp_path))
    files = []
    for i in range(4):
        names = [f"k{j:05d}" for j in range(i * 100, (i + 1) * 100)]
        files.append(CandidateFile(f"f{i}", write(tmp_path, f"f{i}.parquet", pa.table({"name": names})), 0))
    reads: list[str] = []
    build = KeyLookup._build
    monkeypatch.setattr(KeyLookup, "_build", lambda self, f: reads.append(f.path) or build(self, f))
    lookup = KeyLookup(io, ("name",), cache=KeyIndexCache(max_bytes=0))
    found = lookup.find(pa.table({"name": ["k00007", "k00150", "k00399"]}), files)
    assert {f: p.tolist() for f, (p, _) in found.by_file.items()} == {"f0": [7], "f1": [50], "f3": [99]}
    assert sorted(reads) == ["f0", "f1", "f2", "f3"]
