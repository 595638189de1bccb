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
