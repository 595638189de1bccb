"""The mirror demo's database: a small shop on the embedded PostgreSQL, and a writer that keeps changing it.

* :data:`SETUP` -- ``customers``, ``products`` and ``orders``, a primary key each, a few thousand rows;
* :func:`add_column` / :func:`create_table` -- what the demo does while the mirror runs: ``ALTER TABLE
  customers ADD COLUMN tier`` and a new table ``reviews`` (which matches ``public.*``);
* the writer (:class:`Writer`; the demo runs ``python -m flinkish_spark.demo.shop writer URL STOP_FILE``):
  small transactions of inserts, updates and deletes on every table until ``STOP_FILE`` exists -- once the
  column and the new table exist it writes them too -- then prints what it did (:data:`COUNTS_PREFIX`);
* ``python -m flinkish_spark.demo.shop [serve --port N]``: the database and its writer on their own until
  Ctrl-C, to try ``flinkish mirror`` on from another shell (README, "Quick start"). Enter in its terminal, or
  ``kill -USR1 <pid>``, pauses the writer (between two transactions: the tables stay still, e.g. for
  ``flinkish mirror compare``) and resumes it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, Callable

#: The tables the demo starts with (the writer also changes the one :func:`create_table` adds).
TABLES = ("public.customers", "public.products", "public.orders")
NEW_TABLE = "public.reviews"
NEW_COLUMN = ("public.customers", "tier")

SETUP = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text, city text,
                        signed_up timestamptz NOT NULL);
CREATE TABLE products (sku text PRIMARY KEY, title text NOT NULL, price numeric(10,2) NOT NULL, stock int NOT NULL,
                       tags text[]);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, sku text NOT NULL, quantity int NOT NULL,
                     total numeric(12,2) NOT NULL, status text NOT NULL, ordered_at timestamptz NOT NULL);
INSERT INTO customers SELECT g, 'customer ' || g, 'c' || g || '@example.com',
  (ARRAY['Berlin', 'Lisbon', 'Osaka', 'Lima', 'Accra'])[1 + g % 5],
  timestamptz '2024-01-01 00:00:00+00' + g * interval '37 minutes' FROM generate_series(1, 2000) g;
INSERT INTO products SELECT 'sku-' || g, 'product ' || g, (g % 90) + 0.99, 100 + g % 50,
  ARRAY['tag' || g % 7, 'tag' || g % 3] FROM generate_series(1, 300) g;
INSERT INTO orders SELECT g, 1 + g % 2000, 'sku-' || (1 + g % 300), 1 + g % 4, ((g % 90) + 0.99) * (1 + g % 4),
  'shipped', timestamptz '2024-06-01 00:00:00+00' + g * interval '11 minutes' FROM generate_series(1, 5000) g;
"""

#: The writer's last line: ``WRITER {"transactions": ..., "inserts": ..., "updates": ..., "deletes": ...}``.
COUNTS_PREFIX = "WRITER "


def setup(conn: Any) -> dict[str, int]:
    """Create and fill the shop's tables (psycopg, autocommit); rows per table."""
    conn.execute(SETUP)
    return row_counts(conn, TABLES)


def create_database(pg: Any) -> tuple[str, dict[str, int]]:
    """The database ``shop`` with its tables on the embedded server ``pg``: its URL and rows per table."""
    import psycopg

    with psycopg.connect(pg.uri, autocommit=True) as conn:
        conn.execute("CREATE DATABASE shop")
    url = str(pg.uri_for("shop"))
    with psycopg.connect(url, autocommit=True) as conn:
        return url, setup(conn)


