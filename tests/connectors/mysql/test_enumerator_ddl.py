"""The enumerator's half of a statement that deletes rows without row events (no Spark: the enumerator driven as
the source's driver drives it, on the test server). The planning whose range holds ``DROP PARTITION`` keeps it in
the state it writes with that range's checkpoint; a restart from that checkpoint (a kill before the next
planning) still snapshots the table again at its next planning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord


def test_a_partition_statement_in_a_planned_range_survives_a_restart_and_renews_the_table(
        mariadb: Any, mysql_db: str, tmp_path: Path) -> None:
    from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource

    db = mysql_db
    mariadb.sql("CREATE TABLE parts (id int PRIMARY KEY, v int) PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS "
                "THAN (10), PARTITION p1 VALUES LESS THAN MAXVALUE); INSERT INTO parts VALUES (1, 1), (20, 20)", db)
    opts = {"uid": "src", "checkpoint": str(tmp_path / "meta"), "url": mariadb.url_for(db), "tables": f"{db}.*",
            "maxRowsPerTrigger": "100"}
    en = MysqlSourceDataSource(opts).create_enumerator()
    chunks = en.discover(set())
    done = tuple(SplitRecord(s.split_id, 0, 1, 1, True, 1, s.payload) for s in chunks)
    en.on_checkpoint_complete(SourceCheckpoint("src", "flinkish.mysql", 1, 0, 0, "{}", en.snapshot_state(), False, done))
    (change,) = en.discover({s.split_id for s in chunks})
    old_tid = next(e.tid for e in en.registry.entries if e.name == f"{db}.parts")

    mariadb.sql("ALTER TABLE parts DROP PARTITION p0", db)
    assert en.extent(change, 0).available > 0  # the statement ends a range of its own
    state = en.snapshot_state()  # what the range's checkpoint holds

    again = MysqlSourceDataSource(opts).create_enumerator()  # a restart from that checkpoint
    again.restore(state)
    assert list(again.ddl_pending) == [f"{db}.parts"]
    again.discover({change.split_id})
    (entry,) = [e for e in again.registry.entries if e.name == f"{db}.parts"]
    assert entry.tid != old_tid and entry.state == "joining" and entry.key == ("id",)
    assert "DROP PARTITION p0" in (entry.reason or "") and not again.ddl_pending
    assert b"ddl_pending" not in again.snapshot_state()  # taken exactly once: the next checkpoint has it no more


def test_a_range_is_read_in_the_pieces_its_checkpoint_names_at_every_replay(
        mariadb: Any, mysql_db: str, tmp_path: Path) -> None:
    """``changeReaders``: the planning cuts the epoch's range at transaction boundaries and writes the cuts into the
    state of the range's checkpoint; Spark's partitions come from that checkpoint alone -- a replay after a restart
    (even with other options) reads the same pieces -- and the pieces' rows are the range's."""
    from flinkish_spark.connectors.cdc.stream import stream_schema
    from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource

    db = mysql_db
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int); CREATE TABLE u (id int PRIMARY KEY)", db)
    opts = {"uid": "src", "checkpoint": str(tmp_path / "meta"), "url": mariadb.url_for(db), "tables": f"{db}.*",
            "startup": "changes", "changeReaders": "2", "changeReaderMinChanges": "10"}
    source = MysqlSourceDataSource(opts)
    en = source.create_enumerator()
    (change,) = en.discover(set())
    mariadb.sql("; ".join(f"INSERT INTO t VALUES ({i}, {i}); INSERT INTO u VALUES ({i})" for i in range(30))
                + "; UPDATE t SET v = v + 1 WHERE id < 10", db)
    end = en.extent(change, 0).available
    planned = SourceCheckpoint("src", "flinkish.mysql", 2, 1, 0, "{}", en.snapshot_state(), False,
                               (SplitRecord(change.split_id, 0, end, None, False, None, change.payload),))
    pieces = source.epoch_ranges(planned)
    assert [(r.start, r.end) for r in pieces][0][0] == 0 and pieces[-1].end == end and len(pieces) == 2
    assert [len(g) for g in source.group_ranges(pieces)] == [1, 1]  # a task each

    restarted = MysqlSourceDataSource({**opts, "changeReaders": "1"})  # a replay after a restart: the same pieces
    assert restarted.epoch_ranges(planned) == pieces
    reader = restarted.create_reader(stream_schema())
    rows = [[r for b in reader.read(change, p.start, p.end) for r in b.to_pylist()] for p in pieces]
    whole = [r for b in reader.read(change, 0, end) for r in b.to_pylist()]
    reader.close()
    data = [[(r["_table"], r["_op"], r["_lsn"], r["row"]) for r in p if r["_op"] != "s"] for p in rows]
    assert data[0] + data[1] == [(r["_table"], r["_op"], r["_lsn"], r["row"]) for r in whole if r["_op"] != "s"]
    assert len(data[0]) >= 10 and len(data[1]) >= 10 and max(r[2] for r in data[0]) < min(r[2] for r in data[1])
    assert {r["_table"] for r in rows[1] if r["_op"] == "s"} == {f"{db}.t", f"{db}.u"}  # its own schema rows
