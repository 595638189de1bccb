"""The driver's commit of a big keyed routed-Delta epoch: peak RSS and time of the commit process (issue 26, targets 4, 5).

What the driver's commit Python process runs for a ``flinkish.delta`` routed sink, without Spark or a database,
side by side for several ``flinkish_spark`` trees (``--code base,worktree``): one table ``bench.t`` (id bigint
key, v int, s text of 40 characters, ts timestamp -- the row of ``big_transaction.py``) gets

* epoch 0, a **snapshot** epoch of N rows in 2 tasks (``snapshotPartitions`` 2), into the new table;
* epoch 1, a **transaction** that updates all N rows, in 1 task (one transaction's changes are one task's).

The tasks' prepare runs in one child process (the committables pickled, as Spark's commit messages carry them);
each epoch's commit runs in a fresh child process: it loads the messages and runs ``commit_epoch`` (encode, the
decision record, decode, the Delta commit, the done marker, cleanup), and reports the wall time and the
process's peak RSS (``ru_maxrss``) and its RSS before loading the messages (imports, the table's state read).

    python benchmarks/key_entries_commit.py --code DIR,DIR [--rows 1000000,2000000] [--name N]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import print_table, write_results  # noqa: E402

MIB = 2**20


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def task_batch(n0: int, n1: int, op: str, lsn: int | None) -> Any:
    """One task's stream rows: the table's schema row, then rows n0..n1-1 (op 'r' snapshot or 'u' one transaction)."""
    import datetime as dt

    import pyarrow as pa

    from flinkish_spark.testing.stream_rows import ARROW, StreamBuilder, table_schema

    schema = table_schema("bench.t", [("id", "bigint"), ("v", "int"), ("s", "text")], ("id",))
    head = StreamBuilder()
    head._schema_row(schema, lsn, None if lsn is None else 0)
    first = pa.Table.from_pylist(head.rows, schema=ARROW)
    n = n1 - n0
    v = 1 if op == "u" else 0
    rows = [f'{{"id":{i},"v":{i % 1000 + v},"s":"{i:032x}abcdefgh"}}' for i in range(n0, n1)]
    ts = None if lsn is None else dt.datetime.fromtimestamp(lsn, tz=dt.timezone.utc)
    body = pa.table({"_table": pa.array(["bench.t"] * n), "_op": pa.array([op] * n),
                     "_lsn": pa.array([lsn] * n, pa.int64()),
                     "_seq": pa.array(list(range(1, n + 1)) if lsn is not None else [None] * n, pa.int64()),
                     "_commit_ts": pa.array([ts] * n, pa.timestamp("us", tz="UTC")),
                     "_schema_id": pa.array([schema.schema_id] * n), "row": pa.array(rows)})
    return pa.concat_tables([first, body.select(first.column_names).cast(first.schema)])


def sink_and_log(work: str) -> tuple[Any, Any]:
    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.decisions import DecisionLog

    meta = os.path.join(work, "meta")
    log = DecisionLog(FileIO.for_url(meta), meta, "m")
    route = Route(os.path.join(work, "lake", "{schema}", "{table}"), "path")
    return RoutedDeltaSink(FileIO.for_url(work), route, "m", metadata_io=FileIO.for_url(meta),
                           metadata_dir=log.directory), log


def child_prepare(work: str, n: int) -> None:
    from flinkish_spark.sink.protocol import PrepareContext

    sink, _ = sink_and_log(work)
    half = n // 2
    snapshot = [sink.prepare(iter(task_batch(a, b, "r", None).to_batches()), PrepareContext("m", 0, p, 0))
                for p, (a, b) in enumerate([(0, half), (half, n)])]
    with open(os.path.join(work, "e0.pickle"), "wb") as f:
        pickle.dump(snapshot, f)
    del snapshot
    txn = [sink.prepare(iter(task_batch(0, n, "u", 5000).to_batches()), PrepareContext("m", 1, 0, 0))]
    with open(os.path.join(work, "e1.pickle"), "wb") as f:
        pickle.dump(txn, f)


def child_commit(work: str, epoch: int) -> None:
    from flinkish_spark.sink.committer import commit_epoch

    sink, log = sink_and_log(work)
    if epoch > 0:
        from flinkish_spark.connectors.delta.live import table_state

        table_state(sink.target("bench.t", _schema()))  # the table's state, as a running driver holds it
    before = rss_mib()
    t0 = time.perf_counter()
    with open(os.path.join(work, f"e{epoch}.pickle"), "rb") as f:
        prepared = pickle.load(f)
    result = commit_epoch(sink, log, epoch, prepared, "run")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = os.path.getsize(log.path(epoch))
    print(json.dumps({"epoch": epoch, "outcome": result.outcome, "commit_s": round(seconds, 3),
                      "rss_before_mib": round(before), "peak_mib": round(peak), "record_bytes": record}))


def _schema() -> Any:
    from flinkish_spark.testing.stream_rows import table_schema

    return table_schema("bench.t", [("id", "bigint"), ("v", "int"), ("s", "text")], ("id",))


def run(code: str, n: int) -> list[dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="flinkish-bench-entries-")
    env = {**os.environ, "PYTHONPATH": code}
    try:
        me = os.path.abspath(__file__)
        subprocess.run([sys.executable, me, "--child", "prepare", "--work", work, "--rows", str(n)], env=env,
                       check=True, cwd=code)
        out = []
        for epoch in (0, 1):
            load = os.getloadavg()[0]
            got = subprocess.run([sys.executable, me, "--child", "commit", "--work", work, "--epoch", str(epoch)],
                                 env=env, check=True, cwd=code, capture_output=True, text=True)
            r = json.loads(got.stdout.strip().splitlines()[-1])
            r.update(code=code, rows=n, case="snapshot (2 tasks)" if epoch == 0 else "transaction (1 task)",
                     load=round(load, 1))
            print(r, flush=True)
            out.append(r)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", default=os.path.dirname(HERE))
    ap.add_argument("--rows", default="1000000")
    ap.add_argument("--name", default="key_entries_commit")
    ap.add_argument("--child", choices=("prepare", "commit"))
    ap.add_argument("--work")
    ap.add_argument("--epoch", type=int, default=0)
    args = ap.parse_args()
    if args.child == "prepare":
        return child_prepare(args.work, int(args.rows))
    if args.child == "commit":
        return child_commit(args.work, args.epoch)
    runs = []
    for n in [int(x) for x in args.rows.split(",")]:
        for code in args.code.split(","):
            runs += run(os.path.abspath(code), n)
    cols = ["code", "rows", "case", "commit_s", "rss_before_mib", "peak_mib", "record_bytes", "load"]
    print_table(cols, [[r[c] for c in cols] for r in runs])
    print("wrote", write_results(args.name, {"args": vars(args), "runs": runs}))


if __name__ == "__main__":
    main()
