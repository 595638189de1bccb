"""``flinkish mirror compare``, a subprocess as a user runs it, against Delta, Iceberg and PostgreSQL targets written
without Spark by the routing sinks themselves -- made from the same options the mirror gives them
(``MirrorConfig.sink_options()`` into the sink's data source) and fed the stream rows the source would send."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.mirror.cli import add_parser, config_of
from flinkish_spark.mirror.compare import source_rows
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.stream_rows import ARROW, StreamBuilder

SETUP = """
CREATE TABLE c_a (id int PRIMARY KEY, v text);
CREATE TABLE c_b (k text PRIMARY KEY, n numeric(12,2));
CREATE TABLE other (id int PRIMARY KEY);
INSERT INTO c_a SELECT g, 'a' || g FROM generate_series(1, 20) g;
INSERT INTO c_b SELECT 'k' || g, g / 4.0 FROM generate_series(1, 5) g;
"""


def mirror_args(fmt: str, url: str, target_url: str, tmp_path: Path) -> list[str]:
    to = {"delta": [str(tmp_path / "lake")], "iceberg": ["mirror.{schema}_{table}", "--format", "iceberg"],
          "postgres": [target_url, "--sink-option", "table=mirror.{schema}_{table}"]}[fmt]
    return ["--from", url, "--tables", "public.c_*", "--to", *to, "--checkpoint", str(tmp_path / "meta")]


def write_epoch(args: list[str], epoch: int, stream: StreamBuilder) -> None:
    """One epoch of ``stream``'s rows into the mirror's targets, through the sink ``flinkish mirror ARGS`` runs."""
    import argparse

    from pyspark.sql.pandas.types import from_arrow_schema

    from flinkish_spark.connectors.delta.sink import DeltaSinkDataSource
    from flinkish_spark.connectors.iceberg.sink import IcebergSinkDataSource
    from flinkish_spark.connectors.postgres.sink import PostgresSinkDataSource

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers()).set_defaults()
    config = config_of(parser.parse_args(["mirror", *args]))
    kind = {"delta": DeltaSinkDataSource, "iceberg": IcebergSinkDataSource, "postgres": PostgresSinkDataSource}
    source = kind[config.format](config.sink_options())
    sink = source.sink(from_arrow_schema(ARROW))
    batch = stream.batch()
    prepared = [sink.prepare(iter(batch.to_batches()), PrepareContext(source.uid, epoch, 0, 0))]
    commit_epoch(sink, source.decision_log(), epoch, prepared, "run")


def compare(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "mirror", "compare", *args],
                          capture_output=True, text=True, timeout=120)



@pytest.mark.parametrize("fmt", ["delta", "iceberg", "postgres"])
def test_compare_names_what_differs_per_table_and_exits_0_once_all_are_equal(fmt: str, pg_url: str, target_url: str,
                                                                             tmp_path: Path) -> None:
    if fmt != "postgres":
        pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
        (a, a_rows), (b, b_rows) = source_rows(conn, "public.c_a"), source_rows(conn, "public.c_b")
    args = mirror_args(fmt, pg_url, target_url, tmp_path)
    nothing = compare(args)  # no target yet
    assert nothing.returncode == 1 and "public.c_a 20 - 20 0 0 no target" in " ".join(nothing.stdout.split()), \
        nothing.stdout + nothing.stderr

    stale = StreamBuilder()
    stale.snapshot(a, [json.loads(r) for r in a_rows[:-1]] + [{**json.loads(a_rows[-1]), "v": "stale"}])
    stale.snapshot(b, [json.loads(r) for r in b_rows[:-1]])  # the last row of c_b not mirrored
    write_epoch(args, 0, stale)
    out = compare(args)
    lines = [" ".join(ln.split()) for ln in out.stdout.splitlines()]
    assert out.returncode == 1, out.stdout + out.stderr
    assert lines[0] == "table source rows target rows missing extra different result"
    assert lines[1] == "public.c_a 20 20 0 0 1 1 different (e.g. (20,))", lines
    assert lines[2] == "public.c_b 5 4 1 0 0 1 missing (e.g. ('k5',))", lines
    assert lines[3] == "flinkish mirror compare: 2 of 2 tables differ from their source" and len(lines) == 4

    caught_up = StreamBuilder()
    caught_up.transaction((a, "u", json.loads(a_rows[-1])), (b, "c", json.loads(b_rows[-1])))
    write_epoch(args, 1, caught_up)
    out = compare(args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "flinkish mirror compare: all 2 tables equal to their source"
    assert "other" not in out.stdout


def test_compare_of_a_pipeline_file_and_a_bad_flag(pg_url: str, tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(f"source:\n  type: postgres\n  url: {pg_url}\n  tables: public.c_a\nsink:\n  type: delta\n"
                        f"  path: {tmp_path / 'lake'}\npipeline:\n  checkpoint: {tmp_path / 'meta'}\n")
    out = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "mirror", "compare", str(pipeline)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "public.c_a" in out.stdout and "no target" in out.stdout, out.stdout + out.stderr
    bad = compare(["--from", pg_url, "--tables", "public.c_*", "--to", str(tmp_path / "lake"), "--format", "parquet"])
    assert bad.returncode == 2 and "invalid choice: 'parquet'" in bad.stderr


def test_compare_of_a_mysql_mirror_reads_the_tables_with_keys_as_the_mysql_source_does(mariadb, tmp_path: Path) -> None:
    """``--from mysql://``: each matching MariaDB table with a primary key against its Delta target (a table without
    one is not mirrored, so not compared); exit 1 naming the different key, 0 once the target is right again."""
    import deltalake

    from flinkish_spark.mirror.compare import mysql_tables

    db = "cmp_" + tmp_path.name.lower().replace("-", "_")[-40:]
    mariadb.sql(f"DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`")
    mariadb.sql("CREATE TABLE c_a (id bigint unsigned PRIMARY KEY, v varchar(20), at datetime(3), n decimal(12,2));"
                "CREATE TABLE c_b (k varchar(10), j int, PRIMARY KEY (k, j));"
                "CREATE TABLE c_nokey (x int);"
                "INSERT INTO c_a SELECT seq, concat('a', seq), '2024-01-01 00:00:00.125' + INTERVAL seq SECOND, seq / 4 "
                "FROM seq_1_to_30; INSERT INTO c_b SELECT concat('k', seq), seq, FROM seq_1_to_5; INSERT INTO c_nokey VALUES (1)"
                .replace("seq, FROM", "seq FROM"), db)
    lake = tmp_path / "lake"
    for name, _schema, rows in mysql_tables(mariadb.url_for(""), f"{db}.*"):  # the rows a mirror writes
        deltalake.write_deltalake(str(lake / db / name.split(".")[1]), rows)
    mariadb.sql("UPDATE c_a SET v = 'changed' WHERE id = 7", db)
    args = ["--from", mariadb.url_for(""), "--tables", f"{db}.*", "--to", str(lake)]
    out = compare(args)
    assert out.returncode == 1, out.stdout + out.stderr
    # BIGINT UNSIGNED is DECIMAL(20,0) in the stream (docs/mysql-source.md, types): the key as a reader sees it
    assert f"{db}.c_a" in out.stdout and "1 different (e.g. (Decimal('7'),))" in out.stdout, out.stdout
    assert "c_nokey" not in out.stdout
    assert "1 of 2 tables differ" in out.stdout, out.stdout
    mariadb.sql("UPDATE c_a SET v = 'a7' WHERE id = 7", db)
    again = compare(args)
    assert again.returncode == 0 and "all 2 tables equal to their source" in again.stdout, again.stdout + again.stderr
    mariadb.sql(f"DROP DATABASE `{db}`")
