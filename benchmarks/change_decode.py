"""Where the time of the change path goes, without Spark: peek, pgoutput decode, JSON encode, Arrow -- vs pg_recvlogical.

On an embedded PostgreSQL, ``bench.t`` (id int primary key, name text, amount numeric(12,2),
ts timestamptz, ok bool, attrs jsonb) gets ``--changes`` inserts in ``--txn``-row transactions
after a slot (pgoutput) and a publication were created as the source creates them. Then, in one
run, side by side (each stage includes the ones before it, from a fresh peek):

* (a) ``peek``: the server decodes the WAL and psycopg fetches the binary messages as Python bytes
  (:func:`..source.changes.peek`, nothing else);
* (b) + ``decode_changes`` (pgoutput bytes -> :class:`~..pgoutput.Change`);
* (c) + ``RowEncoder.encode`` of each change (text values -> the JSON text of the ``row`` column);
* (d) ``read_changes`` end to end (c, plus the schema rows, the ``_encode`` checks and the Arrow batches
  of the multi-table stream), on a minimal :class:`~..source.host.PostgresSourceHost`;
* (e) ``pg_recvlogical`` (the server's binary of the same version) streaming the same WAL with the same
  options (``proto_version 1``, ``publication_names``) to ``/dev/null`` up to ``--endpos``: the physical
  limit of getting the changes out of the server (a slot of its own per repeat: it consumes its slot).

Each round runs a..e once; ``--repeats`` rounds, medians reported (the machine may be shared: compare the
ratios within a run). Last, cProfile of (d) (top functions by own time) and a digest of (d)'s rows, so
that a change of the code can be checked to give the same stream byte for byte.

    python benchmarks/change_decode.py [--changes 200000] [--txn 1000] [--repeats 3] [--profile-top 15]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.connectors.postgres.connection import ConnectionInfo, connect, parse_url  # noqa: E402
from flinkish_spark.connectors.postgres.pgoutput import Change, decode_changes, format_lsn, parse_lsn  # noqa: E402
from flinkish_spark.connectors.postgres.rows import RowEncoder, table_schema  # noqa: E402
from flinkish_spark.connectors.postgres.rows.encode import session_settings_sql  # noqa: E402
from flinkish_spark.connectors.postgres.source.changes import peek  # noqa: E402
from flinkish_spark.connectors.cdc.patterns import TablePatterns  # noqa: E402
from flinkish_spark.connectors.postgres.source.tables_reader import read_changes  # noqa: E402

SLOT, PUBLICATION = "bench_decode", "bench_decode_pub"
DDL = "CREATE TABLE bench.t (id int PRIMARY KEY, name text, amount numeric(12,2), ts timestamptz, ok bool, attrs jsonb)"
FILL = """INSERT INTO bench.t SELECT g, 'customer ' || md5(g::text), (g % 100000) / 100.0,
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1.5 second', g % 3 = 0,
  jsonb_build_object('k', g, 'color', 'red') FROM generate_series(%s, %s) g"""


@dataclass
class Host:
    """The part of :class:`~..source.host.PostgresSourceHost` that ``read_changes`` uses."""

    conn_info: ConnectionInfo
    patterns: TablePatterns
    slot_name: str = SLOT
    publication: str = PUBLICATION
    component: str = "bench"


def prepare(url: str, changes: int, txn: int, recv_slots: int) -> int:
    """Table, publication, slots; then the changes. Returns the LSN after the last commit (the range's end)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench CASCADE")
        for name in [SLOT] + [f"{SLOT}_recv{i}" for i in range(recv_slots)]:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                         (name,))
        conn.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
        conn.execute("CREATE SCHEMA bench")
        conn.execute(DDL)
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE bench.t WITH (publish = 'insert, update, delete, "
                     "truncate', publish_via_partition_root = true)")
        for name in [SLOT] + [f"{SLOT}_recv{i}" for i in range(recv_slots)]:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        for lo in range(1, changes + 1, txn):
            conn.execute(FILL.replace("%s", str(lo), 1).replace("%s", str(min(changes, lo + txn - 1)), 1))
        return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]


def _peek(info: ConnectionInfo, end: int) -> list[bytes]:
    with connect(info, autocommit=True) as conn:
        for statement in session_settings_sql():
            conn.execute(statement)
        return peek(conn, SLOT, PUBLICATION, end, None)


def stage_peek(info: ConnectionInfo, end: int, schema: Any) -> int:
    return len(_peek(info, end))


def stage_decode(info: ConnectionInfo, end: int, schema: Any) -> int:
    return sum(1 for c in decode_changes(_peek(info, end), 0, end) if isinstance(c, Change))


def stage_encode(info: ConnectionInfo, end: int, schema: Any) -> int:
    encoder = RowEncoder(schema)
    n = 0
    for c in decode_changes(_peek(info, end), 0, end):
        if isinstance(c, Change):
            encoder.encode(c.values)
            n += 1
    return n


def stage_read_changes(info: ConnectionInfo, end: int, schema: Any) -> int:
    host = Host(info, TablePatterns.parse("bench.t", "bench"))
    return sum(b.num_rows for b in read_changes(host, 0, end))  # type: ignore[arg-type]


