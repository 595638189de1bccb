"""Spark's checkpointLocation deleted (or replaced) under the same sink uid: refused, or continued on request.

Deleting ``checkpointLocation`` also deletes the sink's default metadata
(``<checkpointLocation>/flinkish``), and Spark numbers epochs from 0 again. Every sink must
then consult its *target* (Delta txn, Iceberg snapshot property, committed Parquet names,
PostgreSQL ``flinkish_commits``): the query is refused at start with one
``CheckpointMismatchError`` naming the uid, the target's last epoch and the choices, and
nothing is written; with ``continueAfterEpoch`` the new rows land after the old ones and no
committed file is touched.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any

import pytest

OLD = [700, 300]  # 3 epochs at 400 rows per trigger: epochs 0, 1, 2
NEW = [200, 100]  # 2 epochs at 150 rows per trigger


def sequence(spark, meta: Path, lengths: list[int], uid: str, per_trigger: int):
    return (spark.readStream.format("flinkish.sequence").option("uid", uid).option("checkpoint", str(meta))
            .option("rowsPerSplit", ",".join(map(str, lengths))).option("maxRowsPerTrigger", str(per_trigger)).load())


def old_rows(spark, tmp_path: Path):
    return sequence(spark, tmp_path / "meta-old", OLD, "seq-old", 400)


def new_rows(spark, tmp_path: Path):
    # A new source (its own uid and metadata): the reset query reads rows the table does not have yet.
    return sequence(spark, tmp_path / "meta-new", NEW, "seq-new", 150)


def rows(lengths: list[int]) -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(lengths) for i in range(n))


def write(df, cp: Path, fmt: str, **options: str) -> str | None:
    """Run the query to its end; return the text of its error (None when it succeeded)."""
    w = df.writeStream.format(fmt).option("uid", "out").option("checkpointLocation", str(cp))
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    try:
        q.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - the StreamingQueryException carries the Python error's text
        return str(exc)
    return None if q.exception() is None else str(q.exception())


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_refused(error: str | None, target_epoch: int, option: str = "continueAfterEpoch") -> None:
    assert error is not None, "the reset query was not refused"
    assert "CheckpointMismatchError" in error, error[-3000:]
    assert "sink uid 'out'" in error and f"last committed epoch {target_epoch}" in error, error[-3000:]
    assert "new 'uid'" in error and f"{option}" in error, error[-3000:]


# -- flinkish.delta ------------------------------------------------------------------------------------


def test_delta(spark, tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table, cp = tmp_path / "table", tmp_path / "cp"

    def read() -> collections.Counter:
        t = deltalake.DeltaTable(str(table)).to_pyarrow_table(columns=["split", "seq"])
        return collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))

    def epochs() -> list[int]:
        return sorted(int(h["flinkish.epoch"]) for h in deltalake.DeltaTable(str(table)).history() if h.get("flinkish.uid") == "out")

    assert write(old_rows(spark, tmp_path), cp, "flinkish.delta", path=str(table)) is None
    assert read() == rows(OLD) and epochs() == [0, 1, 2]
    before = files(table)

    shutil.rmtree(cp)  # the query's checkpointLocation, and with it <checkpointLocation>/flinkish
    assert_refused(write(new_rows(spark, tmp_path), cp, "flinkish.delta", path=str(table)), 2)
    assert files(table) == before  # nothing written: no data file, no log version

    assert_refused(write(new_rows(spark, tmp_path), cp, "flinkish.delta", path=str(table), continueAfterEpoch="1"), 2)
    assert files(table) == before

    assert write(new_rows(spark, tmp_path), cp, "flinkish.delta", path=str(table), continueAfterEpoch="2") is None
    assert read() == rows(OLD) + rows(NEW)
    assert epochs() == [0, 1, 2, 3, 4]  # the reset query's epochs 0 and 1 are the table's 3 and 4
    after = files(table)
    assert all(after.get(name) == data for name, data in before.items())  # no committed file touched
    uris = {u[len(str(table)) + 1:] for u in deltalake.DeltaTable(str(table)).file_uris()}
    assert uris == {n for n in after if n.endswith(".parquet") and not n.startswith("_delta_log")}

    # a restart of the continued query goes on where it stopped (the option is no longer consulted)
    assert write(new_rows(spark, tmp_path), cp, "flinkish.delta", path=str(table), continueAfterEpoch="2") is None
    assert read() == rows(OLD) + rows(NEW)


# -- flinkish.parquet ----------------------------------------------------------------------------------


def test_parquet(spark, tmp_path: Path) -> None:
    out, cp = tmp_path / "out", tmp_path / "cp"

    def read() -> collections.Counter:
        return collections.Counter((r.split, r.seq) for r in spark.read.parquet(str(out)).collect())

    assert write(old_rows(spark, tmp_path), cp, "flinkish.parquet", path=str(out)) is None
    before = files(out)
    assert read() == rows(OLD)

    shutil.rmtree(cp)
    assert_refused(write(new_rows(spark, tmp_path), cp, "flinkish.parquet", path=str(out)), 2)
    assert files(out) == before  # no committed name overwritten, nothing staged

    assert write(new_rows(spark, tmp_path), cp, "flinkish.parquet", path=str(out), continueAfterEpoch="2") is None
    after = files(out)
    assert all(after.get(name) == data for name, data in before.items())
    assert sorted({n.split("-")[1] for n in after if n.startswith("part-")}) == [f"{e:012d}" for e in range(5)]
    assert read() == rows(OLD) + rows(NEW)


# -- flinkish.iceberg ----------------------------------------------------------------------------------


def test_iceberg(spark, tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog

    cp = tmp_path / "cp"
    where = {"catalogUri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh", "table": "db.events"}

    def table() -> Any:
        return SqlCatalog("flinkish", uri=where["catalogUri"], warehouse=where["warehouse"]).load_table("db.events")

    def read() -> collections.Counter:
        t = table().scan(selected_fields=("split", "seq")).to_arrow()
        return collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))

    def epochs() -> list[int]:
        return sorted(int(s.summary.additional_properties["flinkish.epoch"]) for s in table().snapshots()
                      if s.summary.additional_properties.get("flinkish.uid") == "out")

    assert write(old_rows(spark, tmp_path), cp, "flinkish.iceberg", **where) is None
    assert read() == rows(OLD) and epochs() == [0, 1, 2]
    before, snapshot = files(tmp_path / "wh"), table().current_snapshot().snapshot_id

    shutil.rmtree(cp)
    assert_refused(write(new_rows(spark, tmp_path), cp, "flinkish.iceberg", **where), 2)
    assert files(tmp_path / "wh") == before and table().current_snapshot().snapshot_id == snapshot

    assert write(new_rows(spark, tmp_path), cp, "flinkish.iceberg", continueAfterEpoch="2", **where) is None
    assert read() == rows(OLD) + rows(NEW) and epochs() == [0, 1, 2, 3, 4]
    after = files(tmp_path / "wh")
    assert all(after.get(name) == data for name, data in before.items() if name.endswith(".parquet"))


# -- flinkish.postgres (staged) ------------------------------------------------------------------------


def test_postgres_staged(spark, tmp_path: Path, pg_url: str) -> None:
    pytest.importorskip("psycopg")
    import psycopg

    cp = tmp_path / "cp"
    target = {"url": pg_url, "table": "public.events", "createTable": "true", "commitMode": "staged"}

    def query(sql: str) -> list[tuple]:
        with psycopg.connect(pg_url) as c:
            return c.execute(sql).fetchall()

    def read() -> collections.Counter:
        return collections.Counter(query("SELECT split, seq FROM public.events"))

    assert write(old_rows(spark, tmp_path), cp, "flinkish.postgres", **target) is None
    assert read() == rows(OLD)
    commits = query("SELECT epoch FROM flinkish_commits ORDER BY epoch")
    assert commits == [(0,), (1,), (2,)]

    shutil.rmtree(cp)
    assert_refused(write(new_rows(spark, tmp_path), cp, "flinkish.postgres", **target), 2)
    assert read() == rows(OLD) and query("SELECT epoch FROM flinkish_commits ORDER BY epoch") == commits

    assert write(new_rows(spark, tmp_path), cp, "flinkish.postgres", continueAfterEpoch="2", **target) is None
    assert read() == rows(OLD) + rows(NEW)
    assert query("SELECT epoch FROM flinkish_commits ORDER BY epoch") == [(e,) for e in range(5)]


# -- transactional() foreachBatch ----------------------------------------------------------------------


def run_transactional(df, cp: Path, sink: Any, meta: Path, **kwargs: Any) -> str | None:
    from flinkish_spark import transactional

    q = (df.writeStream.foreachBatch(transactional(sink, uid="out", checkpoint=str(meta), **kwargs))
         .option("checkpointLocation", str(cp)).trigger(availableNow=True).start())
    try:
        q.awaitTermination()
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return None if q.exception() is None else str(q.exception())


@pytest.mark.parametrize("lost", ["checkpointLocation", "both"])
def test_transactional(spark, tmp_path: Path, lost: str) -> None:
    """foreachBatch: the decision log is the user's 'checkpoint', apart from Spark's checkpointLocation.
    With it kept, the Spark query id tells the reset; with both gone, the target does."""
    from flinkish_spark.connectors import ParquetSink

    out, cp, meta = tmp_path / "out", tmp_path / "cp", tmp_path / "fbmeta"
    df = old_rows(spark, tmp_path)
    sink = ParquetSink.at(str(out), uid="out", schema=df.schema)

    def read() -> collections.Counter:
        return collections.Counter((r.split, r.seq) for r in spark.read.parquet(str(out)).collect())

    assert run_transactional(df, cp, sink, meta) is None
    before = files(out)
    shutil.rmtree(cp)
    if lost == "both":
        shutil.rmtree(meta)
    assert_refused(run_transactional(new_rows(spark, tmp_path), cp, sink, meta), 2, option="continue_after_epoch")
    assert files(out) == before

    assert run_transactional(new_rows(spark, tmp_path), cp, sink, meta, continue_after_epoch=2) is None
    assert read() == rows(OLD) + rows(NEW)
    after = files(out)
    assert all(after.get(name) == data for name, data in before.items())
