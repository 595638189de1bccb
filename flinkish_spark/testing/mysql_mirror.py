"""A MySQL/MariaDB workload for ``flinkish mirror --from mysql://`` tests, and what a user compares after it: each
target (Delta, Iceberg or PostgreSQL) against ``SELECT *`` of its source table.

:data:`SETUP` makes three keyed tables (one with a composite key); :class:`Writer` changes them all the time in
transactions of several statements (inserts, updates, deletes, key moves), and on request adds a column
(``ALTER TABLE orders ADD COLUMN extra int``) and creates a new matching table ``fresh`` that it changes from then
on. It rides through a server restart: a lost connection is opened again (the transaction it was in is whatever
the server recovered; the comparison reads the tables at the end, so either outcome is fine).
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import closing
from typing import Any, Callable, Optional

#: Each table's primary key (``fresh`` exists once the writer created it).
TABLES = {"orders": ("id",), "customers": ("k",), "order_lines": ("order_id", "line"), "fresh": ("id",)}
SETUP = """
CREATE TABLE orders (id int PRIMARY KEY, name varchar(40), amount decimal(12,2), f double) ENGINE=InnoDB;
CREATE TABLE customers (k varchar(20) PRIMARY KEY, city varchar(40), n bigint) ENGINE=InnoDB;
CREATE TABLE order_lines (order_id int, line int, qty int, note text, PRIMARY KEY (order_id, line)) ENGINE=InnoDB;
INSERT INTO orders SELECT seq, CONCAT('o', seq), seq / 100, seq * 0.1 FROM seq_1_to_3000;
INSERT INTO customers SELECT CONCAT('c', seq), CONCAT('city', seq % 17), seq * 1000003 FROM seq_1_to_1500;
INSERT INTO order_lines SELECT seq DIV 3 + 1, seq % 3, seq % 11, REPEAT('x', seq % 50) FROM seq_0_to_2999;
"""
FRESH = """CREATE TABLE fresh (id int PRIMARY KEY, v text, n bigint, amount decimal(9,3)) ENGINE=InnoDB;
INSERT INTO fresh SELECT seq, CONCAT('f', seq), seq * 7, seq / 8 FROM seq_1_to_800"""

Rows = dict[tuple[Any, ...], dict[str, Any]]


class Writer(threading.Thread):
    """Changes every table until stopped. ``ddl`` (an event): ``ALTER TABLE orders ADD COLUMN extra int`` and the new
    table ``fresh`` once, then the new column and ``fresh`` are written too. ``pause``: no transaction while set."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.ddl, self.pause = url, threading.Event(), threading.Event(), threading.Event()
        self.transactions, self.reconnects, self.ddl_done = 0, 0, threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        import pymysql

        from flinkish_spark.connectors.mysql.connection import connect, parse_url
        from flinkish_spark.errors import DatabaseUnavailableError

        rnd, next_id, give_up = random.Random(29), 1_000_000, 0.0
        while not self.stop.is_set():
            try:
                with closing(connect(parse_url(self.url))) as conn, conn.cursor() as cur:
                    cur.execute("SET autocommit = 1")
                    give_up = 0.0
                    while not self.stop.is_set():
                        if self.pause.is_set():
                            time.sleep(0.05)
                            continue
                        if self.ddl.is_set() and not self.ddl_done.is_set():
                            cur.execute("ALTER TABLE orders ADD COLUMN extra int")
                            for statement in FRESH.split(";\n"):
                                cur.execute(statement)
                            self.ddl_done.set()
                        self._transaction(cur, rnd.randint(1, 3000), next_id)
                        next_id += 2
                        self.transactions += 1
                        time.sleep(0.01)
            except (pymysql.err.OperationalError, DatabaseUnavailableError) as e:  # a restart: connect again
                give_up = give_up or time.monotonic() + 120
                if time.monotonic() > give_up:
                    self.error = e
                    return
                self.reconnects += 1
                time.sleep(0.2)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.error = e
                return

    def _transaction(self, cur: Any, k: int, next_id: int) -> None:
        altered = self.ddl_done.is_set()
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
            cur.execute("INSERT INTO fresh VALUES (%s, 'w', %s, 0.125)", (next_id, k))
            cur.execute("UPDATE fresh SET v = CONCAT(v, '+'), amount = amount + 1 WHERE id = %s", (k % 800,))
            cur.execute("DELETE FROM fresh WHERE id = %s", ((k * 3) % 800,))
        cur.execute("COMMIT")

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        assert self.error is None, repr(self.error)


