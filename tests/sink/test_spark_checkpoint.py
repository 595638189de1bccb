"""The copy of Spark's local checkpoint next to the sink's metadata (flinkish_spark.sink.spark_checkpoint),
below Spark: the driver-side calls Spark makes, on a ``flinkish.parquet`` sink whose metadata is on S3 (moto).

* what the copy holds after a batch's commit, and the restore into a new machine's empty folder;
* the lost machine coming back after the new one took over: its commit fails with FencedError and
  writes nothing -- neither a decision nor the copy's offsets; the same command started again there
  moves its folder, which is behind, aside and continues from the copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from flinkish_spark.connectors.parquet_sink import ParquetSinkDataSource
from flinkish_spark.errors import FencedError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.spark_checkpoint import KEEP, SparkCheckpointCopy, restore_spark_checkpoint

pytestmark = pytest.mark.s3

SCHEMA = StructType([StructField("id", LongType())])
META = "s3://test/meta"


def offsets(batch: int, watermark: int = 0, run: str = "old") -> str:
    return f'v1\n{{"batchWatermarkMs":{watermark},"batchTimestampMs":{batch},"conf":{{}}}}\n{{"ckpt": {batch}, "run": "{run}"}}'


def spark_plans(folder: Path, batch: int, run: str = "old") -> None:
    """What Spark writes before a batch's tasks: ``metadata`` once, then ``offsets/<batch>`` (with its .crc)."""
    (folder / "offsets").mkdir(parents=True, exist_ok=True)
    if not (folder / "metadata").exists():
        (folder / "metadata").write_text('{"id":"5f0c-query"}')
    (folder / "offsets" / str(batch)).write_text(offsets(batch, run=run))
    (folder / "offsets" / f".{batch}.crc").write_bytes(b"crc")


