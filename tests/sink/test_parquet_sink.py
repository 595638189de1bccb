"""flinkish.parquet end to end on real Spark: visible output, readers, staging, bad input."""

from __future__ import annotations

import collections
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pytest
import s3fs

from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.io.fileio import FileIO

LENGTHS = [700, 300]


def sequence(spark, meta: str, uid: str = "seq", **options: str):
    r = (spark.readStream.format("flinkish.sequence").option("uid", uid).option("checkpoint", meta)
         .option("rowsPerSplit", ",".join(map(str, LENGTHS))).option("maxRowsPerTrigger", "400"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def run(df, tmp_path: Path, path: str, **options: str) -> None:
    w = df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", path).option(
        "checkpointLocation", str(tmp_path / "cp")).option("rowsPerFile", "150")
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    assert q.exception() is None


def test_local_output_is_exactly_once_for_spark_pyarrow_and_duckdb(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(sequence(spark, str(tmp_path / "meta")), tmp_path, str(out))
    spark_rows = collections.Counter((r.split, r.seq) for r in spark.read.parquet(str(out)).collect())
    assert spark_rows == expected()
    table = ds.dataset(str(out)).to_table()
    assert collections.Counter(zip(table["split"].to_pylist(), table["seq"].to_pylist())) == expected()
    duck = duckdb.sql(f"select split, seq from read_parquet('{out}/**/*.parquet')").fetchall()
    assert collections.Counter(duck) == expected()
    names = sorted(p.name for p in out.glob("*.parquet"))
    assert names[0] == "part-000000000000-00000-0000-out.parquet"  # (epoch, partition, file, uid)
    assert all(n.startswith("part-") for n in names) and len(names) >= 7  # rowsPerFile=150 rolls files
    assert not list((out / "_flinkish_staging").rglob("*.staged"))
    decided, done = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out").epochs()
    assert decided and set(decided) == done


def test_partition_by_writes_hive_folders(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(sequence(spark, str(tmp_path / "meta")), tmp_path, str(out), partitionBy="split")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) == ["split=0", "split=1"]
    back = spark.read.parquet(str(out)).collect()
    assert collections.Counter((r.split, r.seq) for r in back) == expected()


@pytest.mark.s3
def test_s3_output_is_exactly_once(spark, s3: str, tmp_path: Path) -> None:
    df = sequence(spark, "s3://test/meta", endpointUrl=s3)
    run(df, tmp_path, "s3://test/out", endpointUrl=s3, checkpoint="s3://test/sinkmeta")
    fs = s3fs.S3FileSystem(endpoint_url=s3, skip_instance_cache=True)
    table = ds.dataset("test/out", filesystem=fs, format="parquet").to_table()
    assert collections.Counter(zip(table["split"].to_pylist(), table["seq"].to_pylist())) == expected()
    assert not [p for p in fs.find("test/out") if p.endswith(".staged")]
    assert fs.find("test/sinkmeta/sinks/out/decisions")  # decisions live on S3 too


def test_restart_with_a_changed_schema_is_refused_and_changes_nothing(spark, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), src / "a.parquet")

    def files():
        return (spark.readStream.format("flinkish.files").schema("id long").option("uid", "in")
                .option("checkpoint", str(tmp_path / "meta")).option("path", str(src)).load())

    run(files(), tmp_path, str(out))
    before = sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*") if p.is_file())
    meta_before = sorted(p.name for p in (tmp_path / "cp" / "flinkish").rglob("*"))
    pq.write_table(pa.table({"id": [3]}), src / "b.parquet")
    with pytest.raises(Exception) as err:
        run(files().selectExpr("id", "'x' as extra"), tmp_path, str(out))
    assert "CheckpointMismatchError" in str(err.value)
    assert "sink uid 'out' was started with the schema struct<id:bigint>" in str(err.value)
    assert sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*") if p.is_file()) == before
    assert sorted(p.name for p in (tmp_path / "cp" / "flinkish").rglob("*") if p.name != "_lease.json") == [
        n for n in meta_before if n != "_lease.json"
    ]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"path": "OUT", "rowsPerFiles": "5"}, "unknown option 'rowsperfiles'. Did you mean 'rowsPerFile'?"),
        ({}, "option 'path' is required"),
        ({"path": "OUT", "rowsPerFile": "0"}, "'rowsPerFile' must be >= 1"),
        ({"path": "OUT", "targetFileSize": "big"}, "'targetFileSize' must be a size"),
        ({"path": "OUT", "partitionBy": "nope"}, "'partitionBy' names ['nope']"),
        ({"path": "FILE/out"}, "is not writable"),
    ],
)
def test_bad_sink_input_fails_before_writing(spark, tmp_path: Path, options: dict, message: str) -> None:
    (tmp_path / "afile").write_text("x")
    w = sequence(spark, str(tmp_path / "meta")).writeStream.format("flinkish.parquet").option("uid", "o").option(
        "checkpointLocation", str(tmp_path / "cp"))
    for k, v in options.items():
        w = w.option(k, v.replace("OUT", str(tmp_path / "out")).replace("FILE", str(tmp_path / "afile")))
    with pytest.raises(Exception) as err:
        q = w.trigger(availableNow=True).start()
        q.awaitTermination()
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "cp" / "flinkish").exists()


@pytest.mark.s3
def test_target_file_size_above_the_s3_copy_limit_is_refused(s3: str) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource
    from flinkish_spark.errors import ConfigError

    with pytest.raises(ConfigError, match=r"option 'targetFileSize' must be at most 4GB on S3 \(got '8GB'\)"):
        ParquetSinkDataSource({"uid": "o", "path": "s3://test/out", "checkpoint": "s3://test/m", "endpointUrl": s3,
                               "targetFileSize": "8GB"})
    with pytest.raises(ConfigError, match="target_file_size must be at most 4GB on S3"):
        ParquetSink.at("s3://test/out", uid="o", schema=StructType([StructField("id", LongType())]),
                       target_file_size=8 * 1024**3, options={"endpointUrl": s3})
    fs = s3fs.S3FileSystem(endpoint_url=s3, skip_instance_cache=True)
    assert fs.find("test") == []  # refused before anything was written
