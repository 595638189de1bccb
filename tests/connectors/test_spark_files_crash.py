"""files_sink under kill -9, task failures and processing-time triggers (child drivers).

The crash matrix of flinkish.parquet (tests/sink/test_sink_crash.py), chained in one pipeline
per configuration: run k is killed in epoch k at the k-th point, the next run recovers it,
the last run completes; the output is read back with Spark and DuckDB (and pyarrow).

files_sink commits with flinkish.parquet's committer (StagedFilesCommitter); what is its own is
Spark's writer filling the staging folder. The points are split between the two configurations (a
driver start per point is a matrix's cost): Parquet, flat, is killed before and after the decision
(an undecided epoch's staged files replaced, a decided epoch recovered); JSON partitioned under a
processing-time trigger in the middle of the commit's file moves (some partition folders' files
visible, others staged). Not after the commit (``sink.after_commit``, foreach_batch.py's point): there the
decision log says done, the replayed batch runs no Spark job (a decided epoch's, as after the kill at
``sink.after_decision``), commit_epoch answers ALREADY_COMMITTED without calling the committer, and the
committer's cleanup runs over an epoch it already cleaned -- foreachBatch(transactional(flinkish.parquet's
committer)) is killed at that point in tests/sink/test_sink_crash.py, the same committer and point.
"""

from __future__ import annotations

import collections
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog

pytestmark = pytest.mark.slow
CHAIN = ["sink.before_decision", "sink.after_decision", "sink.mid_commit"]  # no sink.after_commit: see above
FLAT_CHAIN, PARTITIONED_CHAIN = CHAIN[:2], CHAIN[2:]
LENGTHS = [500, 400]


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def sink_spec(tmp_path: Path, source: dict, fmt: str, partition_by: str | None = None,
              trigger: str = "availableNow", **options: str) -> dict:
    spec = {
        "source": source,
        "sink": {"checkpointLocation": str(tmp_path / "cp"), "sparkFiles": {
            "uid": "out", "path": str(tmp_path / "out"), "checkpoint": str(tmp_path / "sinkmeta"), "format": fmt,
            "partitionBy": partition_by, "options": {"maxRecordsPerFile": "50", **options}}},
        "trigger": trigger,
    }
    if trigger != "availableNow":
        spec.update(end="finish", runSeconds=150)  # must end by itself, long before that
    return spec


def sequence_source(tmp_path: Path) -> dict:
    return {"format": "flinkish.sequence", "options": {
        "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)),
        "maxRowsPerTrigger": 150}}


def staged(out: Path) -> list[Path]:
    """Data files Spark wrote into the staging folder (not its _SUCCESS or .crc files)."""
    return [p for p in (out / "_flinkish_staging").rglob("part-*") if p.is_file()]


def finals(out: Path, epoch: int) -> list[Path]:
    return [p for p in out.rglob(f"part-{epoch:012d}-*") if "_flinkish_staging" not in p.parts]


def visible(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file() and "_flinkish_staging" not in p.parts)


def check_killed_at(point: str, epoch: int, out: Path, log: DecisionLog, cp: Path) -> None:
    decided, done = log.epochs()
    if point == "sink.before_decision":  # Spark's job wrote the epoch; nothing decided, nothing visible
        assert epoch not in decided and staged(out) and not finals(out, epoch)
    elif point == "sink.after_decision":
        assert epoch in decided and epoch not in done and not finals(out, epoch)
    elif point == "sink.mid_commit":  # some files visible, others still staged
        assert epoch in decided and epoch not in done and finals(out, epoch) and staged(out)
    else:  # committed; Spark's commit log does not have it
        assert epoch in done and not (cp / "commits" / str(epoch)).exists()


def run_chain(run_pipeline, spec: dict, tmp_path: Path, chain: list[str]) -> str:
    out = tmp_path / "out"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "sinkmeta"), "out")
    for epoch, point in enumerate(chain, start=1):
        run = run_pipeline(spec, crash_at=f"{point}:2")
        assert run.killed, f"no kill at {point}: {run.output[-3000:]}"
        check_killed_at(point, epoch, out, log, tmp_path / "cp")
    last = run_pipeline(spec)
    assert last.returncode == 0, last.output[-3000:]
    assert staged(out) == [] and not any(p.name.startswith(("_", ".")) for p in visible(out))
    # Every visible file is one the decisions name: nothing of a replay or a failed run slipped in.
    decided, done = log.epochs()
    assert decided == sorted(done)
    return last.output


