"""Stop with savepoint: flinkish_spark.stop(drain=False/True) and `flinkish stop` from another process."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F

import flinkish_spark
from flinkish_spark.runner import child_spec
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.io.fileio import FileIO

LENGTHS = [300, 200]


def _sequence(spark, meta: Path, **options: str):
    r = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", str(meta)))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _start(df, tmp_path: Path, trigger: str = "1 second", mode: str = "append"):
    return (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "cp")).outputMode(mode)
            .trigger(processingTime=trigger).start())


def _wait_batches(q, n: int) -> None:
    deadline = time.time() + 120
    while q.lastProgress is None or q.lastProgress.batchId < n - 1:
        assert q.isActive and time.time() < deadline, q.exception()
        time.sleep(0.05)


def _rows(path: Path) -> collections.Counter:
    t = ds.dataset(str(path), format="parquet").to_table()
    return collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))


def _latest(meta: Path):
    return SourceCheckpointStore(FileIO.for_url(str(meta)), str(meta), "seq", "").latest()


def test_stop_without_drain_then_restart_equals_the_uninterrupted_run(spark, tmp_path: Path) -> None:
    opts = {"rowsPerSplit": ",".join(map(str, LENGTHS)), "maxRowsPerTrigger": "60"}
    q = _start(_sequence(spark, tmp_path / "meta", **opts), tmp_path)
    _wait_batches(q, 2)
    assert flinkish_spark.stop(q, drain=False, timeout=120) == "stopped"
    assert not q.isActive and q.exception() is None
    stopped_at = _latest(tmp_path / "meta")
    assert stopped_at is not None and stopped_at.status != "FINISHED"
    partial = _rows(tmp_path / "out")
    assert 0 < sum(partial.values()) < sum(LENGTHS) and max(partial.values()) == 1

    q2 = _start(_sequence(spark, tmp_path / "meta", **opts), tmp_path)
    assert flinkish_spark.await_finished(q2, timeout=180) == "finished"
    assert _rows(tmp_path / "out") == collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def _windowed(spark, meta: Path, **options: str):
    df = _sequence(spark, meta, watermarkColumn="ts", **options)
    return (flinkish_spark.with_watermark(df, "ts", "5 seconds")
            .groupBy(F.window("ts", "10 seconds")).agg(F.count("*").alias("n"))
            .select(F.col("window.start").alias("start"), "n"))


def test_drain_flushes_windows_ends_the_query_and_a_restart_adds_nothing(spark, tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    opts = {"splits": "2", "rowsPerSecond": "400"}  # unbounded
    q = _start(_windowed(spark, meta, **opts), tmp_path)
    _wait_batches(q, 3)
    assert flinkish_spark.stop(q, drain=True, timeout=120) == "drained"
    latest = _latest(meta)
    assert latest is not None and latest.status == "FINISHED"
    read = sum(s.position for s in latest.splits)
    out = ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pylist()
    # Every row read is counted in an emitted window, the last (partial) window included.
    assert sum(r["n"] for r in out) == read > 0
    assert len({r["start"] for r in out}) == len(out)
    files = sorted(p.name for p in (tmp_path / "out").glob("*.parquet"))

    q2 = _start(_windowed(spark, meta, **opts), tmp_path)
    assert flinkish_spark.await_finished(q2, timeout=120) == "finished"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet")) == files
    assert _latest(meta).splits == latest.splits


def _start_external(spec: dict) -> subprocess.Popen:
    spec = child_spec(spec)
    code = ("import json; from flinkish_spark.runner import run; "
            f"run(json.loads({json.dumps(json.dumps(spec))}))")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _cli_stop(proc: subprocess.Popen, meta: Path, after_ckpt: int, *flags: str) -> str:
    """Wait until the query in ``proc`` wrote checkpoint ``after_ckpt``, then `flinkish stop` it."""
    try:
        deadline = time.time() + 180
        while _latest(meta) is None or _latest(meta).ckpt_id < after_ckpt:
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        stop = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "stop", *flags, str(meta), "--timeout", "120"],
                              capture_output=True, text=True, timeout=180)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-3000:]
        return stop.stdout + out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_cli_stop_and_drain_from_a_second_process(tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    spec = {
        "source": {"format": "flinkish.sequence", "options": {"uid": "seq", "checkpoint": str(meta), "splits": 2,
                                                             "rowsPerSecond": 200}},
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(tmp_path / "out")}},
        "trigger": "300 milliseconds", "end": "external", "runSeconds": 240,
    }
    # The query runs in one process; `flinkish stop` comes from another (this test's).
    out = _cli_stop(_start_external(spec), meta, 2)
    assert "query ended: stopped" in out and "QUERY_END=stopped" in out
    stopped = _latest(meta)
    assert stopped is not None and stopped.status == "RUNNING"

    out = _cli_stop(_start_external(spec), meta, stopped.ckpt_id + 2, "--drain")
    assert "query ended: drained" in out and "QUERY_END=drained" in out
    latest = _latest(meta)
    assert latest is not None and latest.status == "FINISHED"
    # Across the stop, the restart and the drain: every row read is in the sink exactly once.
    assert _rows(tmp_path / "out") == collections.Counter(
        (int(s.split_id), i) for s in latest.splits for i in range(s.position))
