"""flinkish.delta with ``{schema}/{table}`` routing under kill -9, in child Spark drivers.

A bounded multi-table stream made with SQL from two sequence splits (split 0 -> ``public.a``,
split 1 -> ``public.b``; each data row follows its table's ``s`` row, as the source writes
them): hot keys changed several times per epoch, one change in seven a delete, and from
``seq`` 200 on ``public.a`` has a column more (its schema evolves under the kills). Runs are
killed at named points of the routed commit -- between the two tables' versions, before a
table's version, after the decision -- then a last run finishes. Each target must hold its
shape of its table (public.a every version, public.b soft deletes), each table must hold every epoch exactly once, and nothing on
storage may be unreferenced by its log.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.testing.delta_log import unreferenced
from flinkish_spark.testing.two_tables import LENGTHS, expected_history, expected_soft, stream_sql

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

#: public.a keeps its history tracking only 'extra' (a change of 'v' alone updates the current version in place;
#: the Iceberg crash test keeps plain history), public.b soft deletes (the crash points are the same for every shape;
#: the upsert shape goes through kills in the routed mirror tests).
MODES = ('[{"tables": "public.a", "mode": "history", "trackHistoryColumns.except": ["v"]}, '
         '{"tables": "public.b", "deletes": "soft"}]')
HISTORY = ("_valid_from", "_valid_to", "_current")


def spec(tmp_path: Path, commit_processes: int = 0) -> dict:
    """``commit_processes``: the routed sink's option commitProcesses (0: the tables' commits in the commit worker)."""
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 140}},
        "select": stream_sql(),
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "mirror", "path": str(tmp_path / "lake" / "{schema}" / "{table}"), "checkpointInterval": 3,
            "rowsPerFile": 40, "tableModes": MODES, "commitProcesses": str(commit_processes)}},
        "master": "local[2,4]",
    }


def test_routed_delta_survives_kills_between_and_inside_the_tables_commits(run_pipeline, tmp_path: Path) -> None:
    lake = tmp_path / "lake" / "public"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "mirror")

    def txn(table: str) -> int:
        try:
            v = deltalake.DeltaTable(str(lake / table)).transaction_version("mirror")
        except deltalake.exceptions.TableNotFoundError:
            return -1
        return -1 if v is None else v

    # sink.between_tables is hit once per epoch (two tables): its 2nd hit is in epoch 1, after
    # public.a's version and before public.b's.
    run = run_pipeline(spec(tmp_path), crash_at="sink.between_tables:2")
    assert run.killed, f"no kill: {run.output[-3000:]}"
    decided, done = log.epochs()
    assert 1 in decided and 1 not in done
    assert (txn("a"), txn("b")) == (1, 0)  # one table has the epoch, the other not yet

    # The restart commits public.b's share of epoch 1 (public.a's is not applied again), then
    # is killed inside a later table commit, before its version -- this run and the last one with two
    # committer processes (commitProcesses): the kill is in a committer, whose crash point kills the
    # whole driver's process group, the committers with it.
    run = run_pipeline(spec(tmp_path, 2), crash_at="delta.keyed.before_version:3")
    assert run.killed, f"no kill: {run.output[-3000:]}"
    assert txn("b") >= 1

    run = run_pipeline(spec(tmp_path), crash_at="sink.after_decision:2")
    assert run.killed, f"no kill: {run.output[-3000:]}"

    last = run_pipeline(spec(tmp_path, 2))
    assert last.returncode == 0, last.output[-3000:]
    a = deltalake.DeltaTable(str(lake / "a"))
    b = deltalake.DeltaTable(str(lake / "b"))
    assert [f.name for f in a.schema().fields if f.name not in HISTORY] == ["id", "v", "extra"]
    assert sorted(tuple(r[c] for c in ("id", "v", "extra", *HISTORY))
                  for r in pa.table(a.scan()).to_pylist()) == expected_history(track_extra=True)  # every version once
    assert sorted((r["k"], r["n"], r["_deleted"]) for r in pa.table(b.scan()).to_pylist()) == expected_soft()
    for table in (a, b):
        epochs = [int(h["flinkish.epoch"]) for h in table.history()
                  if h.get("flinkish.uid") == "mirror" and "flinkish.epoch" in h]
        assert len(epochs) == len(set(epochs)) and epochs, epochs  # each epoch at most once in each table
    io = FileIO.for_url(str(tmp_path))
    assert unreferenced(io, str(lake / "a")) == set() and unreferenced(io, str(lake / "b")) == set()
