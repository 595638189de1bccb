"""Keyed change application into Iceberg: flinkish.iceberg mode=upsert (merge-on-read position deletes)
next to pyiceberg's own ``Table.upsert`` + ``Table.delete`` (copy-on-write), on tables of 1 M and 10 M rows.

For each table size N (local disk, embedded SQLite catalog, no Spark -- the sink's prepare
and commit are called as Spark calls them, so what is measured is the sink, not Spark):

* two identical tables of N rows ``(id bigint, v string, n bigint)``, ids 0..N-1 in files
  of 1 M rows (what a snapshot load writes: key-clustered);
* epochs of ``--changes`` (10,000) changes: 80 % updates of random existing keys, 10 %
  inserts of new keys, 10 % deletes of random keys;
* **flinkish**: one task's ``prepare`` (check, resolve, write the rows) and the driver's
  ``commit`` (resolve the epoch, key lookup, position delete files, one snapshot). The first
  epoch after the start builds the key indexes (a cold driver process: O(table)); it is
  reported apart, the median is over the following ``--epochs``;
* **flinkish, no key index**: ``--noindex-epochs`` more epochs with the key index cache
  dropped before each (every epoch reads the key column of every candidate file again):
  what the index saves;
* **pyiceberg**: what a user writes by hand, the same changes: ``upsert`` of the updates
  and inserts (join on ``id``), then ``delete`` of the deleted keys (``In('id', ...)``) --
  both copy-on-write: every data file holding a changed key is rewritten.

Bytes written per epoch: everything new below the table's folder (data, delete, manifest,
manifest-list, metadata files), next to the epoch's changed rows alone written as one
snappy Parquet file. Targets (issue 17): per-epoch time grows <= 1.5x from 1 M to 10 M
rows; >= 10x faster than pyiceberg at 10 M; bytes within 3x of the changed rows.

    python benchmarks/keyed_iceberg.py [--sizes 1000000,10000000] [--epochs 10] [--pyiceberg-epochs 2] [--changes 10000]
        [--noindex-epochs 3]

The Delta rows of the same measurement are benchmarks/keyed_lakehouse.py.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

FILE_ROWS = 1_000_000


def base_rows(start: int, stop: int) -> Any:
    import numpy as np
    import pyarrow as pa

    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({"id": ids, "v": pa.array([f"v{i}" for i in range(start, stop)]), "n": ids % 1000})


def schema(with_changes: bool) -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = [StructField("id", LongType()), StructField("v", StringType()), StructField("n", LongType())]
    if with_changes:
        fields += [StructField("_op", StringType()), StructField("_lsn", LongType())]
    return StructType(fields)


def folder_bytes(path: str) -> dict[str, int]:
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[p] = os.path.getsize(p)
    return out


def changes(rng: Any, live: Any, next_id: int, count: int, epoch: int) -> tuple[Any, int]:
    """80 % updates, 10 % inserts, 10 % deletes; keys of updates/deletes drawn from the live keys."""
    import numpy as np
    import pyarrow as pa

    n_upd, n_ins = int(count * 0.8), int(count * 0.1)
    n_del = count - n_upd - n_ins
    picked = rng.choice(len(live), size=n_upd + n_del, replace=False)
    upd, dele = live[picked[:n_upd]], live[picked[n_upd:]]
    ins = np.arange(next_id, next_id + n_ins, dtype=np.int64)
    ids = np.concatenate([upd, ins, dele])
    ops = ["u"] * n_upd + ["c"] * n_ins + ["d"] * n_del
    t = pa.table({"id": ids, "v": pa.array([f"e{epoch}-{i}" for i in ids]), "n": ids % 1000 + epoch,
                  "_op": ops, "_lsn": np.arange(len(ids), dtype=np.int64) + epoch * 10 * count})
    return t.take(pa.array(rng.permutation(len(ids)))), next_id + n_ins


def changed_rows_bytes(t: Any) -> int:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(t.select(["id", "v", "n"]), buf, compression="snappy")
    return buf.tell()


def run_size(rows: int, epochs: int, py_epochs: int, count: int, root: str, noindex_epochs: int) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa
    from pyiceberg.expressions import In

    from flinkish_spark.connectors.iceberg import IcebergSink
    from flinkish_spark.sink.protocol import PrepareContext

    cp = os.path.join(root, f"n{rows}")
    ours = IcebergSink.at("db.ours", uid="bench", schema=schema(True), checkpoint=cp, mode="upsert", key="id",
                          deletes="true")
    loader = IcebergSink.at("db.ours", uid="load", schema=schema(False), checkpoint=cp)
    theirs_loader = IcebergSink.at("db.theirs", uid="load", schema=schema(False), checkpoint=cp)
    t0 = time.perf_counter()
    for sink in (loader, theirs_loader):
        prepared = []
        for i, start in enumerate(range(0, rows, FILE_ROWS)):
            batch = base_rows(start, min(rows, start + FILE_ROWS))
            prepared.append(sink.prepare(iter(batch.to_batches(max_chunksize=64 * 1024)), PrepareContext("load", 0, i, 0)))
        assert sink.commit(prepared, 0) == "COMMITTED"
    load_s = time.perf_counter() - t0
    theirs = ours.catalog().load_table("db.theirs")
    location = ours.table().location().removeprefix("file://")
    rng = np.random.default_rng(17)
    live = np.arange(rows, dtype=np.int64)
    next_id = rows
    flinkish: list[dict[str, Any]] = []
    noindex: list[dict[str, Any]] = []
    pyice: list[dict[str, Any]] = []
    from flinkish_spark.connectors.lakehouse.key_lookup import CACHE

    for e in range(1 + epochs + noindex_epochs):
        if e > epochs:
            CACHE.clear()
        t, next_id = changes(rng, live, next_id, count, e)
        before = folder_bytes(location)
        t0 = time.perf_counter()
        c = ours.prepare(iter(t.to_batches()), PrepareContext("bench", e, 0, 0))
        t1 = time.perf_counter()
        assert ours.commit([c], e) == "COMMITTED"
        t2 = time.perf_counter()
        after = folder_bytes(location)
        written = sum(size for p, size in after.items() if p not in before)
        (flinkish if e <= epochs else noindex).append({
            "epoch": e, "prepare_s": t1 - t0, "commit_s": t2 - t1, "total_s": t2 - t0, "bytes": written,
            "changed_bytes": changed_rows_bytes(t)})
        # the table's live keys after the epoch (for the next epoch's draws and pyiceberg's same changes)
        if e <= py_epochs - 1:
            ups = t.filter(pa.compute.not_equal(t["_op"], "d")).select(["id", "v", "n"])
            gone = t.filter(pa.compute.equal(t["_op"], "d"))["id"].to_pylist()
            tloc = theirs.location().removeprefix("file://")
            before = folder_bytes(tloc)
            t0 = time.perf_counter()
            theirs.upsert(ups.cast(theirs.schema().as_arrow()), join_cols=["id"])
            theirs.delete(In("id", gone))
            t1 = time.perf_counter()
            after = folder_bytes(tloc)
            pyice.append({"epoch": e, "total_s": t1 - t0, "bytes": sum(s for p, s in after.items() if p not in before),
                          "changed_bytes": changed_rows_bytes(t)})
            theirs = ours.catalog().load_table("db.theirs")
        deleted = t.filter(pa.compute.equal(t["_op"], "d"))["id"].to_numpy()
        inserted = t.filter(pa.compute.equal(t["_op"], "c"))["id"].to_numpy()
        live = np.concatenate([live[~np.isin(live, deleted)], inserted])
    # correctness: both tables hold the same rows after the epochs pyiceberg also ran
    count_ours = ours.catalog().load_table("db.ours").scan(selected_fields=("id",)).count()
    assert count_ours == len(live), (count_ours, len(live))
    shutil.rmtree(cp, ignore_errors=True)
    return {"rows": rows, "load_s": load_s, "flinkish": flinkish, "noindex": noindex, "pyiceberg": pyice}


def summary(result: dict[str, Any]) -> dict[str, float]:
    warm = result["flinkish"][1:]
    out = {
        "cold_first_epoch_s": result["flinkish"][0]["total_s"],
        "median_total_s": statistics.median(r["total_s"] for r in warm),
        "median_prepare_s": statistics.median(r["prepare_s"] for r in warm),
        "median_commit_s": statistics.median(r["commit_s"] for r in warm),
        "median_bytes": statistics.median(r["bytes"] for r in warm),
        "changed_bytes": statistics.median(r["changed_bytes"] for r in warm),
    }
    if result["noindex"]:
        out["noindex_median_s"] = statistics.median(r["total_s"] for r in result["noindex"])
    if result["pyiceberg"]:
        out["pyiceberg_median_s"] = statistics.median(r["total_s"] for r in result["pyiceberg"])
        out["pyiceberg_median_bytes"] = statistics.median(r["bytes"] for r in result["pyiceberg"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--pyiceberg-epochs", type=int, default=2)
    ap.add_argument("--changes", type=int, default=10_000)
    ap.add_argument("--noindex-epochs", type=int, default=3)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="flinkish-keyed-iceberg-")
    results = []
    try:
        for rows in [int(s) for s in args.sizes.split(",")]:
            print(f"-- {rows:,} rows", flush=True)
            results.append(run_size(rows, args.epochs, args.pyiceberg_epochs, args.changes, root, args.noindex_epochs))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = []
    sums = [summary(r) for r in results]
    for r, s in zip(results, sums):
        table.append([f"{r['rows']:,}", f"{s['cold_first_epoch_s'] * 1000:.0f}", f"{s['median_prepare_s'] * 1000:.0f}",
                      f"{s['median_commit_s'] * 1000:.0f}", f"{s['median_total_s'] * 1000:.0f}",
                      f"{s['median_bytes'] / 1e6:.2f}", f"{s['median_bytes'] / s['changed_bytes']:.2f}x",
                      f"{s.get('noindex_median_s', float('nan')) * 1000:.0f}",
                      f"{s.get('pyiceberg_median_s', float('nan')) * 1000:.0f}",
                      f"{s.get('pyiceberg_median_bytes', float('nan')) / 1e6:.1f}",
                      f"{s.get('pyiceberg_median_s', float('nan')) / s['median_total_s']:.0f}x"])
    print()
    print_table(["rows", "cold 1st epoch ms", "prepare ms", "commit ms", "epoch ms", "MB written", "vs changed rows",
                 "no-index epoch ms", "pyiceberg ms", "pyiceberg MB", "speed-up"], table)
    if len(sums) >= 2:
        print(f"\nper-epoch growth {results[0]['rows']:,} -> {results[-1]['rows']:,} rows: "
              f"{sums[-1]['median_total_s'] / sums[0]['median_total_s']:.2f}x (target <= 1.5x)")
    path = write_results("keyed_iceberg", {"changes_per_epoch": args.changes, "results": results, "summary": sums})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
