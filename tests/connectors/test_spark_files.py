"""flinkish_spark.files_sink in-process: names, suffixes, hidden files, replays, the s3:// error.

Crash and task-failure cases run in child drivers: tests/connectors/test_spark_files_crash.py.
"""

from __future__ import annotations

import collections
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F

import flinkish_spark
from flinkish_spark.connectors.spark_files import final_name, is_data_file
from flinkish_spark.errors import ConfigError
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.io.fileio import FileIO


def visible(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and "_flinkish_staging" not in p.parts)


def rows(spark, n: int, start: int = 0):  # type: ignore[no-untyped-def]
    return spark.range(start, start + n, numPartitions=3).select(
        (F.col("id") % 2).cast("int").alias("k"), F.col("id").alias("v"))


def test_spark_names_map_to_deterministic_names_with_suffixes() -> None:
    assert final_name("part-00001-0a1b.c000.snappy.parquet", 7, 3, "out") == "part-000000000007-00003-out.snappy.parquet"
    assert final_name("part-00001-0a1b-c000.csv", 7, 3, "out") == "part-000000000007-00003-out.csv"
    assert final_name("k=1/part-00000-ff-c000.json.gz", 0, 0, "o.x") == "k=1/part-000000000000-00000-o.x.json.gz"
    assert [r for r in ["_SUCCESS", ".part-0.crc", "_temporary/0/part-0.parquet", "_k=1/part-0.orc", "k=1/part-0.orc"]
            if is_data_file(r)] == ["_k=1/part-0.orc", "k=1/part-0.orc"]


@pytest.mark.parametrize("fmt, options, suffix", [
    ("parquet", {}, ".snappy.parquet"),
    ("json", {"compression": "gzip"}, ".json.gz"),
])
def test_batches_land_once_under_final_names_and_replays_skip_the_write(spark, tmp_path: Path, fmt, options, suffix) -> None:
    out = tmp_path / "out"
    fn = flinkish_spark.files_sink(str(out), uid="files", checkpoint=str(tmp_path / "meta"), format=fmt,
                                   partitionBy="k", options=options)
    fn(rows(spark, 30), 0)
    after_first = visible(out)
    # A replay of a committed batch must not run Spark's job at all: this DataFrame fails if computed.
    fn(spark.range(1).select(F.raise_error(F.lit("replay recomputed the batch"))), 0)
    assert visible(out) == after_first
    fn(rows(spark, 20, start=30), 1)
    names = visible(out)
    assert names and all(n.startswith(("k=0/part-0000000000", "k=1/part-0000000000")) and n.endswith(f"-files{suffix}")
                         for n in names), names
    assert [p for p in (out / "_flinkish_staging").rglob("*") if p.is_file()] == []  # _SUCCESS, .crc: removed
    want = collections.Counter(range(50))
    got = spark.read.format(fmt).load(str(out)).select("k", "v").collect()
    assert collections.Counter(r.v for r in got) == want and all(r.k == r.v % 2 for r in got)
    if fmt == "parquet":
        t = ds.dataset(str(out), partitioning="hive").to_table()
        assert collections.Counter(t["v"].to_pylist()) == want
        assert collections.Counter(v for (v,) in duckdb.sql(f"select v from read_parquet('{out}/**/*.parquet')").fetchall()) == want
    else:
        assert collections.Counter(v for (v,) in duckdb.sql(f"select v from read_json('{out}/**/*.json.gz')").fetchall()) == want
    decided, done = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "files").epochs()
    assert decided == [0, 1] and done == {0, 1}


def test_s3_path_without_jars_is_one_clear_error_before_anything_is_written(spark, tmp_path: Path) -> None:
    for url in ("s3://bucket/out", "s3a://bucket/out"):
        with pytest.raises(ConfigError) as err:
            flinkish_spark.files_sink(url, uid="files", checkpoint=str(tmp_path / "meta"))
        text = str(err.value)
        assert "jars/README.md" in text and "flinkish.parquet" in text and url in text
    assert not (tmp_path / "meta").exists()


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="format must be one of parquet, orc, json, csv, text"):
        flinkish_spark.files_sink(str(tmp_path / "out"), uid="files", checkpoint=str(tmp_path / "meta"), format="delta")


def test_orphan_scan_knows_what_spark_staged(spark, tmp_path: Path) -> None:
    """A prepared epoch that was never decided is 'pending'; once a later epoch is decided it is an orphan."""
    from flinkish_spark.connectors.spark_files import SparkFilesSink
    from flinkish_spark.sink import orphans

    out, meta = tmp_path / "out", tmp_path / "meta"
    fn = flinkish_spark.files_sink(str(out), uid="files", checkpoint=str(meta))
    io = FileIO.for_url(str(out))
    crashed = SparkFilesSink(io, str(out), "files", "parquet", (), {}).write_epoch(rows(spark, 10), 0)
    assert crashed and all("_flinkish_staging/files/000000000000/" in f.staged for c in crashed for f in c.files)
    log = DecisionLog(FileIO.for_url(str(meta)), str(meta), "files")
    assert {e.state for e in orphans.scan(io, str(out), log)} == {"pending"}
    fn(rows(spark, 10), 1)
    entries = orphans.scan(io, str(out), log)
    assert entries and {(e.epoch, e.state) for e in entries} == {(0, "orphan")}
    orphans.remove(io, entries)
    assert [p for p in (out / "_flinkish_staging").rglob("*") if p.is_file()] == []
    assert collections.Counter(r.v for r in spark.read.parquet(str(out)).collect()) == collections.Counter(range(10))
