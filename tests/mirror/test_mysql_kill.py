"""``flinkish mirror --from mysql://`` into routed Delta, killed with SIGKILL during the snapshot and again during the
changes, restarted with the same command each time, then drained: every Delta target equals its MariaDB table.

Three keyed tables (one with a composite key) of a few thousand rows, read in chunks of 300 rows, 600 a trigger: the
snapshot takes several epochs. A writer changes all three all the time in multi-statement transactions (inserts,
updates, deletes, key moves). Run 1 is killed in the snapshot, when an epoch's Delta versions are written and Spark's
commit log not yet (``FLINKISH_CRASH_AT=sink.after_commit``: the snapshot goes table by table, so its epochs rarely
hold two tables); run 2 is armed at ``sink.between_tables`` (an epoch's first table has its Delta version, the next
not) only once it reports every table snapshotted (the hit counter set by the test), and the writer adds a column
meanwhile; run 3 drains after the writer stopped.
"""

from __future__ import annotations

import random
import re
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.testing.mirror_process import drain, ended, flinkish, start, wait_for

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

POINT = "sink.between_tables"
TABLES = {"orders": ("id",), "customers": ("k",), "order_lines": ("order_id", "line")}
SETUP = """
CREATE TABLE orders (id int PRIMARY KEY, name varchar(40), amount decimal(12,2), f double) ENGINE=InnoDB;
CREATE TABLE customers (k varchar(20) PRIMARY KEY, city varchar(40), n bigint) ENGINE=InnoDB;
CREATE TABLE order_lines (order_id int, line int, qty int, note text, PRIMARY KEY (order_id, line)) ENGINE=InnoDB;
INSERT INTO orders SELECT seq, CONCAT('o', seq), seq / 100, seq * 0.1 FROM seq_1_to_3000;
INSERT INTO customers SELECT CONCAT('c', seq), CONCAT('city', seq % 17), seq * 1000003 FROM seq_1_to_1500;
INSERT INTO order_lines SELECT seq DIV 3 + 1, seq % 3, seq % 11, REPEAT('x', seq % 50) FROM seq_0_to_2999;
"""


