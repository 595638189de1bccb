"""flinkish.postgres on real Spark and the embedded PostgreSQL: both commit modes, auto's
choice (log file and flinkish inspect), upsert, and the bounded pipeline of docs/postgres.md."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.cli import main

LENGTHS = [700, 300]


def sequence(spark, meta: str, **options: str):
    r = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", meta)
         .option("rowsPerSplit", ",".join(map(str, LENGTHS))).option("maxRowsPerTrigger", "400"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def start(df, tmp_path: Path, url: str, **options: str):
    w = (df.writeStream.format("flinkish.postgres").option("uid", "out").option("url", url)
         .option("checkpointLocation", str(tmp_path / "cp")))
    for k, v in options.items():
        w = w.option(k, v)
    return w.trigger(availableNow=True).start()


def run(df, tmp_path: Path, url: str, **options: str) -> None:
    q = start(df, tmp_path, url, **options)
    q.awaitTermination()
    assert q.exception() is None, q.exception()


def query(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(sql).fetchall()


def leftovers(url: str) -> tuple[list, list]:
    """Prepared transactions and staged rows that survive: both must be empty after a query."""
    prepared = query(url, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
    staged = []
    for (name,) in query(url, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'flinkish_staging%'"):
        staged += query(url, f'SELECT * FROM "{name}"')
    return prepared, staged


@pytest.mark.both_postgres
@pytest.mark.parametrize("commit_mode", ["prepared", "staged"])
def test_append_is_exactly_once_in_both_commit_modes(spark, tmp_path: Path, pg_url: str, commit_mode: str) -> None:
    run(sequence(spark, str(tmp_path / "meta")), tmp_path, pg_url, table="public.events", createTable="true",
        commitMode=commit_mode)
    rows = query(pg_url, "SELECT split, seq FROM events")
    assert collections.Counter(rows) == expected()
    assert leftovers(pg_url) == ([], [])
    commits = query(pg_url, "SELECT DISTINCT epoch, commit_mode FROM flinkish_commits WHERE sink_uid = 'out' ORDER BY 1")
    assert [m for _, m in commits] == [commit_mode] * len(commits) and len(commits) >= 3  # 1000 rows, 400 per epoch
    target = json.loads((tmp_path / "cp" / "flinkish" / "sinks" / "out" / "_target.json").read_text())
    assert target["commitMode"] == commit_mode and target["table"] == "public.events"


def test_auto_picks_prepared_for_append_and_staged_for_upsert(spark, tmp_path: Path, pg_url: str, capsys) -> None:
    run(sequence(spark, str(tmp_path / "meta")), tmp_path, pg_url, table="events", createTable="true")
    target = json.loads((tmp_path / "cp" / "flinkish" / "sinks" / "out" / "_target.json").read_text())
    assert target["commitMode"] == "prepared" and target["commitModeOption"] == "auto"
    assert main(["inspect", str(tmp_path / "cp" / "flinkish"), "--json"]) == 0  # flinkish inspect shows the choice
    shown = json.loads(capsys.readouterr().out)["sinkTargets"]["out"]
    assert shown["commitMode"] == "prepared" and shown["url"] == pg_url
    df = sequence(spark, str(tmp_path / "meta2"))
    q = (df.writeStream.format("flinkish.postgres").option("uid", "up").option("url", pg_url).option("table", "ups")
         .option("createTable", "true").option("mode", "upsert").option("key", "split")
         .option("checkpointLocation", str(tmp_path / "cp2")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None
    target = json.loads((tmp_path / "cp2" / "flinkish" / "sinks" / "up" / "_target.json").read_text())
    assert target["commitMode"] == "staged"
    # upsert keeps the last row per key: the highest seq of each split
    assert sorted(query(pg_url, "SELECT split, seq FROM ups")) == [(0, 699), (1, 299)]
    assert leftovers(pg_url) == ([], [])


def test_docs_bounded_pipeline_ends_by_itself(spark, tmp_path: Path, pg_url: str) -> None:
    """docs/postgres.md: a bounded source under a processing-time trigger; the query ends by itself."""
    import flinkish_spark

    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq")
          .option("checkpoint", str(tmp_path / "meta")).option("rowsPerSplit", "5000,5000").load())
    query = (df.writeStream.format("flinkish.postgres")
             .option("uid", "events").option("url", pg_url)
             .option("table", "public.events").option("createTable", "true")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="2 seconds").start())
    assert flinkish_spark.await_finished(query, timeout=240) != "timeout"
    assert not query.isActive and query.exception() is None
    assert query_rows(pg_url) == [(10000, 10000)]


def query_rows(url: str) -> list[tuple]:
    return query(url, "SELECT count(*), count(DISTINCT (split, seq)) FROM events")


def test_one_run_id_for_every_batch_of_a_query(tmp_path: Path, pg_url: str) -> None:
    # Spark keeps one (pickled) data source instance per query and asks it for a writer every
    # micro-batch. Each writer must commit as the same run: a new run id per batch made every
    # commit wait out the previous batch's lease (5.5 s per epoch) as if another run held it.
    import pickle

    from pyspark.sql.types import LongType, StructField, StructType

    from flinkish_spark.connectors.postgres.datasource import PostgresDataSource

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE TABLE public.runs (seq bigint)")
    schema = StructType([StructField("seq", LongType())])
    source = PostgresDataSource({"uid": "out", "url": pg_url, "table": "public.runs", "checkpoint": str(tmp_path / "meta")})
    writers = [pickle.loads(pickle.dumps(source)).streamWriter(schema, False) for _ in range(2)]
    assert writers[0].source.run_id == writers[1].source.run_id == source.run_id
