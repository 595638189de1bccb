"""flinkish.postgres on real Spark and the embedded PostgreSQL: both commit modes, upsert,
deletes, foreachBatch, and each configuration or target error (type, message, nothing written)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.connectors.postgres import PostgresSink
from flinkish_spark.connectors.postgres.connection import parse_url
from flinkish_spark.errors import ConfigError, DatabaseAccessError, DatabaseUnavailableError, TargetSchemaError
from flinkish_spark.sink.foreach_batch import transactional

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


def test_auto_picks_prepared_for_append_and_staged_for_upsert(spark, tmp_path: Path, pg_url: str) -> None:
    run(sequence(spark, str(tmp_path / "meta")), tmp_path, pg_url, table="events", createTable="true")
    target = json.loads((tmp_path / "cp" / "flinkish" / "sinks" / "out" / "_target.json").read_text())
    assert target["commitMode"] == "prepared" and target["commitModeOption"] == "auto"
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
