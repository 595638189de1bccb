"""A replayed change range whose binary log was purged (no Spark: the enumerator and the reader driven as the source
drives them, on the test server). A run ends with an epoch planned and not committed; the server purges the log its
range starts in -- here only that file: the range's end survives. The replay of that epoch fails with the clear
error under ``onSlotLost=fail``; under ``resnapshot`` it reads no rows, and the planning after its commit starts a
new generation (every table snapshotted again between ``B``/``E``) instead of going on from the range's end; a
drain asked meanwhile waits for it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.connectors.cdc.change_split import change_start
from flinkish_spark.connectors.mysql.changes import BinlogPurgedError


def _purge_to(mariadb: Any, newest: str, gone: str) -> None:
    deadline = time.monotonic() + 30
    while gone in mariadb.sql(f"PURGE BINARY LOGS TO '{newest}'; SHOW BINARY LOGS"):
        assert time.monotonic() < deadline, "the server kept the old log for 30 s"
        time.sleep(0.2)


def test_a_replayed_range_whose_start_was_purged_fails_or_starts_a_new_generation(
        mariadb: Any, mysql_db: str, tmp_path: Path) -> None:
    from flinkish_spark.connectors.cdc.stream import stream_schema
    from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource

    db = mysql_db
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 1), (2, 2)", db)
    opts = {"uid": "src", "checkpoint": str(tmp_path / "meta"), "url": mariadb.url_for(db), "tables": f"{db}.*"}
    en = MysqlSourceDataSource(opts).create_enumerator()
    chunks = en.discover(set())
    done = tuple(SplitRecord(s.split_id, 0, 1, 1, True, 1, s.payload) for s in chunks)
    en.on_checkpoint_complete(SourceCheckpoint("src", "flinkish.mysql", 1, 0, 0, "{}", en.snapshot_state(), False, done))
    (change,) = en.discover({s.split_id for s in chunks})

    # A range that starts in one file and ends in the next; its epoch planned (checkpoint 2), never committed.
    mariadb.sql("INSERT INTO t VALUES (3, 3)", db)
    mariadb.sql("FLUSH BINARY LOGS", db)
    mariadb.sql("UPDATE t SET v = 30 WHERE id = 3; DELETE FROM t WHERE id = 1", db)
    end = en.extent(change, 0).available
    assert end > 0
    state = en.snapshot_state()
    planned = SourceCheckpoint("src", "flinkish.mysql", 2, 1, 0, "{}", state, False,
                               (*done, SplitRecord(change.split_id, 0, end, None, False, None, change.payload)))
    start_file = en.dialect.format_position(change_start(change, 0)).rpartition(":")[0]
    end_file = en.dialect.format_position(end).rpartition(":")[0]
    assert start_file != end_file
    _purge_to(mariadb, end_file, start_file)  # the range's start is gone, its end is not

    # onSlotLost=fail: the replay is the clear error, never a silent skip.
    reader = MysqlSourceDataSource(opts).create_reader(stream_schema())
    with pytest.raises(BinlogPurgedError, match="onSlotLost=resnapshot"):
        list(reader.read(change, 0, end))
    reader.close()

    # resnapshot: the replay reads nothing; the planning after its commit starts generation 1 (B/E chunks).
    again = {**opts, "onSlotLost": "resnapshot"}
    reader = MysqlSourceDataSource(again).create_reader(stream_schema())
    assert list(reader.read(change, 0, end)) == []
    reader.close()
    restarted = MysqlSourceDataSource(again).create_enumerator()
    restarted.restore(state)
    restarted.on_checkpoint_complete(planned)
    assert not restarted.drain_ready() and not restarted.drain_ready()  # a drain would skip the range: it waits
    new = restarted.discover({s.split_id for s in planned.splits})
    assert restarted.generation == 1
    assert new and all(s.split_id.startswith("snapshot-1-") for s in new), [s.split_id for s in new]
    assert all('"resnapshot": true' in (s.payload or "") for s in new), [s.payload for s in new]


def test_a_changes_only_source_snapshots_every_table_in_its_new_generation(mariadb: Any, mysql_db: str,
                                                                           tmp_path: Path) -> None:
    """``startup=changes`` reads no snapshot at the start; but under ``onSlotLost=resnapshot`` the new generation after a
    purged position must read the tables -- the changes in the gap are gone, and only the table can say what they did
    (as the single-table PostgreSQL source does). Before: the new generation planned no chunk and went on from the
    log's end, the targets silently missing the purged changes."""
    from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource

    db = mysql_db
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 1), (2, 2)", db)
    opts = {"uid": "src", "checkpoint": str(tmp_path / "meta"), "url": mariadb.url_for(db), "tables": f"{db}.*",
            "startup": "changes", "onSlotLost": "resnapshot"}
    en = MysqlSourceDataSource(opts).create_enumerator()
    (change,) = en.discover(set())  # changes only: no chunk
    assert not change.split_id.startswith("snapshot-")
    state = en.snapshot_state()
    committed = SourceCheckpoint("src", "flinkish.mysql", 1, 0, 0, "{}", state, False,
                                 (SplitRecord(change.split_id, 0, 0, None, False, None, change.payload),))
    start_file = en.dialect.format_position(change_start(change, 0)).rpartition(":")[0]
    mariadb.sql("INSERT INTO t VALUES (3, 3)", db)  # a change the purge takes away
    mariadb.sql("FLUSH BINARY LOGS", db)
    logs = [line.split()[0] for line in mariadb.sql("SHOW BINARY LOGS").strip().splitlines()[1:]]
    _purge_to(mariadb, logs[-1], start_file)

    restarted = MysqlSourceDataSource(opts).create_enumerator()
    restarted.restore(state)
    restarted.on_checkpoint_complete(committed)
    new = restarted.discover({change.split_id})
    assert restarted.generation == 1
    chunks = [s for s in new if s.split_id.startswith("snapshot-1-")]
    assert chunks and all('"resnapshot": true' in (s.payload or "") for s in chunks), [s.split_id for s in new]
