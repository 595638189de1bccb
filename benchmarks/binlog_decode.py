"""Which binary log decoder for the MySQL source (issue 29, item 5): decode rates vs ``mariadb-binlog``.

On a MariaDB 10.11 of :mod:`flinkish_spark.embedded.mariadb` (row-based log, full row image and metadata),
``bench.t`` (bigint key, int, varchar(64), decimal(12,2), datetime(6), double) gets ``--changes`` row
changes in ``--txn``-row transactions (``--per-statement`` rows per INSERT; 1 = one row event per row, as
an OLTP writer) after ``FLUSH BINARY LOGS``, so that they fill one log file of their own. Then, in each of
``--repeats`` rounds, side by side, each reads that file over the replication protocol (TCP, 127.0.0.1)
from its start to the last change:

* ``mariadb-binlog --read-from-remote-server`` to /dev/null: the server's own client, events written as
  base64 ``BINLOG`` statements (no row decoding): the limit of getting the log out of the server;
* the same with ``-v``: the server's client decoding every row into pseudo-SQL (a compiled decoder);
* ``mysql-replication`` (pure Python, on PyMySQL): ``BinLogStreamReader`` with ``only_events`` the row events,
  each event's ``rows`` built (every value decoded to Python);
* ``mysql-event-stream`` (a C++ engine behind ctypes): ``BinlogClient`` + ``CdcEngine``, every ``ChangeEvent``
  (its ``before``/``after`` dicts) taken;
* ``own pure-Python prototype`` (``benchmarks/binlog_rows_prototype.py``): what a decoder of the project's
  own would cost -- PyMySQL's packet reader, one precompiled reader per column, this table's types only;
* ``flinkish connectors/mysql``: the decoder built after it (``binlog.dump_events``, ``parse_table_map``,
  ``row_values.RowDecoder``: every type, values as Python objects, table maps kept by their bytes);
* ``flinkish changes.read_range``: the change reader over the decoder (``changes.read_range`` from the file's
  start to the end ``SHOW MASTER STATUS`` gave after the workload): whole transactions of ``RowChange``
  tuples with positions and sequence numbers, the purge check and the GTID state included -- what the
  source's change epochs will read.

``--only`` picks candidates by the start of their names (``--only mariadb-binlog,flinkish``).

A candidate that is not importable is reported as missing. Candidates are not dependencies of the benchmark
run: install them somewhere private and put that on ``PYTHONPATH``::

    pip install --target /tmp/binlog-libs mysql-replication mysql-event-stream
    PYTHONPATH=/tmp/binlog-libs:. python benchmarks/binlog_decode.py [--changes 300000] [--txn 1000] [--repeats 3]

Last, checks that matter for the choice, against the same server: column names from the table map
(``binlog_row_metadata=FULL``), the last row's values, and starting from a MariaDB GTID (``domain-server-seq``).
The machine may be shared: each figure carries the load average at its end and the CPU seconds the reader used
(this process and its children: the server's are in neither); compare ratios within a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.embedded.mariadb import EmbeddedMariaDB, find_program, temporary_mariadb  # noqa: E402

DDL = ("CREATE TABLE bench.t (id bigint PRIMARY KEY, n int, name varchar(64), amount decimal(12,2), "
       "ts datetime(6), score double)")
COLUMNS = ["id", "n", "name", "amount", "ts", "score"]
SERVER_ID = 4711  # the readers' replica id (any id but the server's own 1)


def value_row(i: int) -> str:
    sec = i * 3 // 2
    ts = f"2024-01-01 00:00:00.{(i * 37) % 1_000_000:06d}"
    return (f"({i},{i % 1000},'customer {i:08x}{(i * 7919) % 1_000_003:06x}',{(i % 100_000) / 100:.2f},"
            f"'{ts}' + INTERVAL {sec} SECOND,{i * 0.25})")


def write_changes(db: EmbeddedMariaDB, changes: int, txn: int, per_statement: int) -> tuple[str, int]:
    """The workload into a log file of its own; returns (file, GTID sequence number of the first transaction)."""
    db.sql(f"CREATE DATABASE bench; {DDL}; FLUSH BINARY LOGS")
    log_file = db.sql("SHOW MASTER STATUS").split("\t")[0]
    first_seq = int(db.sql("SELECT @@gtid_binlog_pos").strip().split("-")[-1]) + 1
    parts = []
    for start in range(1, changes + 1, txn):
        parts.append("BEGIN;")
        ids = list(range(start, min(start + txn, changes + 1)))
        for k in range(0, len(ids), per_statement):
            parts.append("INSERT INTO bench.t VALUES " + ",".join(value_row(i) for i in ids[k:k + per_statement]) + ";")
        parts.append("COMMIT;")
    t0 = time.monotonic()
    out = subprocess.run([str(find_program("mariadb")), "--no-defaults", "-uroot", f"--socket={db.socket_path}"],
                         input="\n".join(parts), text=True, capture_output=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    print(f"wrote {changes:,} changes in {time.monotonic() - t0:.1f} s into {log_file}")
    return log_file, first_seq


def run_mariadb_binlog(db: EmbeddedMariaDB, log_file: str, verbose: bool) -> int:
    args = [str(find_program("mariadb-binlog")), "--no-defaults", "--read-from-remote-server", "-h127.0.0.1",
            f"-P{db.port}", "-uroot", *(["-v"] if verbose else []), log_file]
    with open(os.devnull, "w") as null:
        subprocess.run(args, stdout=null, check=True)
    return -1  # counts nothing: it reads the whole file, which holds only the workload


def run_mysql_replication(db: EmbeddedMariaDB, log_file: str, changes: int) -> tuple[int, Any]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": db.port, "user": "root", "passwd": ""},
        # is_mariadb=False: its MariaDB mode sends an empty file name (GTID starts only), so a file+offset
        # start needs the MySQL dump command, which MariaDB serves as well.
        server_id=SERVER_ID, log_file=log_file, log_pos=4, resume_stream=True, blocking=False, is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent], enable_logging=False)
    count, last = 0, None
    try:
        for event in stream:
            rows = event.rows
            count += len(rows)
            last = rows[-1]["values"]
            if count >= changes:
                break
    finally:
        stream.close()
    return count, last


def run_mysql_event_stream(db: EmbeddedMariaDB, log_file: str, changes: int) -> tuple[int, Any]:
    from mysql_event_stream import BinlogClient, CdcEngine

    count, last = 0, None
    with BinlogClient(host="127.0.0.1", port=db.port, user="root", password="", server_id=SERVER_ID,
                      start_binlog_file=log_file, start_binlog_position=4, ssl_mode=0) as client, CdcEngine() as engine:
        engine.set_trailer_pre_verified(True)  # the client checked each event's CRC32 (as CdcStream sets it)
        client.connect()
        client.start()
        while count < changes:
            for result in client.poll_batch():
                if result.data is None:
                    continue
                engine.set_checksum_enabled(result.checksum_enabled)
                data = result.data
                while data:
                    used = engine.feed(data)
                    while (event := engine.next_event()) is not None:
                        if event.after is not None or event.before is not None:
                            count += 1
                            last = event
                    data = data[used:]
        client.stop()
    return count, last


def run_flinkish(db: EmbeddedMariaDB, log_file: str, changes: int) -> tuple[int, Any]:
    """connectors/mysql: dump_events + parse_table_map + compile_readers + decode_rows (every value to Python)."""
    from flinkish_spark.connectors.mysql import binlog
    from flinkish_spark.connectors.mysql.connection import connect, parse_url
    from flinkish_spark.connectors.mysql.position import FilePosition
    from flinkish_spark.connectors.mysql.row_values import ROW_EVENTS, RowDecoder
    from flinkish_spark.connectors.mysql.server import collation_charsets

    count, last = 0, None
    with connect(parse_url(db.url)) as conn:
        decoder = RowDecoder(collation_charsets(conn), mariadb=True)
        for event in binlog.dump_events(conn, FilePosition(log_file, 4), SERVER_ID):
            kind = event[4]
            if kind == binlog.TABLE_MAP_EVENT:
                decoder.table_map(event)
            elif kind in ROW_EVENTS:
                for _op, _before, after in decoder.rows(event)[1]:
                    count += 1
                    last = after
            if count >= changes:
                break
    return count, last


def run_changes(db: EmbeddedMariaDB, log_file: str, end: Any, changes: int) -> tuple[int, Any]:
    """connectors/mysql/changes.read_range over [file start, end): every change of the range as a RowChange."""
    from flinkish_spark.connectors.mysql.changes import read_range
    from flinkish_spark.connectors.mysql.connection import connect, parse_url
    from flinkish_spark.connectors.mysql.position import FilePosition
    from flinkish_spark.connectors.mysql.row_values import RowDecoder
    from flinkish_spark.connectors.mysql.server import collation_charsets

    info = parse_url(db.url)
    with connect(info) as conn:
        decoder = RowDecoder(collation_charsets(conn), mariadb=True)
    count, last = 0, None
    for txn in read_range(info, FilePosition(log_file, 4), end, decoder, SERVER_ID):
        count += len(txn.changes)
        if txn.changes:
            last = txn.changes[-1].after
    return count, last


def cpu_seconds() -> float:
    """CPU seconds of this process (all its threads: the C++ engine's reader too) and of its finished children
    (mariadb-binlog): on a shared machine a steadier measure than wall time. The server's own CPU is in neither."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def importable(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def checks(db: EmbeddedMariaDB, log_file: str, first_seq: int) -> dict[str, Any]:
    """What the choice needs besides speed: column names from the table map, and a start at a MariaDB GTID."""
    out: dict[str, Any] = {}
    start_gtid = f"0-1-{first_seq}"  # after this transaction: the workload's second transaction onwards
    if importable("pymysqlreplication"):
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import MariadbGtidEvent
        from pymysqlreplication.row_event import WriteRowsEvent

        stream = BinLogStreamReader(
            connection_settings={"host": "127.0.0.1", "port": db.port, "user": "root", "passwd": ""},
            server_id=SERVER_ID, auto_position=start_gtid, blocking=True, is_mariadb=True,
            only_events=[MariadbGtidEvent, WriteRowsEvent], enable_logging=False)
        gtids, first_id, names = [], None, None
        for event in stream:
            if isinstance(event, MariadbGtidEvent):
                gtids.append(event.gtid)
            elif first_id is None:
                first_id, names = event.rows[0]["values"]["id"], list(event.rows[0]["values"])
            if len(gtids) >= 2 and first_id is not None:  # blocking: the workload has 3 transactions or more
                break
        stream.close()
        out["mysql-replication"] = {"start_gtid": start_gtid, "first_gtids_after": gtids, "first_id_after": first_id,
                                    "column_names": names}
    if importable("mysql_event_stream"):
        from mysql_event_stream import BinlogClient, CdcEngine

        got: dict[str, Any] = {"start_gtid": start_gtid}
        try:
            with BinlogClient(host="127.0.0.1", port=db.port, user="root", password="", server_id=SERVER_ID,
                              start_gtid=start_gtid, ssl_mode=0) as client, CdcEngine() as engine:
                client.connect()
                client.start()
                event = None
                while event is None:
                    result = client.poll()
                    if result.data is None:
                        continue
                    engine.set_checksum_enabled(result.checksum_enabled)
                    engine.feed(result.data)
                    while (e := engine.next_event()) is not None:
                        if e.after is not None:
                            event = e
                            break
                got.update(first_id_after=event.after.get("id"), column_names=list(event.after),
                           names_resolved=event.names_resolved, gtid_after=client.current_gtid)
                client.stop()
        except Exception as e:  # noqa: BLE001 - reported, not fatal: a check of the candidate
            got["error"] = f"{type(e).__name__}: {e}"
        out["mysql-event-stream"] = got
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--per-statement", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated name prefixes of the candidates to run")
    ap.add_argument("--results", default="binlog_decode", help="results file name (benchmarks/results/NAME.json)")
    args = ap.parse_args()
    end_box: list[Any] = []  # the log's end after the workload (set below, read by the changes candidate)

    candidates: dict[str, Callable[[EmbeddedMariaDB, str], tuple[int, Any]]] = {
        "mariadb-binlog (no row decoding)": lambda db, f: (run_mariadb_binlog(db, f, False), None),
        "mariadb-binlog -v (rows decoded)": lambda db, f: (run_mariadb_binlog(db, f, True), None),
    }
    if importable("pymysqlreplication"):
        candidates["mysql-replication"] = lambda db, f: run_mysql_replication(db, f, args.changes)
    if importable("mysql_event_stream"):
        candidates["mysql-event-stream"] = lambda db, f: run_mysql_event_stream(db, f, args.changes)
    if importable("pymysql"):
        from binlog_rows_prototype import read_rows

        candidates["own pure-Python prototype"] = lambda db, f: read_rows(db.port, f, args.changes, SERVER_ID)
        candidates["flinkish connectors/mysql"] = lambda db, f: run_flinkish(db, f, args.changes)
        candidates["flinkish changes.read_range"] = lambda db, f: run_changes(db, f, end_box[0], args.changes)
    if args.only:
        prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
        candidates = {n: c for n, c in candidates.items() if any(n.startswith(p) for p in prefixes)}
    missing = [m for m in ("pymysqlreplication", "mysql_event_stream") if not importable(m)]

    # Faster generation: the benchmark measures reading the log, not the server's durability.
    with temporary_mariadb("flinkish-bench-mariadb-",
                           extra_args=("--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0")) as db:
        log_file, first_seq = write_changes(db, args.changes, args.txn, args.per_statement)
        from flinkish_spark.connectors.mysql.position import FilePosition

        status = db.sql("SHOW MASTER STATUS").split("\t")
        end_box.append(FilePosition(status[0], int(status[1])))
        size = next(int(line.split("\t")[1]) for line in db.sql("SHOW BINARY LOGS").splitlines()
                    if line.split("\t")[0] == log_file)
        secs: dict[str, list[float]] = {name: [] for name in candidates}
        cpus: dict[str, list[float]] = {name: [] for name in candidates}
        loads: dict[str, list[float]] = {name: [] for name in candidates}
        lasts: dict[str, str] = {}
        for r in range(args.repeats):
            for name, run in candidates.items():
                t0, c0 = time.monotonic(), cpu_seconds()
                count, last = run(db, log_file)
                secs[name].append(time.monotonic() - t0)
                cpus[name].append(cpu_seconds() - c0)
                loads[name].append(round(os.getloadavg()[0], 2))
                if count not in (-1, args.changes):
                    raise RuntimeError(f"{name} read {count} changes, not {args.changes}")
                if last is not None:
                    lasts[name] = repr(getattr(last, "after", last))
                print(f"round {r + 1}: {name}: {secs[name][-1]:.2f} s, {cpus[name][-1]:.2f} CPU s "
                      f"(load {loads[name][-1]})", flush=True)
        checked = checks(db, log_file, first_seq)

    base_name = "mariadb-binlog (no row decoding)"
    if base_name not in secs:
        base_name = next(iter(secs))
    base = statistics.median(secs[base_name])
    base_cpu = statistics.median(cpus[base_name])
    rows, results = [], {}
    for name in candidates:
        med = statistics.median(secs[name])
        rate = args.changes / med
        results[name] = {"seconds": [round(s, 3) for s in secs[name]], "median_s": round(med, 3),
                         "changes_per_s": round(rate), "ratio_to_mariadb_binlog": round(base / med, 3),
                         "us_per_change": round(med / args.changes * 1e6, 2), "load_average_1min": loads[name],
                         "cpu_seconds": [round(c, 3) for c in cpus[name]],
                         "cpu_us_per_change": round(statistics.median(cpus[name]) / args.changes * 1e6, 2),
                         "cpu_ratio_to_mariadb_binlog": round(base_cpu / statistics.median(cpus[name]), 3)}
        cpu = statistics.median(cpus[name])
        rows.append([name, f"{rate:,.0f}", f"{base / med:.2f}", f"{med / args.changes * 1e6:.2f}",
                     f"{cpu / args.changes * 1e6:.2f}", f"{base_cpu / cpu:.2f}",
                     " ".join(f"{s:.2f}" for s in secs[name]), " ".join(str(x) for x in loads[name])])
    print(f"\n{args.changes:,} changes, {args.txn}-row transactions, {args.per_statement} row(s) per statement, "
          f"log file {size / 2**20:.1f} MiB, medians of {args.repeats}")
    print_table(["decoder", "changes/s", "x mariadb-binlog", "us/change", "CPU us/change", "CPU x mariadb-binlog",
                 "seconds", "load avg"], rows)
    for name, last in lasts.items():
        print(f"last row, {name}: {last}")
    for name, c in checked.items():
        print(f"check, {name}: {c}")
    if missing:
        print(f"not importable (not measured): {', '.join(missing)}")
    versions: dict[str, str | None] = {}
    for dist in ("mysql-replication", "pymysql", "mysql-event-stream"):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception:  # noqa: BLE001
            versions[dist] = None
    path = write_results(args.results, {
        "changes": args.changes, "txn": args.txn, "rows_per_statement": args.per_statement,
        "log_bytes": size, "server": "MariaDB 10.11 (Debian)", "versions": versions, "results": results,
        "last_rows": lasts, "checks": checked, "missing": missing})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
