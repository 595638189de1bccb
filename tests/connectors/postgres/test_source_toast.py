"""``flinkish.postgres`` source: an update that leaves a TOASTed value unchanged, after the remedy
docs/postgres-source.md gives (``REPLICA IDENTITY FULL``), arrives as a full row.

pgoutput sends an unchanged value that is stored out of line as 'u' ("unchanged TOASTed value",
no data) in the new row; with REPLICA IDENTITY FULL the old row carries it. The value here is
10 kB of random hex in a column with ``STORAGE EXTERNAL``: out of line and not compressed, so it
really is TOASTed (checked), as a large document or JSON column would be.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq

import flinkish_spark


def run_available_now(spark: Any, url: str, tmp_path: Path) -> None:
    df = (spark.readStream.format("flinkish.postgres").option("uid", "docs").option("checkpoint", str(tmp_path / "meta"))
          .option("url", url).option("table", "public.docs").load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("checkpoint", str(tmp_path / "meta"))
         .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(availableNow=True).start())
    end = flinkish_spark.await_finished(q, timeout=180)
    assert q.exception() is None, q.exception()
    assert end != "timeout"


def test_update_of_another_column_carries_the_unchanged_toasted_value(spark, pg_url: str, tmp_path: Path) -> None:
    big = os.urandom(5_000).hex()  # 10 kB
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, n int, body text)")
        conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE docs REPLICA IDENTITY FULL")  # what docs/postgres-source.md says to do
        conn.execute("INSERT INTO docs VALUES (1, 0, %s), (2, 0, 'small')", (big,))
        toast = conn.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'docs'::regclass").fetchone()[0]
        assert conn.execute(f"SELECT count(*) FROM {toast}").fetchone()[0] > 0  # really stored out of line

    run_available_now(spark, pg_url, tmp_path)  # the snapshot; the slot stays for the next run
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE docs SET n = 1 WHERE id = 1")  # body unchanged: sent as 'u'
        conn.execute("UPDATE docs SET n = 2, body = 'changed' WHERE id = 2")
    run_available_now(spark, pg_url, tmp_path)  # the changes

    rows = pq.read_table(str(tmp_path / "out")).to_pylist()
    updates = sorted((r["id"], r["n"], r["body"]) for r in rows if r["_op"] == "u")
    assert updates == [(1, 1, big), (2, 2, "changed")]
