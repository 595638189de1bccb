"""What one Delta version costs delta-rs itself, per table, on this machine: the reference for the routed sink's commit.

N tables of 3 rows; per epoch every table gets one version -- ``create_write_transaction`` of one ``add`` action
(a file name only: no Parquet written) with an app transaction, after ``update_incremental`` (what a writer of a
table another process may have changed must do), the table objects kept open across epochs (warm, as the sink's
caches are). ``--append`` also times ``write_deltalake(mode="append")`` of the 3 rows (Parquet file included).

    python benchmarks/delta_rs_commit.py [--tables 300] [--epochs 6] [--append]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402


def main() -> None:
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction, CommitProperties, Transaction

    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--name", default="delta_rs_commit")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="delta-rs-commit-")
    try:
        data = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "v": pa.array([1, 2, 3], pa.int64()), "s": ["a", "b", "c"]})
        for i in range(args.tables):
            write_deltalake(f"{root}/t{i}", data)
        tables = [DeltaTable(f"{root}/t{i}") for i in range(args.tables)]
        schema = tables[0].schema()
        rows = []
        for e in range(1, args.epochs + 1):
            t0 = time.perf_counter()
            for t in tables:
                t.update_incremental()
                add = AddAction(f"f{e}.parquet", 1000, {}, int(time.time() * 1000), True, '{"numRecords":3}')
                t.create_write_transaction([add], "append", schema,
                                           commit_properties=CommitProperties(app_transactions=[Transaction("bench", e)]))
            row = {"epoch": e, "commit_ms_per_table": round((time.perf_counter() - t0) / args.tables * 1000, 2)}
            if args.append:
                t0 = time.perf_counter()
                for t in tables:
                    write_deltalake(t, data, mode="append")
                row["append_ms_per_table"] = round((time.perf_counter() - t0) / args.tables * 1000, 2)
            row["load"] = os.getloadavg()[0]
            print(row, flush=True)
            rows.append(row)
        print("wrote", write_results(args.name, {"args": vars(args), "epochs": rows}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
