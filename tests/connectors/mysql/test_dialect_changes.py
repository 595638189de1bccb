"""MariaDB's change-log half of the dialect, against the session's MariaDB: the snapshot chunks and the binary log
from the join position, read as stream rows while a writer inserts, updates, deletes, adds a column and truncates,
rebuild the table exactly; a range read again gives the same batches; a purged start is the clear error."""

from __future__ import annotations

import json
import random
import threading
import time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.cdc import catalog_poll as poll
from flinkish_spark.connectors.cdc.patterns import TablePatterns, split_followable
from flinkish_spark.connectors.mysql.changes import BinlogPurgedError, gtid_at, position_of_key
from flinkish_spark.connectors.mysql.server import binary_logs
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.dialect import MysqlDialect
from flinkish_spark.connectors.postgres.rows import TableSchema, decode_rows


def _writer(info: Any, db: str, seed: int, stop: threading.Event, errors: list[BaseException]) -> None:
    """Single-row and multi-row transactions on t; an ADD COLUMN after 60 of them, a TRUNCATE after 120."""
    rnd = random.Random(seed)
    try:
        with connect(info) as conn, conn.cursor() as cur:
            conn.autocommit(True)
            n, next_id = 0, 1000
            while not stop.is_set() and n < 200:
                n += 1
                if n == 60:
                    cur.execute("ALTER TABLE t ADD COLUMN x int NULL")
                if n == 120:
                    cur.execute("TRUNCATE TABLE t")
                k = rnd.randrange(1, 1200)
                pick = rnd.random()
                if pick < 0.4:
                    cur.execute("INSERT IGNORE INTO t (id, v, n) VALUES (%s, %s, %s)", (next_id, f"w{n}", n / 4))
                    next_id += 1
                elif pick < 0.7:
                    extra = ", x = %s" % n if n > 60 else ""
                    cur.execute(f"UPDATE t SET v = %s, n = n + 1{extra} WHERE id = %s", (f"u{n}", k))
                elif pick < 0.8:
                    cur.execute("UPDATE IGNORE t SET id = %s WHERE id = %s", (next_id, k))  # the key moves
                    next_id += 1
                elif pick < 0.9:
                    cur.execute("DELETE FROM t WHERE id = %s", (k,))
                else:
                    cur.execute("BEGIN")
                    cur.execute("INSERT IGNORE INTO t (id, v, n) VALUES (%s, 'b1', 1), (%s, 'b2', 2)",
                                (next_id, next_id + 1))
                    cur.execute("DELETE FROM t WHERE id = %s", (k,))
                    cur.execute("COMMIT")
                    next_id += 2
                other = "INSERT INTO other VALUES (%s)" % n
                cur.execute(other)  # a table the patterns leave out
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def _apply(model: dict[Any, dict[str, Any]], batches: list[pa.RecordBatch]) -> None:
    schemas: dict[str, TableSchema] = {}
    for batch in batches:
        for r in batch.to_pylist():
            op = r["_op"]
            if op == "s":
                schemas[r["_schema_id"]] = TableSchema.from_json(r["row"])
            elif op == "t":
                model.clear()
            elif op in ("r", "c", "u", "d"):
                row = decode_rows([r["row"]], schemas[r["_schema_id"]]).to_pylist()[0]
                if op == "d":
                    model.pop(row["id"], None)
                else:
                    model[row["id"]] = row


