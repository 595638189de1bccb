"""Finishing through Spark Connect: the server runs in its own process, the client in another.

The finish controller is a client-side listener there: it must end a bounded query under a
processing-time trigger after its final commit (with the final checkpoint notification), let
the client exit afterwards, and ``await_finished`` must not depend on the listener's events.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

# A user's script: their own Connect session, flinkish registered on it, Spark's own
# awaitTermination (only the listener can end the query), and no spark.stop() at the end.
LISTENER_CLIENT = r"""
import sys, time
from pyspark.sql import SparkSession
import flinkish_spark
from flinkish_spark.finish import FinishController

url, work = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.remote(url).getOrCreate()
flinkish_spark.register(spark)

def start(name, source):
    return (source.writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/{name}/out")
            .option("checkpointLocation", f"{work}/{name}/cp").trigger(processingTime="2 seconds").start())

files = (spark.readStream.format("flinkish.files").option("uid", "files").option("checkpoint", f"{work}/files/meta")
         .option("path", f"{work}/input").option("bounded", "true").option("maxFilesPerTrigger", "1")
         .option("cleanup", "delete").load())
q = start("files", files)
q.awaitTermination()
print("FILES_END", q.exception() is None, flush=True)

# The same with every listener event lost (Spark may drop a client listener's events after one
# failed send): await_finished must end the query and return all the same.
controller = getattr(spark, FinishController._ATTR)
for callback in ("onQueryProgress", "onQueryIdle", "onQueryTerminated"):
    setattr(controller, callback, lambda event: None)
seq = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/seq/meta")
       .option("rowsPerSplit", "40,25").option("maxRowsPerTrigger", "20").load())
q = start("seq", seq)
print("SEQ_END", flinkish_spark.await_finished(q, timeout=240), flush=True)
"""


def test_the_client_listener_ends_a_bounded_query_and_the_client_exits(connect_server, run_script, tmp_path: Path) -> None:
    (tmp_path / "input").mkdir()
    for f in range(3):
        pq.write_table(pa.table({"id": list(range(f * 100, (f + 1) * 100))}), tmp_path / "input" / f"part-{f}.parquet")

    done = run_script(LISTENER_CLIENT, connect_server.url, str(tmp_path), timeout=300)

    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "FILES_END True" in done.stdout and "SEQ_END finished" in done.stdout, done.stdout
    ids = ds.dataset(str(tmp_path / "files" / "out"), format="parquet").to_table()["id"].to_pylist()
    assert sorted(ids) == list(range(300))
    # The final checkpoint notification reached the source: the last epoch's file is deleted too.
    assert list((tmp_path / "input").iterdir()) == []
    t = ds.dataset(str(tmp_path / "seq" / "out"), format="parquet").to_table()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == collections.Counter(
        [(0, i) for i in range(40)] + [(1, i) for i in range(25)])
    # `flinkish inspect` reads what the query wrote, whoever ran it.
    inspect = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "inspect", "--json", str(tmp_path / "seq" / "meta")],
                             capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["sources"][-1]["status"] == "FINISHED"


def test_drain_through_connect_flushes_every_window(run_client, tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    spec = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(meta), "splits": 2, "rowsPerSecond": 100, "watermarkColumn": "ts"}},
        "map": ["flinkish_spark.testing.transforms:windowed_counts"],
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(tmp_path / "out")}},
        "trigger": "1 second", "end": "drain", "stopAfterBatches": 3, "runSeconds": 240,
    }
    run = run_client(spec, timeout=400)

    assert run.returncode == 0 and "QUERY_END=drained" in run.output, run.output[-3000:]
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.io.fileio import FileIO

    latest = SourceCheckpointStore(FileIO.for_url(str(meta)), str(meta), "seq", "").latest()
    assert latest is not None and latest.status == "FINISHED"
    out = ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pylist()
    # Every row read is counted in an emitted window (the last, partial one included), and the
    # end-of-input marker row that moved the watermark is in none of them.
    assert sum(r["n"] for r in out) == sum(s.position for s in latest.splits) > 0
    assert len({r["start"] for r in out}) == len(out)
    assert all(r["start"].year == 2024 for r in out)
