"""``spreadChanges``: the change range read by the driver as it plans the epoch, its rows handed to the tasks by table
(:mod:`flinkish_spark.source.spread_read`). Driven through the stream reader Spark calls (``latestOffset`` /
``partitions`` / ``read`` / ``commit``) on the embedded server.

What a user would notice if it were wrong: a row lost, doubled or reordered within its table, a table's rows in two
tasks (two tasks preparing the same keys), or a replayed epoch (planned again in a new driver) holding other rows.
So every epoch's partitions are compared with the range read as one task reads it, and planned a second time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from flinkish_spark.connectors.postgres.rows.packed import packed_schema
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource
from flinkish_spark.connectors.postgres.source import changes as changes_mod
from flinkish_spark.connectors.postgres.source import tables_reader
from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect
from flinkish_spark.source import adapter, spread_read
from flinkish_spark.source.adapter import SplitPartition
from flinkish_spark.source.spread_read import RowsPartition

TABLES = 12


def make_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA s")
        for i in range(TABLES):
            conn.execute(f"CREATE TABLE s.t{i} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO s.t{i} SELECT g, 'v' || g FROM generate_series(1, 5) g")


def write_changes(url: str) -> None:
    """Transactions over several tables: inserts, updates of a key, deletes, a column added mid-stream, a truncate."""
    with psycopg.connect(url) as conn:
        for txn in range(40):
            for j in range(3):
                t = (txn * 5 + j) % TABLES
                conn.execute(f"INSERT INTO s.t{t} VALUES (%s, %s)", (100 + txn * 3 + j, f"x{txn}"))
                conn.execute(f"UPDATE s.t{t} SET v = v || '!' WHERE id = %s", (1 + txn % 5,))
            if txn % 7 == 3:
                conn.execute(f"DELETE FROM s.t{txn % TABLES} WHERE id = {1 + txn % 5}")
            if txn == 20:
                conn.execute("ALTER TABLE s.t4 ADD COLUMN extra int DEFAULT 7")
                conn.execute("INSERT INTO s.t4 VALUES (999, 'after', 8)")
            if txn == 30:
                conn.execute("TRUNCATE s.t9")
            conn.commit()


def source(url: str, tmp: Path, uid: str, **options: str) -> Any:
    return PostgresSourceDataSource({"uid": uid, "checkpoint": str(tmp / "meta"), "url": url, "tables": "s.*",
                                     "rowFormat": "arrow", "decodeIn": "sink", **options})


def rows(reader: Any, partition: Any) -> list[dict]:
    return [r for b in reader.read(partition) for r in b.to_pylist()]


def plain_partitions(src: Any, end: dict, reader: Any) -> list[SplitPartition]:
    """The epoch's ranges as tasks of their own (what the plan is without spreadChanges)."""
    ckpt = src.checkpoint_store().read(reader._parse(end).ckpt)
    return [SplitPartition(r.split_id, r.payload, r.start, r.end, ckpt.ckpt_id) for r in src.epoch_ranges(ckpt)]