def row_counts(conn: Any, tables: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for t in tables:
        row = conn.execute(f"SELECT count(*) FROM {t}").fetchone()
        out[t] = int(row[0]) if row else 0
    return out


def add_column(conn: Any) -> str:
    """``ALTER TABLE customers ADD COLUMN tier text`` (no default: old rows stay null, as in the target)."""
    sql = "ALTER TABLE customers ADD COLUMN tier text"
    conn.execute(sql)
    return sql


def create_table(conn: Any) -> str:
    """A new table that matches ``public.*``, with rows: the running mirror snapshots and then follows it."""
    sql = ("CREATE TABLE reviews (id bigint PRIMARY KEY, order_id bigint NOT NULL, stars smallint NOT NULL, "
           "body text)")
    conn.execute(sql)
    conn.execute("INSERT INTO reviews SELECT g, g * 7, 1 + g % 5, 'review ' || g FROM generate_series(1, 400) g")
    return sql + " + 400 rows"


class Writer:
    """One small transaction per :meth:`step` on a random table: what an application does to its database."""

    def __init__(self, conn: Any, seed: int = 18) -> None:
        self.conn = conn
        self.rnd = random.Random(seed)
        self.next_id = 1_000_000
        self.counts = {"transactions": 0, "inserts": 0, "updates": 0, "deletes": 0}
        self.has_tier = self.has_reviews = False
        self._looked = 0.0

    def _exec(self, kind: str, sql: str, params: tuple[Any, ...] = ()) -> None:
        cur = self.conn.execute(sql, params)
        self.counts[kind] += max(cur.rowcount, 0)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _look(self) -> None:
        """Once a second: whether the demo added the column and the table yet."""
        if time.monotonic() - self._looked < 1.0:
            return
        self._looked = time.monotonic()
        self.has_tier = bool(self.conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('public.customers') AND attname = 'tier' "
            "AND NOT attisdropped").fetchone())
        self.has_reviews = bool(self.conn.execute("SELECT to_regclass('public.reviews')").fetchone()[0])

    def step(self) -> None:
        self._look()
        r, k = self.rnd.random(), self.rnd.randint(1, 5000)
        with self.conn.transaction():
            if r < 0.30:  # a new order, the product's stock goes down
                sku = f"sku-{1 + k % 300}"
                self._exec("inserts", "INSERT INTO orders SELECT %s, %s, sku, 2, price * 2, 'new', now() "
                           "FROM products WHERE sku = %s", (self._new_id(), 1 + k % 2000, sku))
                self._exec("updates", "UPDATE products SET stock = stock - 2 WHERE sku = %s", (sku,))
            elif r < 0.50:
                self._exec("updates", "UPDATE orders SET status = 'shipped' WHERE id = %s", (k,))
            elif r < 0.58:  # a cancelled order
                self._exec("deletes", "DELETE FROM orders WHERE id = %s", (k,))
            elif r < 0.68:
                self._exec("updates", "UPDATE products SET price = price + 0.25, tags = tags || 'sale'::text "
                           "WHERE sku = %s", (f"sku-{1 + k % 300}",))
            elif r < 0.76:
                self._exec("inserts", "INSERT INTO customers VALUES (%s, 'new customer', NULL, 'Quito', now())",
                           (self._new_id(),))
            elif r < 0.88:
                tier = ", tier = %s" if self.has_tier else ""
                params = (f"c{k}@example.org", *((["bronze", "silver", "gold"][k % 3],) if self.has_tier else ()),
                          1 + k % 2000)
                self._exec("updates", f"UPDATE customers SET email = %s{tier} WHERE id = %s", params)
            elif r < 0.91:
                self._exec("deletes", "DELETE FROM customers WHERE id = %s", (1 + k % 2000,))
            elif self.has_reviews:
                if r < 0.97:
                    self._exec("inserts", "INSERT INTO reviews VALUES (%s, %s, %s, 'fine')",
                               (self._new_id(), k, 1 + k % 5))
                else:
                    self._exec("deletes", "DELETE FROM reviews WHERE id = %s", (1 + k % 400,))
            else:
                self._exec("updates", "UPDATE orders SET quantity = quantity + 1 WHERE id = %s", (k,))
        self.counts["transactions"] += 1


