"""flinkish.iceberg with ``{schema}_{table}`` routing under kill -9, in child Spark drivers.

The two-table stream of :mod:`flinkish_spark.testing.two_tables` (``public.a`` gains a column
midway) into one Iceberg table per source table (a SQL catalog on SQLite, tables on local disk).
Runs are killed between the two tables' snapshots, after a target's creation or schema update
before its data snapshot, and after the decision; then a last run finishes. Each target must
hold its shape of its table (public.a every version, public.b soft deletes), every epoch at most once per table, and no file below
its data folder that the table does not name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.testing.two_tables import LENGTHS, expected_history, expected_soft, stream_sql

pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

#: public.a keeps its history, public.b soft deletes (the crash points are the same for every shape; the upsert
#: shape goes through kills in the routed mirror tests).
MODES = '[{"tables": "public.a", "mode": "history"}, {"tables": "public.b", "deletes": "soft"}]'
HISTORY = ("_valid_from", "_valid_to", "_current")


def spec(tmp_path: Path) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 140}},
        "select": stream_sql(),
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "mirror", "table": "mirror.{schema}_{table}", "catalogUri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/wh", "rowsPerFile": 40, "tableModes": MODES}},
        "master": "local[2,4]",
    }


@pytest.mark.timeout(1800)
def test_routed_iceberg_survives_kills_between_and_inside_the_tables_commits(run_pipeline, tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("flinkish", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "mirror")

    def epochs(table: str) -> list[int]:
        if not catalog.table_exists(f"mirror.{table}"):
            return []
        return sorted(int(s.summary.additional_properties["flinkish.epoch"])
                      for s in catalog.load_table(f"mirror.{table}").snapshots()
                      if s.summary.additional_properties.get("flinkish.uid") == "mirror")

    # sink.between_tables is hit once per epoch (two tables): its 2nd hit is in epoch 1, after
    # public.a's snapshot and before public.b's.
    run = run_pipeline(spec(tmp_path), crash_at="sink.between_tables:2")
    assert run.killed, f"no kill: {run.output[-3000:]}"
    decided, done = log.epochs()
    assert 1 in decided and 1 not in done
    assert (max(epochs("public_a")), max(epochs("public_b"))) == (1, 0)  # one table has the epoch, the other not

    # The restart commits public.b's share of epoch 1; a later run is killed when public.a gains its
    # column (schema updated, data snapshot not written), another after a decision.
    run = run_pipeline(spec(tmp_path), crash_at="iceberg.routed.after_schema:1")
    assert run.killed, f"no kill: {run.output[-3000:]}"
    assert max(epochs("public_b")) >= 1
    assert [f.name for f in catalog.load_table("mirror.public_a").schema().fields if f.name not in HISTORY] == \
        ["id", "v", "extra"]
    run = run_pipeline(spec(tmp_path), crash_at="sink.after_decision:2")
    assert run.killed, f"no kill: {run.output[-3000:]}"

    last = run_pipeline(spec(tmp_path))
    assert last.returncode == 0, last.output[-3000:]
    a = catalog.load_table("mirror.public_a").scan().to_arrow().to_pylist()
    b = catalog.load_table("mirror.public_b").scan().to_arrow().to_pylist()
    assert sorted(tuple(r[c] for c in ("id", "v", "extra", *HISTORY)) for r in a) == expected_history()  # every version once
    assert sorted((r["k"], r["n"], r["_deleted"]) for r in b) == expected_soft()
    io = FileIO.for_url(str(tmp_path))
    for name in ("public_a", "public_b"):
        found = epochs(name)
        assert found and len(found) == len(set(found)), found  # each epoch at most once in each table
        table = catalog.load_table(f"mirror.{name}")
        named = set()
        for task in table.scan().plan_files():
            named.add(io.strip(task.file.file_path))
            named.update(io.strip(d.file_path) for d in task.delete_files)
        data = f"{tmp_path}/wh/mirror/{name}/data"
        assert set(io.find(data)) - named == set()  # nothing below the data folder that the table does not name
