"""What a transform costs a routed sink task, without Spark: rows/s of a table's task rows with and without a rule.

One table of ``--rows`` rows (id bigint, name text, country text, password_hash text, amount numeric(12,2)) as a
task's stream rows (a snapshot, or updates), side by side in one run (``--repeats`` rounds, medians; the machine may
be shared: compare the ratios, the load average is recorded beside them):

* ``decode``: :func:`~flinkish_spark.connectors.lakehouse.routing.task_tables` alone (what every Delta / Iceberg
  routed task does);
* ``decode + transform``: the same and :func:`~flinkish_spark.connectors.lakehouse.transform.hooks.transformed` with
  a rule excluding a column, filtering (``country IN ('DE', 'AT') AND amount > 10``) and computing two columns
  (``upper(name) || '-' || _op``, ``CAST(amount * 100 AS bigint)``);
* ``stream transform`` (PostgreSQL targets): :func:`~...hooks.transform_stream` of the JSON stream (decode, transform,
  JSON written again), beside the staging's own per-row work it precedes (``stage_rows``, of the untransformed rows).

    python benchmarks/transform_cost.py [--rows 500000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402

from benchmarks._common import print_table, write_results  # noqa: E402
from flinkish_spark.connectors.lakehouse.routing import task_tables  # noqa: E402
from flinkish_spark.connectors.lakehouse.transform.hooks import transform_stream, transformed  # noqa: E402
from flinkish_spark.connectors.lakehouse.transform.rules import parse_transforms  # noqa: E402
from flinkish_spark.connectors.postgres.routed import stage_rows  # noqa: E402
from flinkish_spark.connectors.postgres.rows.packed import _row_json  # noqa: E402
from flinkish_spark.sink.protocol import PrepareContext  # noqa: E402
from flinkish_spark.connectors.postgres.source.stream_rows import STREAM_ARROW  # noqa: E402
from flinkish_spark.testing.stream_rows import table_schema  # noqa: E402

SCHEMA = table_schema("public.users", [("id", "bigint"), ("name", "text"), ("country", "text"),
                                       ("password_hash", "text"), ("amount", "numeric(12,2)")], ("id",))
RULE = [{"tables": "public.users", "columns.exclude": ["password_hash"],
         "filter": "country IN ('DE', 'AT') AND amount > 10",
         "computed": {"tag": "upper(name) || '-' || _op", "cents": "CAST(amount * 100 AS bigint)"}}]


def stream(n: int, op: str) -> pa.Table:
    from decimal import Decimal

    countries = ["DE", "AT", "FR", "IT"]
    texts = [_row_json(SCHEMA, {"_op": op, "id": i, "name": f"name{i}", "country": countries[i % 4],
                                "password_hash": "x" * 60, "amount": Decimal(i % 2000) / 100}) for i in range(n)]
    lsn = None if op == "r" else 100
    head = pa.Table.from_pylist([{"_table": SCHEMA.table, "_op": "s", "_lsn": lsn, "_seq": 0, "_schema_id": SCHEMA.schema_id,
                                  "row": SCHEMA.to_json()}], schema=STREAM_ARROW)
    rows = pa.table({"_table": pa.array([SCHEMA.table] * n), "_op": pa.array([op] * n),
                     "_lsn": pa.array([lsn] * n, pa.int64()),
                     "_seq": pa.array(None if op == "r" else range(1, n + 1), pa.int32()) if op != "r" else pa.nulls(n, pa.int32()),
                     "_commit_ts": pa.nulls(n, pa.timestamp("us", tz="UTC")) if op == "r" else
                     pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     "_schema_id": pa.array([SCHEMA.schema_id] * n), "row": pa.array(texts)}, schema=STREAM_ARROW)
    return pa.concat_tables([head, rows])


def timed(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rules = parse_transforms({"transforms": json.dumps(RULE)}.get, "bench")
    out = []
    for op in ("r", "u"):
        s = stream(args.rows, op)
        batches = s.to_batches(max_chunksize=65_536)
        load = os.getloadavg()[0]
        decode = timed(lambda: task_tables(iter(batches)), args.repeats)
        both = timed(lambda: transformed(rules, task_tables(iter(batches))), args.repeats)
        pg = timed(lambda: transform_stream(rules, s), args.repeats)
        ctx = PrepareContext("bench", 0, 0, 0)
        staging = timed(lambda: stage_rows(s, ctx, "a"), args.repeats)  # the PostgreSQL sink's own work per task
        kept = transformed(rules, task_tables(iter(batches)))[0][2].changes.num_rows
        out.append({"op": op, "rows": args.rows, "kept": kept, "decode_s": round(decode, 3),
                    "decode_transform_s": round(both, 3), "transform_share": round((both - decode) / both, 3),
                    "stream_transform_s": round(pg, 3), "staging_rows_s": round(staging, 3),
                    "load_avg_1m": round(load, 2)})
    print_table(list(out[0]), [list(r.values()) for r in out])
    print(write_results("transform_cost", {"args": vars(args), "rule": RULE, "results": out}))


if __name__ == "__main__":
    main()
