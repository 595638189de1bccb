"""The mirror demo's database: a small shop on the embedded PostgreSQL, and a writer that keeps changing it.

* :data:`SETUP` -- ``customers``, ``products`` and ``orders``, a primary key each, a few thousand rows;
* :func:`add_column` / :func:`create_table` -- what the demo does while the mirror runs: ``ALTER TABLE
  customers ADD COLUMN tier`` and a new table ``reviews`` (which matches ``public.*``);
* the writer (``python -m flinkish_spark.demo.shop URL STOP_FILE``): small transactions of inserts, updates
  and deletes on every table until ``STOP_FILE`` exists -- once the column and the new table exist it writes
  them too -- then prints what it did (:data:`COUNTS_PREFIX`) and exits.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

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


def main(argv: list[str]) -> int:
    """``python -m flinkish_spark.demo.shop URL STOP_FILE [PAUSE_S]``: write until STOP_FILE exists."""
    import psycopg

    url, stop_file = argv[0], argv[1]
    pause = float(argv[2]) if len(argv) > 2 else 0.01
    with psycopg.connect(url, autocommit=True) as conn:
        writer = Writer(conn)
        while not os.path.exists(stop_file):
            writer.step()
            time.sleep(pause)
    print(COUNTS_PREFIX + json.dumps(writer.counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