def test_snapshot_then_changes_through_the_dialect_rebuild_the_table_and_replays_are_identical(
        mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v varchar(20), n decimal(9,2)); CREATE TABLE other (id int); "
                "INSERT INTO t SELECT seq, concat('v', seq), seq / 4 FROM seq_1_to_900; ANALYZE TABLE t",
                database=mysql_db)
    info = parse_url(mariadb.url_for(mysql_db))
    dialect = MysqlDialect(info, patterns=TablePatterns.parse(f"{mysql_db}.*", "t"))
    with dialect.connect() as conn:
        followed, _ = split_followable(dialect.find_tables(conn, dialect.patterns))  # type: ignore[arg-type]
        assert [t.table for t in followed] == ["t"]  # other: no key
        start = dialect.join_mark(conn).position
        entries, _ = poll.first_entries(dialect, conn, followed, 0, streaming=True)
        splits, _ = poll.plan_chunks(dialect, conn, entries, 0, 300)
    stop, errors = threading.Event(), []
    writer = threading.Thread(target=_writer, args=(info, mysql_db, 29, stop, errors))
    began = time.monotonic()
    writer.start()
    chunks: list[pa.RecordBatch] = []
    conn = dialect.chunk_connection()
    try:
        for s in splits:  # while the writer runs: each chunk in a snapshot of its own, after the join
            chunks += dialect.read_chunk(json.loads(s.payload or ""), conn)
            time.sleep(0.05)
    finally:
        conn.close()
    writer.join(60)
    assert not errors and not writer.is_alive()
    assert [b.column("_op")[0].as_py() for b in chunks[:1]] == ["s"]

    dialect.readers, dialect.min_changes_per_reader = 3, 20  # the range cut for three readers (changeReaders)
    end = dialect.change_target(start, None)
    cuts = dialect.range_cuts(start, end)
    counted = dialect.planned
    assert end > start and dialect.change_target(end, None) == end  # nothing after: no epoch
    changes = list(dialect.read_changes(start, end, None))
    model: dict[Any, dict[str, Any]] = {}
    _apply(model, chunks)
    _apply(model, changes)
    with connect(info) as c, c.cursor() as cur:
        cur.execute("SELECT id, v, n, x FROM t")
        table = {i: {"id": i, "v": v, "n": n, "x": x} for i, v, n, x in cur.fetchall()}
    got = {k: {"id": r["id"], "v": r["v"], "n": r["n"], "x": r.get("x")} for k, r in model.items()}
    assert got == table and len(table) > 50
    ops = [o for b in changes for o in b.column("_op").to_pylist()]
    assert {"s", "c", "u", "d", "t"} <= set(ops)
    schemas = [json.loads(r) for b in changes for o, r in zip(b.column("_op").to_pylist(), b.column("row").to_pylist())
               if o == "s"]
    assert [c["name"] for c in schemas[-1]["columns"]] == ["id", "v", "n", "x"]  # the ADD COLUMN: a new 's' row
    assert schemas[-1]["columns"][2]["type"] == "numeric(9,2)" and schemas[-1]["key"] == ["id"]
    lsns = [v for b in changes for v in b.column("_lsn").to_pylist()]
    assert lsns == sorted(lsns) and start <= lsns[0] and lsns[-1] < end

    # A replay of the range gives the same batches; ranges cut by a limit read the same rows in turn.
    assert [b.to_pylist() for b in dialect.read_changes(start, end, None)] == [b.to_pylist() for b in changes]
    middle = dialect.change_target(start, 50)
    assert start < middle < end
    # The range as planned, kept for the checkpoint: its changes (at least the limit) and the server's GTID state
    # at its end (MariaDB's own BINLOG_GTID_POS of that file position: where a failover replica would go on).
    planned = dialect.planned
    assert planned is not None and (planned.start, planned.end) == (start, middle) and (planned.changes or 0) >= 50
    with dialect.connect() as conn:
        assert planned.gtid == str(gtid_at(conn, position_of_key(middle, binary_logs(conn))))
    halves = [*dialect.read_changes(start, middle, None), *dialect.read_changes(middle, end, None)]
    strip = [{k: v for k, v in r.items() if k != "_seq"} for b in halves for r in b.to_pylist() if r["_op"] != "s"]
    assert strip == [{k: v for k, v in r.items() if k != "_seq"} for b in changes for r in b.to_pylist()
                     if r["_op"] != "s"]

    # The pieces (changeReaders): read one by one, as their tasks do, they give the whole range's rows (each piece
    # names its tables' schemas itself: an 's' row from the table maps of its own transactions); every cut is
    # before the TRUNCATE (a routing sink takes the piece holding it as the table's last word in the epoch); a piece
    # that starts after the ADD COLUMN decodes its rows with the new column. A replay reads the same rows.
    truncated_at = min(r["_lsn"] for b in changes for r in b.to_pylist() if r["_op"] == "t")
    assert 1 <= len(cuts) <= 2 and all(start < c <= truncated_at for c in cuts), (cuts, truncated_at)
    bounds = [start, *cuts, end]
    pieces = [list(dialect.read_changes(a, b, None)) for a, b in zip(bounds, bounds[1:])]
    assert all(pieces) and [b.to_pylist() for b in dialect.read_changes(cuts[0], cuts[1], None)] == [
        b.to_pylist() for b in pieces[1]]
    assert strip == [{k: v for k, v in r.items() if k != "_seq"} for p in pieces for b in p for r in b.to_pylist()
                     if r["_op"] != "s"]
    later = [json.loads(r["row"]) for p in pieces[1:] for b in p for r in b.to_pylist() if r["_op"] == "s"]
    assert later and later[0]["table"].endswith(".t") and "x" in [c["name"] for c in later[-1]["columns"]]
    model = {}
    _apply(model, chunks)
    for p in pieces:
        _apply(model, p)
    assert {k: {"id": r["id"], "v": r["v"], "n": r["n"], "x": r.get("x")} for k, r in model.items()} == table
    # Planned without a limit, the range's row events were walked by their headers (range_scan), the rows not
    # counted; with a limit they are counted without decoding them (row_count.RowCounter): a full decode's count.
    assert counted is not None and counted.changes is None and (counted.events or 0) > 0
    assert dialect.change_target(start, 10**6) == end
    exact = dialect.planned
    dialect._decoder = lambda conn, counting=False: MysqlDialect._decoder(dialect, conn)  # type: ignore[method-assign]
    assert dialect.change_target(start, 10**6) == end and dialect.planned == exact
    assert exact is not None and (exact.changes or 0) >= (counted.events or 0)
    print(f"writer+chunks {time.monotonic() - began:.1f}s, {len(ops)} change rows, cuts {cuts}")


