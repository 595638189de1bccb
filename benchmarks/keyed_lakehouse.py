"""Keyed change application into Delta: flinkish.delta mode=upsert (deletion vectors) vs delta-rs merge.

1. **Per-epoch cost** (no Spark; local disk by default, ``--s3`` for moto S3 in its own
   process): a table of N rows (``--sizes``, default 1 M and 10 M; id bigint sorted into
   files of 1 M rows, v string, n int, ts timestamp), then epochs of ``--changes`` changes
   (default 10,000: 80 % updates of random live keys, 10 % inserts of new keys, 10 %
   deletes of random live keys). Per epoch, side by side on two copies of the table:

   * ``flinkish.delta`` (mode=upsert, deletes=true): prepare (what a Spark task does:
     resolve, write the new rows) and commit (key lookup, deletion vectors, one version
     with the app transaction) -- the first epoch separately (it builds the key index:
     what a driver pays once after a start);
   * the same sink with the key index cache off (every epoch reads every candidate
     file's key column again): what the index saves;
   * delta-rs ``merge`` with the same app transaction (``CommitProperties(app_transactions=
     [Transaction(uid, epoch)])``), source = the epoch's last change per key: what a user
     writes by hand (copy-on-write: every file holding a changed key is rewritten).

   Bytes written per epoch = growth of the table folder (data, vectors, log), next to the
   size of the epoch's changed rows written as one Parquet file (snappy).
2. **Lag** (Spark, ``local[2]``, 1-second trigger, local disk): ``flinkish.postgres``
   (snapshotThenChanges, the embedded PostgreSQL) into ``flinkish.delta`` mode=upsert; a
   writer updates random rows at ``--rate`` per second for ``--lag-seconds``, each row
   stamped with ``clock_timestamp()``; a poller notes when each table version appears
   and reads the stamps of the rows it added: lag = appearance - stamp, p50 / p99.

    python benchmarks/keyed_lakehouse.py [--sizes 1000000,10000000] [--epochs 12] [--merge-epochs 3]
        [--changes 10000] [--s3] [--skip-lag] [--rate 200] [--lag-seconds 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

FILE_ROWS = 1_000_000


def table_rows(lo: int, hi: int) -> Any:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.array(np.arange(lo, hi, dtype=np.int64))
    return pa.table({"id": ids, "v": pc.binary_join_element_wise("value-", pc.cast(ids, pa.string()), ""),
                     "n": pc.cast(pc.bit_wise_and(ids, 1023), pa.int32()),
                     "ts": pc.cast(pc.multiply(ids, 1_000_000), pa.timestamp("us", tz="UTC"))})


class Epochs:
    """Random change epochs over the live keys (the same sequence for every contender)."""

    def __init__(self, rows: int, changes: int, seed: int = 1) -> None:
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.live = np.arange(rows, dtype=np.int64)
        self.next_id = rows
        self.changes = changes
        self.lsn = 1

    def next(self) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = self.changes
        kinds = self.rng.choice(3, size=n, p=[0.8, 0.1, 0.1])  # update, insert, delete
        ids = self.live[self.rng.choice(len(self.live), size=n, replace=False)]  # distinct keys
        inserts = np.flatnonzero(kinds == 1)
        ids[inserts] = np.arange(self.next_id, self.next_id + len(inserts))
        self.next_id += len(inserts)
        deleted = ids[kinds == 2]
        self.live = np.concatenate([self.live[~np.isin(self.live, deleted)], ids[inserts]])
        op = np.where(kinds == 2, "d", np.where(kinds == 1, "c", "u"))
        lsn = self.lsn + np.arange(n, dtype=np.int64)
        self.lsn += n
        ida = pa.array(ids)
        return pa.table({"id": ida, "v": pc.binary_join_element_wise("changed-", pc.cast(pa.array(lsn), pa.string()), ""),
                         "n": pa.array((lsn % 1000).astype(np.int32)),
                         "ts": pc.cast(pc.multiply(ida, 1_000_000), pa.timestamp("us", tz="UTC")),
                         "_op": pa.array(op), "_lsn": pa.array(lsn),
                         "_commit_ts": pa.nulls(n, pa.timestamp("us", tz="UTC"))})


def last_per_key(changes: Any) -> Any:
    """The epoch's last change of each key: a merge's source must match a target row at most once."""
    import numpy as np
    import pyarrow as pa

    ids = changes.column("id").to_numpy()
    order = np.lexsort((changes.column("_lsn").to_numpy(), ids))
    ids_sorted = ids[order]
    last = np.append(ids_sorted[1:] != ids_sorted[:-1], True)
    return changes.take(pa.array(order[last]))


def folder_bytes(io: Any, root: str) -> int:
    return sum(int(v.get("size") or 0) for v in io.fs.find(io.strip(root), detail=True).values())


def parquet_size(table: Any) -> int:
    import io as _io

    import pyarrow.parquet as pq

    buf = _io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return len(buf.getvalue())


def spark_schema() -> Any:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("id", LongType()), StructField("v", StringType()), StructField("n", IntegerType()),
                       StructField("ts", TimestampType()), StructField("_op", StringType()),
                       StructField("_lsn", LongType()), StructField("_commit_ts", TimestampType())])


def make_table(path: str, rows: int, dv: bool, storage: dict[str, str] | None) -> None:
    import deltalake

    config = {"delta.enableDeletionVectors": "true"} if dv else None
    for lo in range(0, rows, FILE_ROWS):  # one file of 1 M key-sorted rows per append
        deltalake.write_deltalake(path, table_rows(lo, min(rows, lo + FILE_ROWS)), mode="append", configuration=config,
                                  storage_options=storage)


def per_epoch(rows: int, epochs: int, merge_epochs: int, changes: int, root: str, io: Any,
              storage: dict[str, str] | None, sink_options: dict[str, str]) -> dict[str, Any]:
    import deltalake
    import pyarrow as pa
    from deltalake.transaction import CommitProperties, Transaction

    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.connectors.lakehouse import key_lookup
    from flinkish_spark.sink.protocol import PrepareContext

    out: dict[str, Any] = {"rows": rows}
    t0 = time.perf_counter()
    for name, dv in (("keyed", True), ("nocache", True), ("merge", False)):
        make_table(f"{root}/{name}", rows, dv, storage)
    out["setup_s"] = time.perf_counter() - t0
    # flinkish.delta, index cached (the default), then with the cache off
    for name, epochs_here in (("keyed", epochs), ("nocache", min(epochs, 4))):
        key_lookup.CACHE.max_bytes = key_lookup.DEFAULT_CACHE_BYTES if name == "keyed" else 0
        key_lookup.CACHE.clear()
        sink = DeltaSink.at(f"{root}/{name}", uid="bench", schema=spark_schema(), mode="upsert", key="id",
                            deletes="true", options=sink_options)
        gen = Epochs(rows, changes)
        prep, comm, written, change_bytes = [], [], [], []
        for epoch in range(epochs_here):
            batch = gen.next()
            change_bytes.append(parquet_size(batch.drop_columns(["_op", "_lsn", "_commit_ts"])))
            before = folder_bytes(io, f"{root}/{name}")
            a = time.perf_counter()
            c = sink.prepare(iter(batch.to_batches()), PrepareContext("bench", epoch, 0, 0))
            b = time.perf_counter()
            assert sink.commit([c], epoch) == "COMMITTED"
            e = time.perf_counter()
            sink.cleanup(epoch, [c])
            prep.append((b - a) * 1000)
            comm.append((e - b) * 1000)
            written.append(folder_bytes(io, f"{root}/{name}") - before)
            print(f"  {rows:>10,} {name:8} epoch {epoch}: prepare {prep[-1]:7.0f} ms  commit {comm[-1]:7.0f} ms  "
                  f"written {written[-1] / 1e6:6.2f} MB", flush=True)
        out[name] = {"prepare_ms": prep, "commit_ms": comm, "bytes": written, "change_parquet_bytes": change_bytes}
    key_lookup.CACHE.max_bytes = key_lookup.DEFAULT_CACHE_BYTES
    # delta-rs merge, the same changes and the same app transaction
    gen = Epochs(rows, changes)
    merge_ms, merge_bytes = [], []
    for epoch in range(merge_epochs):
        source = last_per_key(gen.next())
        table = deltalake.DeltaTable(f"{root}/merge", storage_options=storage)
        before = folder_bytes(io, f"{root}/merge")
        a = time.perf_counter()
        (table.merge(source, "t.id = s.id", source_alias="s", target_alias="t",
                     commit_properties=CommitProperties(app_transactions=[Transaction("bench", epoch)]))
         .when_matched_delete(predicate="s._op = 'd'")
         .when_matched_update(updates={"v": "s.v", "n": "s.n", "ts": "s.ts"}, predicate="s._op != 'd'")
         .when_not_matched_insert(updates={"id": "s.id", "v": "s.v", "n": "s.n", "ts": "s.ts"}, predicate="s._op != 'd'")
         .execute())
        merge_ms.append((time.perf_counter() - a) * 1000)
        merge_bytes.append(folder_bytes(io, f"{root}/merge") - before)
        print(f"  {rows:>10,} merge    epoch {epoch}: {merge_ms[-1]:7.0f} ms  written {merge_bytes[-1] / 1e6:6.2f} MB", flush=True)
    out["merge"] = {"ms": merge_ms, "bytes": merge_bytes}
    # the tables agree after the epochs both applied: the keyed table read at that version (time
    # travel: one version per epoch after the load's one version per file) against the merged one
    n = min(epochs, merge_epochs)
    if n:
        loaded = -(-rows // FILE_ROWS)
        keyed = deltalake.DeltaTable(f"{root}/keyed", version=loaded - 1 + n, storage_options=storage)
        merged = deltalake.DeltaTable(f"{root}/merge", storage_options=storage)
        plain = pa.schema([("id", pa.int64()), ("v", pa.string())])  # delta-rs scans strings as string_view
        a = pa.table(keyed.scan(columns=["id", "v"])).cast(plain).sort_by("id")
        b = pa.table(merged.scan(columns=["id", "v"])).cast(plain).sort_by("id")
        assert a.num_rows == b.num_rows and a.equals(b), (a.num_rows, b.num_rows)
        print(f"  {rows:>10,} after {n} epochs flinkish.delta and delta-rs merge hold the same rows", flush=True)
    return out


def summarize(result: dict[str, Any]) -> list[Any]:
    k, nc, m = result["keyed"], result["nocache"], result["merge"]
    steady = slice(1, None)  # epoch 0 builds the key index
    commit = statistics.median(k["commit_ms"][steady])
    total = statistics.median([p + c for p, c in zip(k["prepare_ms"][steady], k["commit_ms"][steady])])
    nocache = statistics.median([p + c for p, c in zip(nc["prepare_ms"][steady], nc["commit_ms"][steady])])
    merge = statistics.median(m["ms"])
    written = statistics.median(k["bytes"][steady])
    changed = statistics.median(k["change_parquet_bytes"])
    return [f"{result['rows']:,}", f"{k['prepare_ms'][0] + k['commit_ms'][0]:.0f}", f"{statistics.median(k['prepare_ms'][steady]):.0f}",
            f"{commit:.0f}", f"{total:.0f}", f"{nocache:.0f}", f"{merge:.0f}", f"{merge / total:.1f}x",
            f"{written / 1e3:.0f} kB", f"{changed / 1e3:.0f} kB", f"{written / changed:.1f}x",
            f"{statistics.median(m['bytes']) / 1e6:.1f} MB"]


# -- lag ------------------------------------------------------------------------------------------

LAG_WRITER = r'''
import random, sys, time, psycopg
url, rate, seconds, rows = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(3)
with psycopg.connect(url, autocommit=True) as conn:
    start = time.time()
    i = 0
    while time.time() - start < seconds:
        conn.execute("UPDATE lagt SET v = v || '+', t = extract(epoch from clock_timestamp()) WHERE id = %s",
                     (rnd.randint(1, rows),))
        i += 1
        delay = start + i / rate - time.time()
        if delay > 0:
            time.sleep(delay)
'''


def lag(rate: float, seconds: float, rows: int, work: str) -> dict[str, Any]:  # noqa: C901 - one scenario
    import json

    import psycopg
    import pyarrow.parquet as pq

    import flinkish_spark
    from flinkish_spark.embedded.postgres import start_postgres

    server = start_postgres(os.path.join(work, "pg"))
    try:
        url = server.uri
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE lagt (id bigint PRIMARY KEY, v text, t double precision)")
            conn.execute(f"INSERT INTO lagt SELECT g, 'v' || g, 0 FROM generate_series(1, {rows}) g")
        spark = flinkish_spark.session(app_name="bench-keyed-lag")
        spark.sparkContext.setLogLevel("ERROR")
        table = os.path.join(work, "lag-table")
        df = (spark.readStream.format("flinkish.postgres").option("uid", "lag").option("url", url)
              .option("table", "lagt").option("checkpoint", os.path.join(work, "lag-meta")).load())
        q = (df.writeStream.format("flinkish.delta").option("uid", "lag-out").option("path", table).option("mode", "upsert")
             .option("deletes", "true").option("checkpointLocation", os.path.join(work, "lag-cp"))
             .trigger(processingTime="1 second").start())
        log_dir = os.path.join(table, "_delta_log")
        lags: list[float] = []
        stop = threading.Event()

        def poll() -> None:
            version = 0
            while not stop.is_set():
                path = os.path.join(log_dir, f"{version + 1:020d}.json")
                if not os.path.exists(path):
                    time.sleep(0.02)
                    continue
                seen = time.time()
                version += 1
                for line in open(path).read().splitlines():
                    add = json.loads(line).get("add")
                    if add and add.get("dataChange") and "deletionVector" not in add and "/driver-" not in add["path"]:
                        stamps = pq.read_table(os.path.join(table, add["path"]), columns=["t"]).column("t").to_pylist()
                        lags.extend(seen - s for s in stamps if s and s > 1)

        while q.lastProgress is None or not os.path.exists(log_dir):  # the snapshot epoch has committed
            time.sleep(0.2)
        time.sleep(3)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        writer = subprocess.Popen([sys.executable, "-c", LAG_WRITER, url, str(rate), str(seconds), str(rows)])
        writer.wait()
        time.sleep(5)
        stop.set()
        poller.join()
        # Where a batch's time goes (Spark's durationMs, medians over the batches that read changes).
        durations: dict[str, list[int]] = {}
        for p in q.recentProgress:
            if p.numInputRows:
                for k, v in (p.durationMs or {}).items():
                    durations.setdefault(k, []).append(int(v))
        batch_ms = {k: statistics.median(v) for k, v in durations.items()}
        end = flinkish_spark.stop(q, drain=True, timeout=120)
        spark.stop()
    finally:
        server.stop()
    lags.sort()
    p50, p99 = lags[len(lags) // 2], lags[int(len(lags) * 0.99)]
    print(f"lag at {rate:.0f} updates/s (1 s trigger): p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
          f"over {len(lags)} rows; the query ended {end}", flush=True)
    print(f"a batch's time (median ms, Spark's durationMs): {batch_ms}", flush=True)
    return {"rate": rate, "seconds": seconds, "rows": rows, "n": len(lags), "p50_ms": p50 * 1000, "p99_ms": p99 * 1000,
            "batch_duration_ms": batch_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--merge-epochs", type=int, default=3)
    ap.add_argument("--changes", type=int, default=10_000)
    ap.add_argument("--s3", action="store_true")
    ap.add_argument("--skip-epochs", action="store_true")
    ap.add_argument("--skip-lag", action="store_true")
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--lag-seconds", type=float, default=30)
    ap.add_argument("--lag-rows", type=int, default=100_000)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from flinkish_spark.io.fileio import FileIO

    results: dict[str, Any] = {"changes": args.changes, "storage": "moto S3" if args.s3 else "local disk"}
    work = tempfile.mkdtemp(prefix="bench-keyed-")
    try:
        if not args.skip_epochs:
            rows = []
            results["sizes"] = []
            for size in [int(s) for s in args.sizes.split(",") if s]:
                if args.s3:
                    from flinkish_spark.embedded.s3 import local_s3_process, make_bucket

                    with local_s3_process() as endpoint:
                        make_bucket(endpoint, "bench")
                        storage = {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}
                        io = FileIO.for_url("s3://bench", {"endpoint_url": endpoint})
                        r = per_epoch(size, args.epochs, args.merge_epochs, args.changes, f"s3://bench/t{size}", io,
                                      storage, {"endpointUrl": endpoint})
                else:
                    root = os.path.join(work, f"t{size}")
                    r = per_epoch(size, args.epochs, args.merge_epochs, args.changes, root, FileIO.for_url(root), None, {})
                    shutil.rmtree(root, ignore_errors=True)
                results["sizes"].append(r)
                rows.append(summarize(r))
            print_table(["table rows", "1st epoch ms (index)", "prepare ms", "commit ms", "epoch ms", "epoch ms, no index",
                         "delta-rs merge ms", "merge / flinkish", "written / epoch", "changed rows (parquet)",
                         "written / changed", "merge writes / epoch"], rows)
            if len(rows) >= 2:
                first, last = results["sizes"][0], results["sizes"][-1]

                def epoch_ms(r: dict[str, Any]) -> float:
                    return statistics.median([p + c for p, c in zip(r["keyed"]["prepare_ms"][1:], r["keyed"]["commit_ms"][1:])])

                growth = epoch_ms(last) / epoch_ms(first)
                results["growth"] = growth
                print(f"per-epoch time {first['rows']:,} -> {last['rows']:,} rows: x{growth:.2f} (target <= 1.5)")
            results["table"] = rows
        if not args.skip_lag:
            results["lag"] = lag(args.rate, args.lag_seconds, args.lag_rows, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"results: {write_results('keyed_lakehouse', results)}")


if __name__ == "__main__":
    main()
