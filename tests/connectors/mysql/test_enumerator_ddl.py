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