def source_rows(url: str, table: str) -> tuple[list[str], Rows]:
    """``SELECT *`` of ``table``: its columns and its rows by primary key."""
    from flinkish_spark.connectors.mysql.connection import connect, parse_url

    with closing(connect(parse_url(url))) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM `{table}`")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    return names, {tuple(r[k] for k in TABLES[table]): r for r in rows}


def differences(url: str, read: Callable[[str], Optional[list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per table, what its target (``read(table)``: its rows as a reader of the format sees them, None when there is
    no target) has other than the table: missing columns, missing, extra or wrong rows, a key twice."""
    out: dict[str, Any] = {}
    for table in TABLES:
        names, theirs = source_rows(url, table)
        rows = read(table)
        if rows is None:
            out[table] = "no target"
            continue
        missing_columns = [n for n in names if rows and n not in rows[0]]
        if missing_columns:
            out[table] = {"columns missing": missing_columns}
            continue
        mine = {tuple(r[k] for k in TABLES[table]): {n: r[n] for n in names} for r in rows}
        if mine != theirs or len(rows) != len(mine):
            out[table] = {"missing": [k for k in theirs if k not in mine][:5],
                          "extra": [k for k in mine if k not in theirs][:5],
                          "wrong": [(k, mine[k], theirs[k]) for k in theirs if k in mine and mine[k] != theirs[k]][:3],
                          "counts (target rows, keys, table)": (len(rows), len(mine), len(theirs))}
    return out


def delta_rows(root: str, database: str) -> Callable[[str], Optional[list[dict[str, Any]]]]:
    """The routed Delta target ``root/<database>/<table>`` as delta-rs reads it (deletion vectors applied)."""
    import os

    import deltalake
    import pyarrow as pa

    def read(table: str) -> Optional[list[dict[str, Any]]]:
        path = os.path.join(root, database, table)
        if not os.path.isdir(os.path.join(path, "_delta_log")):
            return None
        return pa.table(deltalake.DeltaTable(path).scan()).to_pylist()
    return read


def iceberg_rows(checkpoint: str, database: str) -> Callable[[str], Optional[list[dict[str, Any]]]]:
    """The routed Iceberg target ``mirror.<database>_<table>`` of ``flinkish mirror --format iceberg``'s default
    catalog (SQLite under ``<checkpoint>/iceberg``), as pyiceberg reads it (position deletes applied)."""
    def read(table: str) -> Optional[list[dict[str, Any]]]:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("flinkish", uri=f"sqlite:///{checkpoint}/iceberg/catalog.db",
                             warehouse=f"file://{checkpoint}/iceberg/warehouse")
        name = f"mirror.{database}_{table}"
        if not catalog.table_exists(name):
            return None
        return catalog.load_table(name).scan().to_arrow().to_pylist()
    return read


def postgres_rows(url: str, database: str) -> Callable[[str], Optional[list[dict[str, Any]]]]:
    """The routed PostgreSQL target ``<database>.<table>`` (``--to postgresql://...``), read with psycopg."""
    import psycopg
    from psycopg.rows import dict_row

    def read(table: str) -> Optional[list[dict[str, Any]]]:
        with psycopg.connect(url, row_factory=dict_row) as conn:
            found = conn.execute("SELECT to_regclass(%s) AS t", (f'"{database}"."{table}"',)).fetchone()
            if found is None or found["t"] is None:
                return None
            return conn.execute(f'SELECT * FROM "{database}"."{table}"').fetchall()
    return read
