"""The multi-table ``flinkish.postgres`` source at 10, 100 and 1,000 tables: what an epoch costs as the count grows.

On an embedded PostgreSQL, N small tables (``bench.t_<i>``: id int primary key, v int, s text;
``--rows`` rows each) are mirrored by one source (``tables = 'bench.*'``). The source's
driver side (``latestOffset``, ``partitions``, the checkpoint-complete notification) and its
reader run in this process through the same ``SplitStreamReader`` Spark calls -- no JVM, so
the figures are the source's own cost, not Spark's scheduling. First the initial snapshot
(every table's chunks), then ``--epochs`` epochs one second apart while a writer process
updates ``--rate`` rows/s spread over all N tables (5 rows of 5 random tables per
transaction). Per epoch: ``latestOffset`` time (it includes the previous epoch's
notification: the slot advance), reading the epoch's change range, the bytes of the
checkpoint file written, registry bytes written, change rows and distinct tables changed. Last,
a backlog of ``--burst`` changed rows over all tables read as one epoch: the change rows/s.
Targets (issue 18): at 1,000 tables the per-epoch overhead stays under 1 s, and metadata per
epoch grows with the tables changed in it, not with all tables.

    python benchmarks/multi_table_source.py [--tables 10,100,1000] [--epochs 15] [--rate 1000] [--rows 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import per_table_count, print_table, write_results  # noqa: E402

WRITER = r'''
import random, sys, time, psycopg
url, tables, rate, stop_file = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
import os
rnd = random.Random(1)
with psycopg.connect(url, autocommit=True) as conn:
    t0, done = time.time(), 0
    while not os.path.exists(stop_file):
        with conn.transaction():
            for _ in range(5):
                conn.execute(f"UPDATE bench.t_{rnd.randrange(tables):05d} SET v = v + 1 WHERE id = %s", (rnd.randint(1, ROWS),))
        done += 5
        ahead = done / rate - (time.time() - t0)
        if ahead > 0:
            time.sleep(ahead)
'''


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def create_tables(url: str, n: int, rows: int, v_type: str = "int") -> None:
    """Schema ``bench`` (dropped first) with ``bench.t_00000`` ... of ``rows`` rows each: (id int primary key, v, s text)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench CASCADE")
        conn.execute("CREATE SCHEMA bench")
        conn.execute(f"""DO $$ BEGIN FOR i IN 0..{n - 1} LOOP
            EXECUTE format('CREATE TABLE bench.t_%s (id int PRIMARY KEY, v {v_type}, s text)', lpad(i::text, 5, '0'));
            EXECUTE format('INSERT INTO bench.t_%s SELECT g, 0, ''row '' || g FROM generate_series(1, {rows}) g',
                           lpad(i::text, 5, '0'));
            END LOOP; END $$""")