def spark_commits(folder: Path, batch: int) -> None:
    (folder / "commits").mkdir(exist_ok=True)
    (folder / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def sink(s3: str, folder: Path) -> ParquetSinkDataSource:
    """The sink as ``start()`` makes it on a machine whose Spark checkpoint is ``folder``."""
    return ParquetSinkDataSource({"uid": "out", "checkpoint": META, "path": "s3://test/out", "endpointUrl": s3,
                                  "checkpointLocation": str(folder), "leaseTimeout": "0.5"})


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def test_the_copy_follows_each_commit_and_restores_into_an_empty_folder(s3: str, tmp_path: Path) -> None:
    old = tmp_path / "machine-1"
    for batch in range(3):
        spark_plans(old, batch)
        sink(s3, old).streamWriter(SCHEMA, False).commit([], batch)
        spark_commits(old, batch)
    spark_plans(old, 3)  # planned, then the machine is lost before the sink's commit

    new = tmp_path / "machine-2"
    assert restore_spark_checkpoint(str(new), META, "out", {"endpointUrl": s3}) == 7  # before start() on the new machine
    # Spark resumes after batch 2, committed on the store; batch 3 was never decided: planned again.
    assert files(new) == {"metadata": '{"id":"5f0c-query"}', **{f"offsets/{b}": offsets(b) for b in range(3)},
                          **{f"commits/{b}": 'v1\n{"nextBatchWatermarkMs":0}' for b in range(3)}}
    io = FileIO.for_url(META, {"endpoint_url": s3})
    assert sorted(DecisionLog(io, META, "out").epochs()[1]) == [0, 1, 2]

    (new / "offsets" / "0").write_text("changed by Spark")
    assert restore_spark_checkpoint(str(new), META, "out", {"endpointUrl": s3}) == 0  # Spark started here: untouched
    assert (new / "offsets" / "0").read_text() == "changed by Spark"


def test_offsets_go_to_the_store_before_the_decision_and_commits_only_after_the_commit(
        s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flinkish_spark.sink.datasource as datasource

    io = FileIO.for_url(META, {"endpoint_url": s3})
    copied: list[bool] = []

    def lost_during_the_commit(*args: object, **kwargs: object) -> None:
        copied.append(io.exists(f"{META}/sinks/out/spark/offsets/0"))  # what a new machine would find now
        raise RuntimeError("the machine is lost")

    monkeypatch.setattr(datasource, "commit_epoch", lost_during_the_commit)
    folder = tmp_path / "machine-1"
    spark_plans(folder, 0)
    with pytest.raises(RuntimeError):
        sink(s3, folder).streamWriter(SCHEMA, False).commit([], 0)
    assert copied == [True] and not io.exists(f"{META}/sinks/out/spark/commits/0")


def test_the_watermark_and_the_retention_of_the_copy(s3: str, tmp_path: Path) -> None:
    io = FileIO.for_url(META, {"endpoint_url": s3})
    local = tmp_path / "spark"
    copy = SparkCheckpointCopy(io, f"{META}/copy", str(local))
    for batch in range(3 * KEEP):
        spark_plans(local, batch)
        (local / "offsets" / str(batch)).write_text(offsets(batch, watermark=1000 + batch))
        copy.before_decision(batch)
        copy.after_commit(batch)
    kept = sorted(n.rsplit("/", 2)[-2] + "/" + n.rsplit("/", 1)[-1] for n in io.find(f"{META}/copy") if "/metadata" not in n)
    batches = sorted({int(n.split("/")[1]) for n in kept})
    assert batches[-1] == 3 * KEEP - 1 and len(batches) <= 2 * KEEP + 1  # old entries go
    assert io.read_bytes(f"{META}/copy/commits/{3 * KEEP - 1}") == f'v1\n{{"nextBatchWatermarkMs":{1000 + 3 * KEEP - 1}}}'.encode()

    (local / "state").mkdir()  # a query with state: its state store would be needed too -- no copy
    spark_plans(local, 3 * KEEP)
    copy.before_decision(3 * KEEP)
    assert not io.exists(f"{META}/copy/offsets/{3 * KEEP}")


def test_the_lost_machine_coming_back_is_fenced_and_writes_nothing(s3: str, tmp_path: Path) -> None:
    old, new = tmp_path / "machine-1", tmp_path / "machine-2"
    spark_plans(old, 0)
    old_sink = sink(s3, old)
    old_sink.streamWriter(SCHEMA, False).commit([], 0)
    spark_commits(old, 0)
    spark_plans(old, 1)
    stalled = old_sink.streamWriter(SCHEMA, False)  # batch 1 planned; then the machine stalls (a network partition)

    restore_spark_checkpoint(str(new), META, "out", {"endpointUrl": s3})
    new_sink = sink(s3, new)  # Spark plans batch 1 again, from the same place
    spark_plans(new, 1, run="new")
    new_sink.streamWriter(SCHEMA, False).commit([], 1)  # takes the lease over (the old run did not renew it)

    with pytest.raises(FencedError, match="is in use by another live run of this query"):
        stalled.commit([], 1)  # the old machine is back
    io = FileIO.for_url(META, {"endpoint_url": s3})
    log = DecisionLog(io, META, "out")
    decision = log.read(1)
    assert decision is not None and decision.run_id == new_sink.run_id
    copied = io.read_bytes(f"{META}/sinks/out/spark/offsets/1").decode()
    assert json.loads(copied.splitlines()[2])["run"] == "new"
    spark_plans(old, 2)
    with pytest.raises(FencedError):
        old_sink.streamWriter(SCHEMA, False).commit([], 2)
    assert log.read(2) is None and not io.exists(f"{META}/sinks/out/spark/offsets/2")

    # The new machine restarts where Spark has not logged batch 1's commit yet: its folder is not behind.
    assert restore_spark_checkpoint(str(new), META, "out", {"endpointUrl": s3}) == 0
    # The old machine runs the same command again: its folder is behind the store (batch 1 as the new machine
    # planned it and committed). It is moved aside, kept, and the copy takes its place.
    stale_files = files(old)
    assert restore_spark_checkpoint(str(old), META, "out", {"endpointUrl": s3}) > 0
    [aside] = tmp_path.glob("machine-1.stale-*")
    assert files(aside) == stale_files
    assert json.loads(files(old)["offsets/1"].splitlines()[2])["run"] == "new" and "commits/1" in files(old)
    assert restore_spark_checkpoint(str(old), META, "out", {"endpointUrl": s3}) == 0  # now it is not behind
