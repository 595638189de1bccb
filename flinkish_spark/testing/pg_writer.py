"""A process that changes a PostgreSQL table while a mirror pipeline runs, until a stop file exists.

``python -m flinkish_spark.testing.pg_writer URL STOP_FILE [--table src] [--keys 60000] [--hot 20] [--seed 5]``

The table is ``(id bigint PRIMARY KEY, v text, n int)``. Each transaction is one of:
an insert of a new key; three updates of one of ``--hot`` keys (the same keys many times
per epoch); an update of a random key; a delete of a random key; a key change (an update
of ``id``, which a change stream carries as a delete and an insert).
"""

from __future__ import annotations

import argparse
import os
import random
import time


def main(argv: list[str] | None = None) -> None:
    import psycopg
    from psycopg import sql

    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("stop_file")
    ap.add_argument("--table", default="src")
    ap.add_argument("--keys", type=int, default=60_000)
    ap.add_argument("--hot", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--pause", type=float, default=0.004)
    args = ap.parse_args(argv)
    rnd = random.Random(args.seed)
    table = sql.Identifier(args.table)
    next_id = 10_000_000
    weights = [("insert", 0.25), ("hot", 0.30), ("update", 0.20), ("delete", 0.18), ("rekey", 0.07)]
    with psycopg.connect(args.url, autocommit=True) as conn:
        while not os.path.exists(args.stop_file):
            kind = rnd.choices([k for k, _ in weights], [w for _, w in weights])[0]
            k = rnd.randint(1, args.keys)
            with conn.transaction():
                if kind == "insert":
                    conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(table), (next_id, "new", next_id % 97))
                    next_id += 1
                elif kind == "hot":
                    hot = rnd.randint(1, args.hot)
                    for _ in range(3):
                        conn.execute(sql.SQL("UPDATE {} SET v = v || '+', n = n + 1 WHERE id = %s").format(table), (hot,))
                elif kind == "update":
                    conn.execute(sql.SQL("UPDATE {} SET v = v || '*', n = n * 2 WHERE id = %s").format(table), (k,))
                elif kind == "delete":
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), (k,))
                else:
                    conn.execute(sql.SQL("UPDATE {} SET id = %s WHERE id = %s").format(table), (next_id, k))
                    next_id += 1
            time.sleep(args.pause)


if __name__ == "__main__":
    main()