def write(url: str, stop: Callable[[], bool], pause: float = 0.01,
          paused: Callable[[], bool] = lambda: False, say: Callable[[str], None] = lambda text: None) -> dict[str, int]:
    """Run a :class:`Writer` on the database at ``url`` until ``stop()``, idle while ``paused()``; what it did.
    ``say`` gets ``writer paused ...`` once no transaction is open any more, and ``writer resumed``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        writer = Writer(conn)
        idle = False
        while not stop():
            if paused() != idle:
                idle = not idle
                say(f"writer paused after {writer.counts['transactions']} transactions: the tables stay as they are"
                    if idle else "writer resumed")
            if idle:
                time.sleep(0.05)
                continue
            writer.step()
            time.sleep(pause)
    return writer.counts


class PauseToggle:
    """Paused or not, toggled by SIGUSR1 and -- when stdin is a terminal -- by Enter."""

    def __init__(self) -> None:
        import signal
        import threading

        self.paused = False
        signal.signal(signal.SIGUSR1, lambda signum, frame: self.toggle())
        if sys.stdin is not None and sys.stdin.isatty():
            threading.Thread(target=self._read_enter, name="shop-pause", daemon=True).start()

    def toggle(self) -> None:
        self.paused = not self.paused

    def _read_enter(self) -> None:
        for _ in sys.stdin:
            self.toggle()


def serve(port: int | None, pause: float) -> int:
    """The shop database on an embedded PostgreSQL with its writer, until Ctrl-C or SIGTERM: a source to try
    ``flinkish mirror`` on from another shell (the README's example)."""
    import signal

    from flinkish_spark.embedded.postgres import temporary_postgres

    stopping: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: stopping.append(signum))
    toggle = PauseToggle()
    with temporary_postgres("flinkish-shop-", port=port) as pg:
        url, counts = create_database(pg)
        print(f"shop database (embedded PostgreSQL {pg.version}): {url}\n  "
              + ", ".join(f"{t} {n} rows" for t, n in counts.items())
              + "; a writer changes them until Ctrl-C (which also stops the server and deletes its data).\n"
              f"  Enter here (or kill -USR1 {os.getpid()}) pauses the writer and resumes it: a still source to "
              "compare the mirror with.\n"
              "Mirror it into local Delta tables from another shell (Ctrl-C there stops the mirror with drain):\n"
              f"  flinkish mirror --from {url} --tables 'public.*' --to ./lake --checkpoint ./mirror-meta",
              flush=True)
        done = write(url, lambda: bool(stopping), pause, lambda: toggle.paused, lambda text: print(text, flush=True))
        print(f"writer: {done['transactions']} transactions; server stopped", flush=True)
    return 0


def main(argv: list[str]) -> int:
    """``python -m flinkish_spark.demo.shop [--port N]``: :func:`serve`. ``... writer URL STOP_FILE``: write
    until STOP_FILE exists, then print :data:`COUNTS_PREFIX` and the counts (the demo's writer process)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flinkish_spark.demo.shop", description=__doc__.split("\n")[0])
    parser.add_argument("--pause", type=float, default=0.01, help="seconds between the writer's transactions")
    sub = parser.add_subparsers(dest="mode")
    s = sub.add_parser("serve", help="the shop database and its writer until Ctrl-C (the default)")
    s.add_argument("--port", type=int, help="the server's TCP port on 127.0.0.1 (default: a free one)")
    w = sub.add_parser("writer", help="the writer on an existing shop database, until STOP_FILE exists")
    w.add_argument("url")
    w.add_argument("stop_file")
    args = parser.parse_args(argv)
    if args.mode == "writer":
        counts = write(args.url, lambda: os.path.exists(args.stop_file), args.pause)
        print(COUNTS_PREFIX + json.dumps(counts), flush=True)
        return 0
    return serve(getattr(args, "port", None), args.pause)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
