"""flinkish.sequence on real Spark: bounded splits finish one by one and are never planned again."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from flinkish_spark.checkpoint.serde import decode_source_checkpoint
from flinkish_spark.source.planning import read_ranges
from flinkish_spark.testing.sources import read_log


def checkpoints(meta: Path, uid: str):
    folder = meta / "sources" / uid
    return [decode_source_checkpoint(p.read_bytes(), str(p)) for p in sorted(folder.glob("*.parquet"))]


def expected_rows(lengths: list[int]) -> collections.Counter:
    return collections.Counter((k, s) for k, n in enumerate(lengths) for s in range(n))


def test_short_split_finishes_in_the_epoch_that_read_its_last_row(spark, tmp_path: Path) -> None:
    meta, log = tmp_path / "meta", tmp_path / "reads"
    df = (
        spark.readStream.format("flinkish.testing.counting")
        .option("uid", "seq")
        .option("checkpoint", str(meta))
        .option("rowsPerSplit", "10,1000")
        .option("maxRowsPerTrigger", "100")
        .option("retainCheckpoints", "1000")
        .option("readLog", str(log))
        .load()
    )
    q = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert q.exception() is None

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == expected_rows([10, 1000])
    ts = {r.seq: r.ts.timestamp() for r in rows if r.split == 1}
    assert ts[1] - ts[0] == 1.0  # deterministic event time: base + seq seconds

    ckpts = checkpoints(meta, "seq")
    short_done = [c for c in ckpts if c.split_map()["0"].finished]
    first = short_done[0]
    rec = first.split_map()["0"]
    # the short split is finished in exactly the checkpoint whose epoch read its last row
    assert rec.finished_in == first.ckpt_id and rec.start < rec.position == 10
    assert first.status == "PARTIALLY_FINISHED"
    for later in short_done[1:]:
        assert "0" not in {r.split_id for r in read_ranges(later)}
        assert later.split_map()["0"].payload is None  # kept compactly
    assert ckpts[-1].status == "FINISHED"
    # and the reader was asked for split 0 exactly once, for all of it
    assert [r for r in read_log(str(log)) if r[0] == "0"] == [("0", 0, 10)]
    # each epoch read at most maxRowsPerTrigger rows
    assert all(sum(r.end - r.start for r in read_ranges(c)) <= 100 for c in ckpts)


def test_unbounded_sequence_under_a_rate_keeps_running(spark, tmp_path: Path) -> None:
    df = (
        spark.readStream.format("flinkish.sequence")
        .option("uid", "rate")
        .option("checkpoint", str(tmp_path / "meta"))
        .option("splits", "3")
        .option("rowsPerSecond", "300")
        .load()
    )
    q = df.writeStream.format("memory").queryName("rate_out").trigger(processingTime="200 milliseconds").start()
    try:
        import time

        deadline = time.time() + 60
        while time.time() < deadline and spark.table("rate_out").count() < 300:
            time.sleep(0.3)
    finally:
        q.stop()
    rows = spark.table("rate_out").collect()
    by_split = collections.defaultdict(list)
    for r in rows:
        by_split[r.split].append(r.seq)
    assert set(by_split) == {0, 1, 2}
    for seqs in by_split.values():  # each lane is a gapless prefix 0..n-1, no duplicates
        assert sorted(seqs) == list(range(len(seqs)))
    status = checkpoints(tmp_path / "meta", "rate")[-1].status
    assert status == "RUNNING"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"checkpoint": "CK"}, "option 'uid' is required"),
        ({"uid": "a"}, "option 'checkpoint' is required"),
        ({"uid": "a b", "checkpoint": "CK"}, "option 'uid' must be 1-128 letters"),
        ({"uid": "a", "checkpoint": "CK", "splits": "-1"}, "option 'splits' must be >= 1, got -1"),
        ({"uid": "a", "checkpoint": "CK", "rowsPerSplit": "10,-5"}, "'rowsPerSplit' must not be negative"),
        ({"uid": "a", "checkpoint": "CK", "rowsPerSplit": "ten"}, "'rowsPerSplit' must be a whole number"),
        ({"uid": "a", "checkpoint": "CK", "rowsPerSplit": "1,2,3", "splits": "2"}, "lists 3 lengths but 'splits' is 2"),
        ({"uid": "a", "checkpoint": "CK", "maxRowsPerTrigger": "0"}, "'maxRowsPerTrigger' must be >= 1"),
        ({"uid": "a", "checkpoint": "CK", "rowsPerSecond": "-3"}, "'rowsPerSecond' must be > 0"),
        ({"uid": "a", "checkpoint": "CK", "maxRowsPerTriger": "5"}, "unknown option 'maxrowspertriger'. Did you mean 'maxRowsPerTrigger'?"),
        ({"uid": "a", "checkpoint": "CK", "retainCheckpoints": "0"}, "'retainCheckpoints' must be >= 1"),
    ],
)
def test_bad_options_fail_at_load_and_write_nothing(spark, tmp_path: Path, options: dict, message: str) -> None:
    ck = tmp_path / "meta"
    reader = spark.readStream.format("flinkish.sequence")
    for k, v in options.items():
        reader = reader.option(k, v.replace("CK", str(ck)))
    with pytest.raises(Exception) as err:
        reader.load()
    assert "ConfigError" in str(err.value) and message in str(err.value)
    assert not ck.exists()


def test_unreachable_endpoint_fails_at_load_and_names_it(spark) -> None:
    reader = (
        spark.readStream.format("flinkish.sequence")
        .option("uid", "a")
        .option("checkpoint", "s3://test/meta")
        .option("endpointUrl", "http://127.0.0.1:9")
    )
    with pytest.raises(Exception) as err:
        reader.load()
    assert "StorageUnavailableError" in str(err.value) and "http://127.0.0.1:9" in str(err.value)