@pytest.mark.parametrize("max_rows", ["25", "400"])
def test_spread_partitions_hold_the_ranges_rows_each_table_in_one_task(
        pg_url: str, tmp_path: Path, max_rows: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tables(pg_url)
    src = source(pg_url, tmp_path, "spread", spreadChanges="3", maxRowsPerTrigger=max_rows)
    reader = src.streamReader(packed_schema())
    limit = reader.getDefaultReadLimit()  # what Spark passes: the source bounds its change ranges itself
    peeks: list[int] = []
    real_peek = tables_reader.peek_pieces

    def counted_peek(*a: Any, **k: Any) -> Any:
        peeks.append(1)
        return real_peek(*a, **k)

    monkeypatch.setattr(tables_reader, "peek_pieces", counted_peek)
    start, written, spread_epochs, changes = reader.initialOffset(), False, 0, 0
    for _ in range(200):
        end = reader.latestOffset(start, limit)
        if end == start:
            if written:
                break
            write_changes(pg_url)  # once the snapshot is planned: the changes come as a backlog
            written = True
            continue
        peeks.clear()
        parts = reader.partitions(start, end)
        assert not peeks  # the driver reads the messages latestOffset fetched: the server decoded the range once
        spread = [p for p in parts if isinstance(p, RowsPartition)]
        if spread:
            got = [rows(reader, p) for p in spread]
            want = [r for p in plain_partitions(src, end, reader) if not p.split_id.startswith("snapshot-")
                    for r in rows(reader, p)]
            by_table: dict[str, list[dict]] = {}
            for r in want:
                by_table.setdefault(r["_table"], []).append(r)
            owners: dict[str, int] = {}
            for i, part in enumerate(got):
                for r in part:
                    assert owners.setdefault(r["_table"], i) == i, f"{r['_table']} in two tasks"
            for table, table_rows in by_table.items():  # the same rows, each table's in its order
                assert [r for r in got[owners[table]] if r["_table"] == table] == table_rows, table
            assert sum(map(len, got)) == len(want)
            # A replay plans the epoch again (as a new driver does, without the messages latestOffset fetched): one
            # task reads the range, the same rows.
            again = reader.partitions(start, end)
            assert [type(p) for p in again] == [SplitPartition] and rows(reader, again[0]) == want
            spread_epochs += 1
            changes += sum(r["_changes"] or 0 for part in got for r in part)
        reader.commit(end)
        start = end
    reader.stop()
    assert written and spread_epochs >= (4 if max_rows == "25" else 1)
    assert changes >= 40 * 6  # every insert and update at least (deletes, the truncate and the added row besides)


def backlog_after_snapshot(url: str, tmp: Path, uid: str) -> tuple[Any, Any, dict]:
    """A spreading source whose snapshot is read, then the changes written as a backlog: (source, reader, offset)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    make_tables(url)
    src = source(url, tmp, uid, spreadChanges="2", maxRowsPerTrigger="100000")
    reader = src.streamReader(packed_schema())
    start = reader.initialOffset()
    while (end := reader.latestOffset(start, ReadAllAvailable())) != start:
        reader.partitions(start, end)
        reader.commit(end)
        start = end
    write_changes(url)
    return src, reader, start


def test_a_range_past_the_budget_is_one_task_that_reads_it(pg_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    src, reader, start = backlog_after_snapshot(pg_url, tmp_path, "budget")
    end = reader.latestOffset(start, ReadAllAvailable())
    monkeypatch.setattr(spread_read, "SPREAD_BUDGET_BYTES", 1_000)
    gave_up: list[object] = []
    real_spread = adapter.spread_rows

    def spread_rows(*a: Any, **k: Any) -> Any:
        gave_up.append(real_spread(*a, **k))
        return gave_up[-1]

    monkeypatch.setattr(adapter, "spread_rows", spread_rows)
    parts = reader.partitions(start, end)
    assert gave_up == [None]  # the driver read the range to spread it, and gave up at the budget
    assert [type(p) for p in parts] == [SplitPartition]
    assert sum(r["_changes"] or 0 for r in rows(reader, parts[0])) >= 40 * 6
    reader.stop()


def test_spread_changes_is_refused_without_tables_or_a_bound(pg_url: str, tmp_path: Path) -> None:
    from flinkish_spark.errors import ConfigError

    make_tables(pg_url)
    src = PostgresSourceDataSource({"uid": "one", "checkpoint": str(tmp_path / "meta"), "url": pg_url,
                                    "table": "s.t0", "spreadChanges": "2"})
    with pytest.raises(ConfigError, match="'spreadChanges' applies to 'tables' only"):
        src.schema()
    bad = source(pg_url, tmp_path, "bad", spreadChanges="0")
    with pytest.raises(ConfigError, match="'spreadChanges' must be >= 1"):
        bad.schema()
    unbounded = source(pg_url, tmp_path, "unbounded", spreadChanges="2")
    with pytest.raises(ConfigError, match="'spreadChanges' needs 'maxRowsPerTrigger'"):
        unbounded.schema()


def test_the_kept_messages_are_a_fresh_peek_of_the_range_and_none_are_kept_for_an_unbounded_range(
        pg_url: str, tmp_path: Path) -> None:
    """The invariant the driver's read stands on: what ``change_target`` keeps for a range is what a peek up to its
    end returns; a range it bounded without fetching it (no limit: a drain) keeps nothing."""
    src, reader, start = backlog_after_snapshot(pg_url, tmp_path, "kept")
    dialect = PostgresDialect(src)
    slot = src.slot_name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        position = 0  # the slot's own start: every change written above is after it
        for limit in (7, 60, 100_000):
            end_lsn = dialect.change_target(position, limit)
            assert changes_mod.has_peeked(slot, end_lsn), limit
            kept = [m for piece in changes_mod.take_peeked(slot, end_lsn) or [] for m in piece]
            fresh = changes_mod.peek(conn, slot, src.publication, end_lsn, None)
            assert kept == fresh and kept, limit
        end_lsn = dialect.change_target(position, None)  # a drain's bound: up to the flush position, one change fetched
        assert not changes_mod.has_peeked(slot, end_lsn)
    reader.stop()