def rows_of(spark_rows) -> collections.Counter:  # type: ignore[no-untyped-def]
    return collections.Counter((int(r.split), int(r.seq)) for r in spark_rows)


def test_crash_matrix_parquet(spark, run_pipeline, tmp_path: Path) -> None:
    run_chain(run_pipeline, sink_spec(tmp_path, sequence_source(tmp_path), "parquet"), tmp_path, FLAT_CHAIN)
    out = tmp_path / "out"
    assert rows_of(spark.read.parquet(str(out)).collect()) == expected()
    t = ds.dataset(str(out)).to_table()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected()
    assert collections.Counter(duckdb.sql(f"select split, seq from read_parquet('{out}/*.parquet')").fetchall()) == expected()


def test_crash_matrix_json_partitioned_finishes_under_processing_time(spark, run_pipeline, tmp_path: Path) -> None:
    """Also: flinkish.sequence -> files_sink ends by itself under a processing-time trigger."""
    spec = sink_spec(tmp_path, sequence_source(tmp_path), "json", partition_by="split", trigger="1 second",
                     compression="gzip")
    output = run_chain(run_pipeline, spec, tmp_path, PARTITIONED_CHAIN)
    assert "QUERY_END=finished" in output, output[-3000:]
    out = tmp_path / "out"
    assert {p.parent.name for p in visible(out)} == {"split=0", "split=1"}
    assert all(p.name.endswith("-out.json.gz") for p in visible(out))
    assert rows_of(spark.read.json(str(out)).collect()) == expected()
    got = duckdb.sql(f"select split, seq from read_json('{out}/*/*.json.gz', hive_partitioning=true)").fetchall()
    assert collections.Counter((int(k), int(v)) for k, v in got) == expected()


def test_task_failure_in_first_attempt_leaves_nothing_visible(spark, run_pipeline, tmp_path: Path) -> None:
    """Every task's first attempt fails after half its rows went to Spark's ORC writer; the retries succeed."""
    spec = {**sink_spec(tmp_path, sequence_source(tmp_path), "orc"), "master": "local[2,4]",
            "map": ["flinkish_spark.testing.transforms:fail_midway"]}
    run = run_pipeline(spec, env={"FLINKISH_FAIL_AT": "spark_files.task:first"})
    assert run.returncode == 0, run.output[-3000:]
    assert "injected failure at spark_files.task (attempt 0)" in run.output  # the first attempts really failed
    out = tmp_path / "out"
    assert rows_of(spark.read.orc(str(out)).collect()) == expected()
    t = ds.dataset(str(out), format="orc").to_table()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected()
    assert staged(out) == [] and all(p.name.endswith("-out.zstd.orc") for p in visible(out))  # Spark 4: zstd ORC


def test_files_source_to_files_sink_finishes_under_processing_time(spark, run_pipeline, tmp_path: Path) -> None:
    inputs = tmp_path / "input"
    inputs.mkdir()
    want: collections.Counter = collections.Counter()
    for k in range(3):
        seq = list(range(k * 100, k * 100 + 120))
        pq.write_table(pa.table({"split": pa.array([k] * len(seq), pa.int32()), "seq": pa.array(seq, pa.int64())}),
                       inputs / f"in-{k}.parquet")
        want.update((k, s) for s in seq)
    source = {"format": "flinkish.files", "schema": "split int, seq long", "options": {
        "uid": "files", "checkpoint": str(tmp_path / "meta"), "path": str(inputs), "bounded": "true",
        "maxFilesPerTrigger": 1}}
    run = run_pipeline(sink_spec(tmp_path, source, "csv", trigger="1 second", header="true"))
    assert run.returncode == 0 and "QUERY_END=finished" in run.output, run.output[-3000:]
    out = tmp_path / "out"
    assert rows_of(spark.read.schema("split int, seq long").option("header", "true").csv(str(out)).collect()) == want
    got = duckdb.sql(f"select split, seq from read_csv('{out}/*.csv', header=true)").fetchall()
    assert collections.Counter(got) == want
    assert {int(p.name.split("-")[1]) for p in visible(out)} == {0, 1, 2}  # one epoch per input file
