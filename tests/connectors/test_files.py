"""flinkish.files on S3 (moto) and local disk: every file exactly once, discovery, cleanup."""

from __future__ import annotations

import collections
import io
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from flinkish_spark.checkpoint.serde import decode_source_checkpoint


def fs_for(endpoint: str) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)


def put_parquet(fs: s3fs.S3FileSystem, path: str, start: int, n: int) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(range(start, start + n), pa.int64()), "name": [f"r{i}" for i in range(start, start + n)]}), buf)
    fs.pipe_file(path, buf.getvalue())


def files_reader(spark, endpoint: str, uid: str, **options: str):
    reader = (
        spark.readStream.format("flinkish.files")
        .option("uid", uid)
        .option("checkpoint", "s3://test/meta")
        .option("path", "s3://test/in")
        .option("endpointUrl", endpoint)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(df, out: Path, cp: Path) -> None:
    q = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(cp)).trigger(availableNow=True).start()
    q.awaitTermination()
    assert q.exception() is None


def ids_in(spark, out: Path) -> collections.Counter:
    return collections.Counter(r.id for r in spark.read.parquet(str(out)).select("id").collect())


def latest_checkpoint(fs: s3fs.S3FileSystem, uid: str):
    fs.invalidate_cache()
    names = sorted(p for p in fs.ls(f"test/meta/sources/{uid}") if p.endswith(".parquet"))
    return decode_source_checkpoint(fs.cat_file(names[-1]), names[-1])


@pytest.mark.s3
def test_unbounded_files_on_s3_archive_and_pick_up_new_files(spark, s3: str, tmp_path: Path) -> None:
    fs = fs_for(s3)
    for i in range(3):
        put_parquet(fs, f"test/in/day=1/f{i}.parquet", i * 100, 100)
    df = files_reader(spark, s3, "files", cleanup="archive", archivePath="s3://test/archive", maxFilesPerTrigger="1")
    out, cp = tmp_path / "out", tmp_path / "cp"
    q = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(cp)).trigger(processingTime="200 milliseconds").start()
    try:
        q.processAllAvailable()
        assert ids_in(spark, out) == collections.Counter(range(300))
        # appended while the query runs: picked up in later epochs
        put_parquet(fs, "test/in/day=2/g0.parquet", 300, 50)
        put_parquet(fs, "test/in/day=2/g1.parquet", 350, 50)
        q.processAllAvailable()
        deadline = time.time() + 30
        while time.time() < deadline and len(fs.find("test/archive")) < 5:
            time.sleep(0.3)
    finally:
        q.stop()
    assert ids_in(spark, out) == collections.Counter(range(400))  # every row exactly once
    fs.invalidate_cache()
    archived = sorted(p.split("test/archive/", 1)[1] for p in fs.find("test/archive"))
    assert archived == ["day=1/f0.parquet", "day=1/f1.parquet", "day=1/f2.parquet", "day=2/g0.parquet", "day=2/g1.parquet"]
    assert fs.find("test/in") == []
    ckpt = latest_checkpoint(fs, "files")
    assert ckpt.status == "PARTIALLY_FINISHED" and len(ckpt.splits) == 5


@pytest.mark.s3
@pytest.mark.parametrize("bounded", [True, False])
def test_files_added_after_the_first_epoch_follow_bounded(spark, s3: str, tmp_path: Path, bounded: bool) -> None:
    fs = fs_for(s3)
    for i in range(3):
        put_parquet(fs, f"test/in/f{i}.parquet", i * 10, 10)
    out, cp = tmp_path / "out", tmp_path / "cp"
    opts = {"bounded": str(bounded).lower(), "maxFilesPerTrigger": "2"}
    run_available_now(files_reader(spark, s3, "b", **opts), out, cp)
    assert ids_in(spark, out) == collections.Counter(range(30))
    assert latest_checkpoint(fs, "b").status == ("FINISHED" if bounded else "PARTIALLY_FINISHED")

    put_parquet(fs, "test/in/f3.parquet", 30, 10)  # appended between epochs, across a restart
    run_available_now(files_reader(spark, s3, "b", **opts), out, cp)
    assert ids_in(spark, out) == collections.Counter(range(30 if bounded else 40))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_csv_and_json_with_inferred_and_given_schema(spark, tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for f in range(2):
        rows = [{"id": f * 10 + i, "name": f"n{f * 10 + i}"} for i in range(10)]
        if fmt == "csv":
            text = "id,name\n" + "".join(f"{r['id']},{r['name']}\n" for r in rows)
        else:
            text = "".join(json.dumps(r) + "\n" for r in rows)
        (src / f"part{f}.{fmt}").write_text(text)
    (src / "_SUCCESS").write_text("")  # hidden files are skipped
    for schema in (None, "id long, name string"):
        reader = spark.readStream.format("flinkish.files")
        if schema:
            reader = reader.schema(schema)
        tag = "given" if schema else "inferred"
        df = (
            reader.option("uid", f"{fmt}-{tag}").option("checkpoint", str(tmp_path / "meta"))
            .option("path", str(src)).option("format", fmt).option("bounded", "true").load()
        )
        out = tmp_path / f"out-{tag}"
        run_available_now(df, out, tmp_path / f"cp-{tag}")
        got = spark.read.parquet(str(out)).collect()
        assert sorted((r.id, r.name) for r in got) == [(i, f"n{i}") for i in range(20)]


def test_files_delete_cleanup_on_local_disk(spark, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"id": [i]}), src / f"f{i}.parquet")
    df = (
        spark.readStream.format("flinkish.files").option("uid", "del").option("checkpoint", str(tmp_path / "meta"))
        .option("path", str(src)).option("cleanup", "delete").option("maxFilesPerTrigger", "1").load()
    )
    out = tmp_path / "out"
    q = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="100 milliseconds").start()
    try:
        q.processAllAvailable()
        deadline = time.time() + 30
        while time.time() < deadline and list(src.iterdir()):
            time.sleep(0.2)
    finally:
        q.stop()
    assert sorted(r.id for r in spark.read.parquet(str(out)).collect()) == [0, 1, 2, 3]
    assert list(src.iterdir()) == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({"path": "IN", "format": "orc"}, "option 'format' must be one of parquet, csv, json, got 'orc'"),
        ({}, "option 'path' is required"),
        ({"path": "IN", "maxFilesPerTrigger": "-2"}, "'maxFilesPerTrigger' must be >= 1, got -2"),
        ({"path": "IN", "cleanup": "archive"}, "cleanup=archive needs the option 'archivePath'"),
        ({"path": "IN", "cleanup": "archive", "archivePath": "IN/old"}, "is inside the input path"),
        ({"path": "IN", "cleanup": "shred"}, "option 'cleanup' must be one of none, delete, archive"),
        ({"path": "IN", "bounded": "maybe"}, "option 'bounded' must be true or false"),
        ({"path": "IN/empty"}, "cannot infer a schema: no files under"),
    ],
)
def test_bad_files_options_fail_at_load_and_write_nothing(spark, tmp_path: Path, options: dict, message: str) -> None:
    (tmp_path / "in").mkdir()
    ck = tmp_path / "meta"
    reader = spark.readStream.format("flinkish.files").option("uid", "f").option("checkpoint", str(ck))
    for k, v in options.items():
        reader = reader.option(k, v.replace("IN", str(tmp_path / "in")))
    with pytest.raises(Exception) as err:
        reader.load()
    assert "ConfigError" in str(err.value) and message in str(err.value)
    assert not ck.exists()