def run_one(url: str, n: int, args: argparse.Namespace, work: str) -> dict[str, Any]:
    import psycopg
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from flinkish_spark.connectors.postgres.rows import stream_schema
    from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource

    create_tables(url, n, args.rows)
    meta = os.path.join(work, f"meta-{n}")
    src = PostgresSourceDataSource({"uid": f"bench{n}", "checkpoint": meta, "url": url, "tables": "bench.*",
                                    "retainCheckpoints": "1000", "discoveryInterval": "10"})
    reader = src.streamReader(stream_schema())
    store = src.checkpoint_store()

    def epoch(start: dict) -> tuple[dict, float, float, int, set[str]]:
        t0 = time.perf_counter()
        end = reader.latestOffset(start, ReadAllAvailable())
        t1 = time.perf_counter()
        rows, tables = 0, set()
        for p in reader.partitions(start, end):
            for b in reader.read(p):
                rows += b.num_rows
                tables.update(t for t, op in zip(b.column("_table").to_pylist(), b.column("_op").to_pylist()) if op != "s")
        reader.commit(end)
        return end, t1 - t0, time.perf_counter() - t1, rows, tables

    start = reader.initialOffset()
    t0 = time.perf_counter()
    snapshot_epochs = 0
    while True:  # the initial snapshot, then the epoch that hands out the change split
        end, _, _, _, _ = epoch(start)
        snapshot_epochs += 1
        done = end == start
        start = end
        if done or any(s.split_id.startswith("changes-") for s in store.latest().splits):  # type: ignore[union-attr]
            break
    snapshot_s = time.perf_counter() - t0
    registry_dir = os.path.join(store.directory, "tables")

    def registry_bytes() -> int:
        return sum(os.path.getsize(os.path.join(registry_dir, f)) for f in os.listdir(registry_dir))

    stop_file = os.path.join(work, f"stop-{n}")
    writer = subprocess.Popen([sys.executable, "-c", WRITER.replace("ROWS", str(args.rows)), url, str(n), str(args.rate), stop_file])
    per_epoch = []
    try:
        time.sleep(1.0)
        for _ in range(args.epochs):
            tick = time.monotonic()
            before_ckpt, before_reg = store.ids()[-1], registry_bytes()
            start, lo, rd, rows, tables = epoch(start)
            after = store.ids()[-1]
            ckpt_bytes = os.path.getsize(store.path(after)) if after != before_ckpt else 0
            per_epoch.append({"latest_offset_s": lo, "read_s": rd, "rows": rows, "tables_changed": len(tables),
                              "checkpoint_bytes": ckpt_bytes, "registry_bytes_written": registry_bytes() - before_reg})
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    finally:
        open(stop_file, "w").close()
        writer.wait(timeout=60)
    # Throughput: a backlog of --burst changes over all tables (1,000-row transactions), read as one epoch.
    with psycopg.connect(url, autocommit=True) as conn:
        done = 0
        while done < args.burst:
            conn.execute(f"UPDATE bench.t_{done // args.rows % n:05d} SET v = v + 1")
            done += args.rows
    burst_end, _, burst_read, burst_rows, burst_tables = epoch(start)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SELECT pg_drop_replication_slot('flinkish_bench{n}')")
        conn.execute(f"DROP PUBLICATION flinkish_bench{n}")
    lo = [e["latest_offset_s"] for e in per_epoch]
    rd = [e["read_s"] for e in per_epoch]
    rows = sum(e["rows"] for e in per_epoch)
    return {
        "tables": n, "snapshot_s": round(snapshot_s, 2), "snapshot_epochs": snapshot_epochs,
        "latest_offset_ms_p50": round(1000 * statistics.median(lo), 1), "latest_offset_ms_max": round(1000 * max(lo), 1),
        "read_ms_p50": round(1000 * statistics.median(rd), 1),
        "checkpoint_bytes_per_epoch": round(statistics.median(e["checkpoint_bytes"] for e in per_epoch)),
        "registry_bytes_per_epoch": round(statistics.mean(e["registry_bytes_written"] for e in per_epoch)),
        "registry_bytes_total": registry_bytes(),
        "tables_changed_per_epoch": round(statistics.median(e["tables_changed"] for e in per_epoch)),
        "change_rows_per_epoch": round(rows / len(per_epoch)),
        "steady_read_rows_per_s": round(rows / sum(rd)) if sum(rd) else 0,
        "burst_rows": burst_rows, "burst_tables": len(burst_tables), "burst_read_s": round(burst_read, 2),
        "burst_read_rows_per_s": round(burst_rows / burst_read) if burst_read else 0,
        "epochs": per_epoch,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default="10,100,1000")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--rows", type=int, default=10)
    ap.add_argument("--burst", type=int, default=50_000)
    args = ap.parse_args()

    def one(url: str, n: int, work: str) -> dict[str, Any]:
        r = run_one(url, n, args, work)
        print(f"{n} tables: latestOffset p50 {r['latest_offset_ms_p50']} ms, checkpoint {r['checkpoint_bytes_per_epoch']} B",
              flush=True)
        return r

    results = per_table_count(args.tables, "flinkish-bench-multi-", one)
    print(f"\nmulti-table source, {args.rows} rows per table, {args.rate:.0f} changed rows/s over all tables, "
          f"{args.epochs} one-second epochs\n")
    print_table(
        ["tables", "snapshot s", "latestOffset ms p50 / max", "read ms p50", "checkpoint B/epoch",
         "registry B/epoch", "tables changed/epoch", "change rows/epoch", "backlog read rows/s"],
        [(r["tables"], r["snapshot_s"], f"{r['latest_offset_ms_p50']} / {r['latest_offset_ms_max']}", r["read_ms_p50"],
          r["checkpoint_bytes_per_epoch"], r["registry_bytes_per_epoch"], r["tables_changed_per_epoch"],
          r["change_rows_per_epoch"], f"{r['burst_read_rows_per_s']:,}") for r in results],
    )
    print("\nwrote", write_results("multi_table_source", {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
