"""``spark.readStream.format("flinkish.mysql")`` on real Spark (the test session), into routed Delta.

Two MariaDB tables are snapshotted while a writer inserts, updates, deletes and moves keys in both
(one run with availableNow: the chunks); a second run reads the changes the first left (availableNow:
the binary log up to its end then). Each Delta target ``{schema}/{table}`` equals ``SELECT *`` of its table. The
change epochs' ranges are read in several tasks (``changeReaders``), at least one of them in more than one.
"""

from __future__ import annotations

import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")

TABLES = ("orders", "customers")


def run(spark: Any, mariadb: Any, db: str, tmp_path: Path, row_format: str) -> dict[str, int]:
    """One availableNow run; the mirror's observed figures summed over its batches (what its progress lines show)."""
    from flinkish_spark.mirror.pipeline import _observe
    from flinkish_spark.mirror.progress import OBSERVED, observed_values

    meta = str(tmp_path / "meta")
    df = (spark.readStream.format("flinkish.mysql").option("uid", "src").option("checkpoint", meta)
          .option("url", mariadb.url_for(db)).option("tables", f"{db}.*").option("splitSize", "40")
          .option("maxRowsPerTrigger", "1000").option("rowFormat", row_format)
          # the change epochs' ranges read in up to 3 tasks each (pieces of at least 20 changes)
          .option("changeReaders", "3").option("changeReaderMinChanges", "20").load())
    q = (_observe(df).writeStream.format("flinkish.delta").option("uid", "lake").option("checkpoint", meta)
         .option("path", str(tmp_path / "lake" / "{schema}" / "{table}"))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert q.exception() is None, q.exception()
    assert not q.isActive
    seen: dict[str, int] = {}
    for p in q.recentProgress:
        m = (getattr(p, "observedMetrics", None) or {}).get(OBSERVED)
        for k, v in (observed_values(m) if m is not None else {}).items():
            if k != "last_commit_us":
                seen[k] = seen.get(k, 0) + int(v or 0)
    return seen


def rows_of(mariadb: Any, db: str, table: str) -> list[tuple]:
    from flinkish_spark.connectors.mysql.connection import connect, parse_url

    with closing(connect(parse_url(mariadb.url_for(db)))) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name, n FROM `{table}` ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]


def target_of(tmp_path: Path, db: str, table: str) -> list[tuple]:
    t = pa.table(deltalake.DeltaTable(str(tmp_path / "lake" / db / table)).scan()).to_pylist()
    return sorted((r["id"], r["name"], r["n"]) for r in t)


def test_two_tables_snapshot_then_changes_into_routed_delta(spark, mariadb: Any, mysql_db: str,
                                                            tmp_path: Path) -> None:
    inserts = ", ".join(f"({i}, 'n{i}', {i % 7})" for i in range(1, 201))
    for table in TABLES:
        mariadb.sql(f"CREATE TABLE `{table}` (id int PRIMARY KEY, name varchar(40), n int) ENGINE=InnoDB; "
                    f"INSERT INTO `{table}` VALUES {inserts}", mysql_db)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set() and i < 60:
            i += 1
            for table in TABLES:
                mariadb.sql(f"INSERT INTO `{table}` VALUES ({1000 + i}, 'w{i}', {i}); "
                            f"UPDATE `{table}` SET name = 'u{i}', n = n + 1 WHERE id = {i * 3}; "
                            f"DELETE FROM `{table}` WHERE id = {200 - i}; "
                            f"UPDATE `{table}` SET id = {5000 + i} WHERE id = {100 + i}", mysql_db)
            time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        run(spark, mariadb, mysql_db, tmp_path, "json")  # the snapshot, while the writer writes
    finally:
        stop.set()
        thread.join()
    mariadb.sql("UPDATE `orders` SET name = NULL WHERE id = 1; DELETE FROM `customers` WHERE id = 2", mysql_db)
    # The changes packed (rowFormat=arrow, as the mirror reads for lakehouse targets): a restart may switch shapes.
    seen = run(spark, mariadb, mysql_db, tmp_path, "arrow")
    # The writer's changes (the first run read the snapshot only): an epoch of ~500, read in three pieces.
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.connectors.cdc.change_split import epoch_pieces
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.source.planning import read_ranges

    store = SourceCheckpointStore(FileIO.for_url(str(tmp_path / "meta")), str(tmp_path / "meta"), "src", "flinkish.mysql")
    pieces = [len(epoch_pieces(read_ranges(c), c.enumerator_state)) for c in map(store.read, store.ids())
              if any(r.split_id.startswith("changes-") for r in read_ranges(c))]
    assert 3 in pieces, pieces
    # The mirror's progress figures of the change epochs: changes counted (at least the last two), no snapshot rows.
    assert seen["changes"] >= 2 and seen["snapshot_rows"] == 0 and seen["rows"] == seen["changes"], seen

    for table in TABLES:
        assert target_of(tmp_path, mysql_db, table) == rows_of(mariadb, mysql_db, table), table

    # What `flinkish inspect` shows: both tables streaming, the change split's binary log position.
    from flinkish_spark.inspect import postgres_tables, recent_epochs
    from flinkish_spark.io.fileio import FileIO

    meta = str(tmp_path / "meta")
    assert postgres_tables(FileIO.for_url(meta), meta) == {"src": {"streaming": 2}}
    epochs = [e for e in recent_epochs(FileIO.for_url(meta), meta, last=50) if e.binlog]
    # Each change epoch counts the changes of its range (the log's row changes: a key move is one), never the
    # position's distance from 0; the last names the server's GTID state there beside the file position.
    assert 2 <= sum(e.rows_in_epoch for e in epochs) <= seen["changes"], [e.read_in_epoch for e in epochs]
    gtid = mariadb.sql("SELECT @@gtid_binlog_pos").split()[-1]
    assert epochs[-1].position.startswith("binlog file #") and epochs[-1].position.endswith(f", GTID {gtid}")


def test_wrong_options_and_a_pattern_matching_nothing_are_one_clear_error_each(mariadb: Any, mysql_db: str,
                                                                               tmp_path: Path) -> None:
    """Before Spark plans anything (no Spark needed): what the user gets from ``load()``."""
    from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource
    from flinkish_spark.errors import ConfigError

    base = {"uid": "src", "checkpoint": str(tmp_path / "meta"), "url": mariadb.url_for(mysql_db)}
    with pytest.raises(ConfigError, match="option 'table' is not supported: the MySQL source reads 'tables'"):
        MysqlSourceDataSource({**base, "table": f"{mysql_db}.orders"})
    with pytest.raises(ConfigError, match="startup=snapshot reads no binary log; drop the options onSlotLost"):
        MysqlSourceDataSource({**base, "tables": f"{mysql_db}.*", "startup": "snapshot", "onSlotLost": "fail"})
    with pytest.raises(ConfigError, match=f"no table matches 'tables' = '{mysql_db}.nothing' on the MySQL server"):
        MysqlSourceDataSource({**base, "tables": f"{mysql_db}.nothing"}).schema()
    mariadb.sql("CREATE TABLE legacy (id int PRIMARY KEY) ENGINE=MyISAM", mysql_db)
    with pytest.raises(Exception, match=f"table {mysql_db}.legacy uses the MyISAM engine"):
        MysqlSourceDataSource({**base, "tables": f"{mysql_db}.*"}).schema()
    assert not (tmp_path / "meta" / "src").exists()  # nothing written