def digest(info: ConnectionInfo, end: int) -> tuple[str, int]:
    """sha256 of (d)'s rows, column by column in stream order: equal digests = the same stream, byte for byte."""
    h, n = hashlib.sha256(), 0
    host = Host(info, TablePatterns.parse("bench.t", "bench"))
    for b in read_changes(host, 0, end):  # type: ignore[arg-type]
        n += b.num_rows
        for col in b.columns:
            h.update(repr(col.to_pylist()).encode())
    return h.hexdigest(), n


def recvlogical(bin_dir: str, url: str, slot: str, end: int) -> float:
    exe = os.path.join(bin_dir, "pg_recvlogical")
    t0 = time.perf_counter()
    subprocess.run([exe, "-d", url, "--slot", slot, "--start", "--no-loop", "-o", "proto_version=1",
                    "-o", f"publication_names={PUBLICATION}", "-f", "/dev/null", "--endpos", format_lsn(end)],
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def profile(info: ConnectionInfo, end: int, schema: Any, top: int) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    stage_read_changes(info, end, schema)
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{os.path.basename(file)}:{line}({fn})", "calls": nc, "tottime_s": round(tt, 3),
                     "cumtime_s": round(ct, 3)})
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:top]


STAGES: list[tuple[str, str, Callable[[ConnectionInfo, int, Any], int]]] = [
    ("a", "peek (server decode + psycopg fetch)", stage_peek),
    ("b", "+ pgoutput decode_changes", stage_decode),
    ("c", "+ RowEncoder.encode (JSON row)", stage_encode),
    ("d", "read_changes end to end (+ Arrow batches)", stage_read_changes),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-top", type=int, default=15)
    ap.add_argument("--name", default="change_decode", help="results/<name>.json")
    ap.add_argument("--url", default=None, help="an existing server (default: an embedded one in a temporary folder)")
    args = ap.parse_args()
    from flinkish_spark.embedded.postgres import start_postgres

    work = tempfile.mkdtemp(prefix="flinkish-bench-decode-")
    pg = start_postgres(os.path.join(work, "data")) if args.url is None else None
    url = args.url or pg.uri  # type: ignore[union-attr]
    bin_dir = str(pg.bin_dir) if pg is not None else "/usr/lib/postgresql/15/bin"
    has_recv = os.path.exists(os.path.join(bin_dir, "pg_recvlogical"))
    try:
        t0 = time.perf_counter()
        end = prepare(url, args.changes, args.txn, args.repeats if has_recv else 0)
        print(f"{args.changes:,} inserts in {args.txn}-row transactions: {time.perf_counter() - t0:.1f}s; "
              f"range end {format_lsn(end)}", flush=True)
        info = parse_url(url)
        schema = table_schema(url, "bench.t")
        stage_read_changes(info, end, schema)  # warm: imports, catalog caches, the server's WAL pages
        times: dict[str, list[float]] = {k: [] for k, _, _ in STAGES}
        times["e"] = []
        counts: dict[str, int] = {}
        for r in range(args.repeats):
            for key, _, fn in STAGES:
                t = time.perf_counter()
                counts[key] = fn(info, end, schema)
                times[key].append(time.perf_counter() - t)
            if has_recv:
                times["e"].append(recvlogical(bin_dir, url, f"{SLOT}_recv{r}", end))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items() if v), flush=True)
        med = {k: statistics.median(v) for k, v in times.items() if v}
        rate = {k: args.changes / v for k, v in med.items()}
        sha, rows = digest(info, end)
        top = profile(info, end, schema, args.profile_top)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    labels = {k: label for k, label, _ in STAGES} | {"e": "pg_recvlogical -f /dev/null (physical limit)"}
    table = []
    prev = 0.0
    for k in med:
        us = 1e6 * med[k] / args.changes
        table.append((k, labels[k], f"{rate[k]:,.0f}", f"{rate[k] / rate['e']:.2f}" if "e" in rate else "-",
                      f"{us:.2f}", f"{us - prev:+.2f}" if k in "bcd" else "-"))
        prev = us if k in "abcd" else prev
    print(f"\n{args.changes:,} changes, {args.txn}-row transactions, median of {args.repeats} rounds "
          f"(load {os.getloadavg()[0]:.1f})\n")
    print_table(["", "stage", "changes/s", "x recvlogical", "us/change", "stage's own us"], table)
    print(f"\n(d) stream rows: {rows:,}, sha256 {sha}\n\ncProfile of (d), by own time:")
    print_table(["function", "calls", "tottime s", "cumtime s"],
                [(t["function"], t["calls"], t["tottime_s"], t["cumtime_s"]) for t in top])
    path = write_results(args.name, {
        "args": vars(args), "load_avg": os.getloadavg(), "seconds": times, "median_s": med,
        "changes_per_s": {k: round(v) for k, v in rate.items()},
        "ratio_to_recvlogical": {k: round(v / rate["e"], 3) for k, v in rate.items()} if "e" in rate else None,
        "stream_rows": rows, "stream_sha256": sha, "profile_d": top,
    })
    print("\nwrote", path)


if __name__ == "__main__":
    main()