class Writer(threading.Thread):
    """Changes every table in transactions of several statements until stopped; ``add_column`` (an event) makes it
    run ``ALTER TABLE orders ADD COLUMN extra int`` once and set the new column from then on."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.add_column = url, threading.Event(), threading.Event()
        self.transactions, self.error = 0, None  # type: int, BaseException | None

    def run(self) -> None:
        from flinkish_spark.connectors.mysql.connection import connect, parse_url

        rnd, next_id, altered = random.Random(29), 1_000_000, False
        try:
            with closing(connect(parse_url(self.url))) as conn, conn.cursor() as cur:
                cur.execute("SET autocommit = 1")
                while not self.stop.is_set():
                    if self.add_column.is_set() and not altered:
                        cur.execute("ALTER TABLE orders ADD COLUMN extra int")
                        altered = True
                    k = rnd.randint(1, 3000)
                    cur.execute("START TRANSACTION")
                    cur.execute("INSERT INTO orders VALUES (%s, 'new', 1.25, 0.5" + (", %s)" if altered else ")"),
                                (next_id, k) if altered else (next_id,))
                    cur.execute("UPDATE orders SET name = CONCAT(name, '+'), amount = amount * 2 WHERE id = %s", (k,))
                    cur.execute("UPDATE orders SET id = %s WHERE id = %s", (next_id + 1, k + 1))  # a key moves
                    cur.execute("DELETE FROM orders WHERE id = %s", (k + 2,))
                    cur.execute("UPDATE customers SET city = CONCAT(city, '+'), n = n + 1 WHERE k = %s", (f"c{k % 1500}",))
                    cur.execute("DELETE FROM customers WHERE k = %s", (f"c{(k * 7) % 1500}",))
                    cur.execute("INSERT INTO customers VALUES (%s, NULL, %s)", (f"n{next_id}", k))
                    cur.execute("UPDATE order_lines SET line = line + 10 WHERE order_id = %s AND line = 0", (k % 1000 + 1,))
                    cur.execute("DELETE FROM order_lines WHERE order_id = %s AND line = 1", (k % 1000 + 1,))
                    cur.execute("INSERT INTO order_lines VALUES (%s, 0, 1, 'w')", (next_id,))
                    if altered:
                        cur.execute("UPDATE orders SET extra = %s WHERE id = %s", (k, k + 3))
                    cur.execute("COMMIT")
                    next_id += 2
                    self.transactions += 1
                    time.sleep(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        assert self.error is None, repr(self.error)


def source_rows(url: str, table: str) -> tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]:
    """``SELECT *`` of ``table``: its columns and its rows by primary key."""
    from flinkish_spark.connectors.mysql.connection import connect, parse_url

    with closing(connect(parse_url(url))) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM `{table}`")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    return names, {tuple(r[k] for k in TABLES[table]): r for r in rows}


def differences(url: str, lake: Path, db: str) -> dict[str, Any]:
    """Per table, what its Delta target (delta-rs, deletion vectors applied) has other than the table."""
    out: dict[str, Any] = {}
    for table in TABLES:
        names, theirs = source_rows(url, table)
        target = pa.table(deltalake.DeltaTable(str(lake / db / table)).scan())
        missing_columns = [n for n in names if n not in target.column_names]
        if missing_columns:
            out[table] = {"columns missing": missing_columns}
            continue
        mine = {tuple(r[k] for k in TABLES[table]): {n: r[n] for n in names} for r in target.to_pylist()}
        if mine != theirs or target.num_rows != len(mine):
            out[table] = {"missing": [k for k in theirs if k not in mine][:5],
                          "extra": [k for k in mine if k not in theirs][:5],
                          "wrong": [(k, mine[k], theirs[k]) for k in theirs if k in mine and mine[k] != theirs[k]][:3],
                          "counts (target rows, keys, table)": (target.num_rows, len(mine), len(theirs))}
    return out


def test_killed_in_the_snapshot_and_in_the_changes_then_drained_the_targets_equal_the_tables(
        mariadb: Any, tmp_path: Path) -> None:
    db = "m_kill"
    mariadb.sql(f"DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`")
    mariadb.sql(SETUP, db)
    url = mariadb.url_for(db)
    lake = tmp_path / "lake"
    cmd = [*flinkish(), "mirror", "--from", mariadb.url, "--tables", f"{db}.*", "--to", str(lake),
           "--checkpoint", str(tmp_path / "meta"), "--trigger", "1s", "--source-option", "splitSize=300",
           "--source-option", "maxRowsPerTrigger=600", "--source-option", "snapshotRowsPerTrigger=600"]
    writer = Writer(url)
    writer.start()
    try:
        # Run 1: killed in the fifth epoch's commit, after the Delta versions, before Spark's commit log -- in the
        # snapshot (its log says so): the restart writes that epoch again.
        (tmp_path / "run1").mkdir()
        log = tmp_path / "run1.log"
        rc, out = ended(start(cmd, log, env={"FLINKISH_CRASH_AT": "sink.after_commit:5",
                                             "FLINKISH_CRASH_DIR": str(tmp_path / "run1")}), log)
        assert rc == 137 and "run the same command again" in out, out[-4000:]
        assert "tables snapshotted 3/3" not in out, out[-4000:]

        # Run 2: the same command continues the snapshot; once every table is snapshotted, the column is added and
        # the crash point armed (its hit counter one short): the next epoch with two tables is killed.
        (tmp_path / "run2").mkdir()
        log = tmp_path / "run2.log"
        run2 = start(cmd, log, env={"FLINKISH_CRASH_AT": f"{POINT}:1000000",
                                    "FLINKISH_CRASH_DIR": str(tmp_path / "run2")})
        wait_for("every table snapshotted", lambda: "tables snapshotted 3/3" in log.read_text(), run2, log)
        writer.add_column.set()
        (tmp_path / "run2" / f"{POINT}.hits").write_bytes(b"x" * 999_999)
        rc, out = ended(run2, log)
        assert rc == 137 and "run the same command again" in out, out[-4000:]

        # Run 3: the same command; a few epochs of changes, then the writer stops and the mirror drains.
        log = tmp_path / "run3.log"
        run3 = start(cmd, log)
        wait_for("2 epochs of run 3", lambda: len(re.findall(r"^epoch \d+:", log.read_text(), re.M)) >= 2, run3, log)
        writer.finish()
        drain(run3, log)
    finally:
        writer.stop.set()
    assert writer.transactions > 100
    assert differences(url, lake, db) == {}
    assert "extra" in source_rows(url, "orders")[0]
    mariadb.sql(f"DROP DATABASE IF EXISTS `{db}`")