def test_a_big_transaction_is_never_cut_and_its_rows_are_counted_exactly(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v varchar(200))", database=mysql_db)
    dialect = MysqlDialect(parse_url(mariadb.url_for(mysql_db)), patterns=TablePatterns.parse(f"{mysql_db}.t", "t"))
    dialect.readers, dialect.min_changes_per_reader = 2, 1
    with dialect.connect() as conn:
        start = dialect.current_position(conn)
    # 1 row, then 3,000 rows in one transaction (several row events), then 1 row: the middle is inside the big one.
    mariadb.sql("INSERT INTO t VALUES (0, repeat('a', 150)); INSERT INTO t SELECT seq, repeat('x', 150) FROM "
                "seq_1_to_3000; INSERT INTO t VALUES (5000, repeat('z', 150))", database=mysql_db)
    end = dialect.change_target(start, None)
    (cut,) = dialect.range_cuts(start, end)
    # Planned without a limit: by the events' headers (range_scan), the rows not counted -- the row events are.
    planned = dialect.planned
    assert planned is not None and planned.changes is None and 3 < (planned.events or 0) < 3002
    pieces = [[r for b in dialect.read_changes(a, b, None) for r in b.to_pylist() if r["_op"] != "s"]
              for a, b in ((start, cut), (cut, end))]
    lsns = [{r["_lsn"] for r in p} for p in pieces]
    assert max(lsns[0]) < cut <= min(lsns[1])
    assert sorted(len(p) for p in pieces) == [1, 3001]  # the big transaction whole, in one piece
    # With a limit (maxRowsPerTrigger) the rows are counted, exactly; the same cut (the only one possible).
    assert dialect.change_target(start, 10**6) == end and dialect.planned.changes == 3002
    assert dialect.range_cuts(start, end) == (cut,)


def test_a_purged_start_is_the_clear_error_at_planning_and_at_reading(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY)", database=mysql_db)
    info = parse_url(mariadb.url_for(mysql_db))
    dialect = MysqlDialect(info, patterns=TablePatterns.parse(f"{mysql_db}.*", "t"))
    with dialect.connect() as conn:
        old = dialect.current_position(conn)
    mariadb.sql("INSERT INTO t VALUES (1)", database=mysql_db)
    assert dialect.change_target(old, None) > old and dialect.position_lost() is None
    old_file = dialect.format_position(old).rpartition(":")[0]
    mariadb.sql("FLUSH BINARY LOGS")
    with dialect.connect() as conn:
        now = dialect.current_position(conn)
    current = dialect.format_position(now).rpartition(":")[0]
    deadline = time.monotonic() + 30
    while old_file in mariadb.sql(f"PURGE BINARY LOGS TO '{current}'; SHOW BINARY LOGS"):
        assert time.monotonic() < deadline, "the server kept the old log for 30 s"
        time.sleep(0.2)
    lost = dialect.position_lost()
    assert isinstance(lost, BinlogPurgedError) and "no longer has the binary log" in str(lost)
    assert "binlog_expire_logs_seconds" in str(lost) and "start over with a new snapshot" in str(lost)
    with pytest.raises(BinlogPurgedError):
        list(dialect.read_changes(old, now, None))


