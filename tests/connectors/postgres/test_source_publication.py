"""``flinkish.postgres`` source: the publication it reads through never loses changes silently.

A partitioned table's changes are logged under its leaf partitions' names: the publication the
source creates publishes them as the partitioned table's (``publish_via_partition_root``). A
publication the user names (option ``publication``) must send every change of every row and
column of the table; one that does not -- only some operations, a row filter, a column list,
leaf names of a partitioned table -- is refused at ``load()`` with an error that names it and
says how to fix it, and nothing is created or written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

import flinkish_spark


def execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def load(spark: Any, url: str, tmp_path: Path, uid: str, **options: str) -> Any:
    reader = spark.readStream.format("flinkish.postgres")
    for k, v in {"uid": uid, "checkpoint": str(tmp_path / "meta"), "url": url, **options}.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(spark: Any, url: str, tmp_path: Path, uid: str, **options: str) -> None:
    q = (load(spark, url, tmp_path, uid, **options).writeStream.format("flinkish.parquet").option("uid", "out")
         .option("checkpoint", str(tmp_path / "meta")).option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    end = flinkish_spark.await_finished(q, timeout=180)
    assert q.exception() is None, q.exception()
    assert end != "timeout"


PARTITIONED = (
    "CREATE TABLE orders (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
    "CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')",
    "CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')",
)


def test_changes_of_a_partitioned_table_arrive(spark, pg_url: str, tmp_path: Path) -> None:
    execute(pg_url, *PARTITIONED, "INSERT INTO orders VALUES (1, 'eu', 'a'), (2, 'us', 'b')")
    run_available_now(spark, pg_url, tmp_path, "orders", table="orders")  # the snapshot
    execute(pg_url, "INSERT INTO orders VALUES (3, 'eu', 'c')", "UPDATE orders SET v = 'b2' WHERE id = 2",
            "DELETE FROM orders WHERE id = 1", "UPDATE orders SET region = 'us' WHERE id = 3")  # moves to another leaf
    run_available_now(spark, pg_url, tmp_path, "orders", table="orders")  # the changes
    rows = pq.read_table(str(tmp_path / "out")).to_pylist()
    assert sorted((r["id"], r["region"], r["v"]) for r in rows if r["_op"] == "r") == [(1, "eu", "a"), (2, "us", "b")]
    changes = sorted((r for r in rows if r["_op"] != "r"), key=lambda r: r["_lsn"])  # stable: WAL order within a transaction
    assert [(r["_op"], r["id"], r["region"], r["v"]) for r in changes] == [
        ("c", 3, "eu", "c"), ("u", 2, "us", "b2"), ("d", 1, "eu", None),
        ("d", 3, "eu", None), ("c", 3, "us", "c"),  # a row moved between partitions: a delete and an insert
    ]


@pytest.mark.both_postgres
def test_a_publication_that_would_miss_changes_is_refused_at_load(spark, pg_url: str, tmp_path: Path) -> None:
    execute(pg_url, "CREATE TABLE t (id int PRIMARY KEY, v text, n int)", *PARTITIONED,
            "CREATE PUBLICATION inserts_only FOR TABLE t WITH (publish = 'insert')",
            "CREATE PUBLICATION filtered FOR TABLE t WHERE (id > 10)",
            "CREATE PUBLICATION some_columns FOR TABLE t (id, v)",
            "CREATE PUBLICATION leaves FOR TABLE orders",
            "CREATE PUBLICATION other_table FOR TABLE orders WITH (publish_via_partition_root = true)")
    cases = {
        "inserts_only": r"publication 'inserts_only' does not publish update, delete, truncate.*"
                        r"ALTER PUBLICATION inserts_only SET \(publish = 'insert, update, delete, truncate'\)",
        "filtered": r"publication 'filtered' publishes only the rows of public.t WHERE.*id > 10.*"
                    r"ALTER PUBLICATION filtered SET TABLE public.t",
        "some_columns": r"publication 'some_columns' publishes only the columns id, v of public.t.*misses n.*"
                        r"ALTER PUBLICATION some_columns SET TABLE public.t",
        "other_table": r"publication 'other_table' does not publish public.t.*ALTER PUBLICATION other_table ADD TABLE public.t",
    }
    for publication, message in cases.items():
        with pytest.raises(Exception, match=message):
            load(spark, pg_url, tmp_path / publication, "t", table="t", publication=publication)
    with pytest.raises(Exception, match=r"public.orders is partitioned.*publication 'leaves' publishes the changes under "
                                        r"the names of its partitions.*ALTER PUBLICATION leaves SET \(publish_via_partition_root = true\)"):
        load(spark, pg_url, tmp_path / "leaves", "o", table="orders", publication="leaves")
    with psycopg.connect(pg_url) as conn:  # nothing created on the server, nothing in the checkpoints
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()[0] == 0
    assert not list(tmp_path.glob("*/meta/sources/*/*.parquet"))
    # A publication that sends everything is used as it is (and never dropped).
    load(spark, pg_url, tmp_path / "good", "o", table="orders", publication="other_table")


def test_a_truncate_of_another_table_in_a_given_publication_does_not_stop_the_source(spark, pg_url: str, tmp_path: Path) -> None:
    from pyspark.sql.types import StructType

    from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource

    execute(pg_url, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE TABLE other (id int PRIMARY KEY)",
            "INSERT INTO other VALUES (1)", "CREATE PUBLICATION both_tables FOR TABLE t, other")
    src = PostgresSourceDataSource({"uid": "tr", "checkpoint": str(tmp_path / "meta"), "url": pg_url, "table": "t",
                                    "startup": "changes", "publication": "both_tables"})
    src.setup_source()
    enum = src.create_enumerator()
    (changes,) = enum.discover(set())
    execute(pg_url, "TRUNCATE other", "INSERT INTO t VALUES (1, 'a')")
    reader = src.create_reader(StructType.fromDDL(src.table_info().spark_ddl()))
    rows = [r for b in reader.read(changes, 0, enum.extent(changes, 0).available) for r in b.to_pylist()]
    assert [(r["_op"], r["id"], r["v"]) for r in rows] == [("c", 1, "a")]
    execute(pg_url, "TRUNCATE t")  # the source's own table: an error, as before
    with pytest.raises(Exception, match=r"public.t was truncated"):
        list(reader.read(changes, 0, enum.extent(changes, 0).available))