def test_types_reach_the_stream_as_the_sinks_know_them(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id bigint unsigned PRIMARY KEY, a tinyint, b int unsigned, d decimal(12,3), "
                "f float, g double, s varchar(5), e enum('x','y'), bl blob, bt bit(1), dt datetime(3), "
                "ts timestamp(6) NULL, yr year, j json, u uuid)", database=mysql_db)
    info = parse_url(mariadb.url_for(mysql_db))
    dialect = MysqlDialect(info, patterns=TablePatterns.parse(f"{mysql_db}.t", "t"))
    with dialect.connect() as conn:
        start = dialect.current_position(conn)
    mariadb.sql("SET time_zone = '+00:00'; INSERT INTO t VALUES (18446744073709551615, -5, 4000000000, 123456789.125, "
                "1.5, 2.25, 'héé', 'y', x'00ff', b'1', '2024-02-29 10:11:12.345', '2024-03-01 00:00:01.000002', "
                "2024, '{\"k\": [1, 2]}', '6ccd780c-baba-1026-9564-5b8c656024db')", database=mysql_db)
    end = dialect.change_target(start, None)
    changes = [r for b in dialect.read_changes(start, end, None) for r in b.to_pylist()]
    snapshot = [r for b in _chunk(dialect, mysql_db) for r in b.to_pylist()]
    assert changes[0]["_op"] == "s" and snapshot[0]["_op"] == "s"
    assert changes[0]["_schema_id"] == snapshot[0]["_schema_id"]  # one mapping for the log and the catalog
    schema = TableSchema.from_json(changes[0]["row"])
    assert [c.type for c in schema.columns] == [
        "numeric(20,0)", "smallint", "bigint", "numeric(12,3)", "real", "double precision", "text", "text", "bytea",
        "boolean", "timestamp without time zone", "timestamp with time zone", "smallint", "text", "text"]
    from_log = decode_rows([changes[1]["row"]], schema).to_pylist()[0]
    from_chunk = decode_rows([snapshot[1]["row"]], schema).to_pylist()[0]
    assert from_log == from_chunk
    assert from_log["id"] == Decimal(18446744073709551615) and from_log["bl"] == b"\x00\xff" and from_log["bt"] is True
    assert from_log["u"] == "6ccd780c-baba-1026-9564-5b8c656024db"  # MariaDB's UUID: text from the log too
    assert from_log["s"] == "héé" and from_log["ts"].microsecond == 2 and from_log["dt"].microsecond == 345000


def _chunk(dialect: MysqlDialect, db: str) -> list[pa.RecordBatch]:
    conn = dialect.chunk_connection()
    try:
        return list(dialect.read_chunk({"database": db, "name": "t", "lo": None, "hi": None}, conn))
    finally:
        conn.close()


def test_a_signature_change_asks_for_a_re_snapshot_only_when_rows_changed_without_row_events() -> None:
    dialect = MysqlDialect(parse_url("mysql://u@h:3306/db"))
    before = [["id", "int(11)", False], ["v", "varchar(10)", False], ["n", "int(11)", False]]
    same = dialect.signature_change(None, before, before)
    widened = dialect.signature_change(None, before, [["id", "int(11)", False], ["v", "varchar(40)", False],
                                                      ["n", "bigint(20)", False]])
    added = dialect.signature_change(None, before, [*before, ["x", "int(11)", False]])
    dropped = dialect.signature_change(None, before, before[:2])
    assert same is None and widened is None and added is None and dropped is None
    assert "changed type from varchar(10) to int(11)" in (dialect.signature_change(
        None, before, [before[0], ["v", "int(11)", False], before[2]]) or "")
    assert "renamed" in (dialect.signature_change(None, before, [*before[:2], ["m", "int(11)", False]]) or "")
    assert "added with a default" in (dialect.signature_change(None, before, [*before, ["x", "int(11)", True]]) or "")


def test_the_core_re_snapshots_a_table_whose_column_was_rewritten_by_a_modify(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v varchar(10), w varchar(10)); INSERT INTO t VALUES (1, '7', 'a')",
                database=mysql_db)
    dialect = MysqlDialect(parse_url(mariadb.url_for(mysql_db)))
    with dialect.connect() as conn:
        found, _ = split_followable(dialect.find_tables(conn, TablePatterns.parse(f"{mysql_db}.t", "t")))
        entries, next_tid = poll.first_entries(dialect, conn, found, 0, streaming=True)
        mariadb.sql("ALTER TABLE t MODIFY w varchar(40), ADD COLUMN x int", database=mysql_db)  # values unchanged
        entries, next_tid, _ = poll.compare_signatures(dialect, conn, entries, next_tid)
        assert [e.tid for e in entries] == [0]
        mariadb.sql("ALTER TABLE t MODIFY v int", database=mysql_db)  # '7' -> 7 without a row event
        entries, next_tid, _ = poll.compare_signatures(dialect, conn, entries, next_tid)
    assert [e.tid for e in entries] == [1] and "changed type from varchar(10) to int" in (entries[0].reason or "")


def test_idle_tables_make_no_epoch_until_the_log_moves_to_a_new_file(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE busy (id int PRIMARY KEY)", database=mysql_db)
    dialect = MysqlDialect(parse_url(mariadb.url_for(mysql_db)), patterns=TablePatterns.parse(f"{mysql_db}.t", "t"))
    with dialect.connect() as conn:
        start = dialect.current_position(conn)
    mariadb.sql("INSERT INTO busy VALUES (1)", database=mysql_db)
    assert dialect.change_target(start, None) == start  # others' changes only: no epoch
    mariadb.sql("INSERT INTO busy VALUES (2); INSERT INTO t VALUES (5)", database=mysql_db)
    end = dialect.change_target(start, None)  # read on from what the last planning read
    assert end > start and [r["_op"] for b in dialect.read_changes(start, end, None) for r in b.to_pylist()] == ["s", "c"]
    mariadb.sql("INSERT INTO busy VALUES (3); FLUSH BINARY LOGS; INSERT INTO busy VALUES (4)", database=mysql_db)
    moved = dialect.change_target(end, None)  # a new file: an epoch without rows, so the old file can go
    assert dialect.format_position(moved).split(":")[0] != dialect.format_position(end).split(":")[0]
    assert list(dialect.read_changes(end, moved, None)) == []


def test_a_chunk_whose_snapshot_a_ddl_overtook_is_taken_again_with_the_new_columns(
        mariadb: Any, mysql_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from flinkish_spark.connectors.mysql import chunk_rows

    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10), (2, 20)", database=mysql_db)
    begun = []

    def begin_then_alter(conn: Any) -> Any:
        position = chunk_rows.__dict__["_begin"](conn)
        if not begun:  # the first snapshot is overtaken by an ALTER (information_schema then shows the new columns)
            mariadb.sql("ALTER TABLE t ADD COLUMN w int NOT NULL DEFAULT 7, ALGORITHM=COPY", database=mysql_db)
        begun.append(position)
        return position

    monkeypatch.setitem(chunk_rows.__dict__, "_begin", chunk_rows.begin_snapshot)
    monkeypatch.setattr(chunk_rows, "begin_snapshot", begin_then_alter)
    dialect = MysqlDialect(parse_url(mariadb.url_for(mysql_db)))
    rows = _chunk(dialect, mysql_db)
    schema = TableSchema.from_json(rows[0].column("row")[0].as_py())
    assert len(begun) == 2 and schema.names == ("id", "v", "w")
    assert decode_rows(rows[1].column("row"), schema).to_pylist() == [{"id": 1, "v": 10, "w": 7},
                                                                       {"id": 2, "v": 20, "w": 7}]
