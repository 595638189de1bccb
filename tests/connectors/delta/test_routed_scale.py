"""Scale of the routed ``flinkish.delta`` sink (issue 18, point 7): an epoch's cost and metadata
grow with the tables it changed, not with the tables mirrored.

Sizes and files, never times: an epoch that changes one table writes the same decision record
whether 2 or 40 tables are mirrored, and writes below no other table's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

pytest.importorskip("deltalake")


def files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


def one_table_epoch(tmp: Path, tables: int) -> tuple[int, set[str]]:
    """Mirror ``tables`` tables (a snapshot epoch), then an epoch changing one of them: (its decision
    record's bytes, the files that epoch wrote or changed)."""
    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route

    meta = str(tmp / "meta")
    log = DecisionLog(FileIO.for_url(meta), meta, "m")
    sink = RoutedDeltaSink(FileIO.for_url(str(tmp)), Route(str(tmp / "lake" / "{schema}" / "{table}"), "path"), "m",
                           metadata_io=FileIO.for_url(meta), metadata_dir=log.directory)
    schemas = [table_schema(f"public.t_{i:03d}", [("id", "int"), ("v", "text")], ("id",)) for i in range(tables)]
    s = StreamBuilder()
    for schema in schemas:
        s.snapshot(schema, [{"id": i, "v": "x"} for i in range(5)])
    commit_epoch(sink, log, 0, [sink.prepare(iter(s.batch().to_batches()), PrepareContext("m", 0, 0, 0))], "run")
    before = files(tmp)
    s.transaction((schemas[1], "u", {"id": 3, "v": "y"}), (schemas[1], "c", {"id": 7, "v": "z"}))
    commit_epoch(sink, log, 1, [sink.prepare(iter(s.batch().to_batches()), PrepareContext("m", 1, 0, 0))], "run")
    after = files(tmp)
    # A table's Delta checkpoint comes at a version its path's hash picks (routed checkpoints are spread over
    # the interval), so the temporary path decides whether this epoch writes one: not part of the comparison.
    return os.path.getsize(log.path(1)), {p for p, stat in after.items() if before.get(p) != stat
                                          and ".checkpoint." not in p and not p.endswith("_last_checkpoint")}


def test_an_epoch_changing_one_table_writes_the_same_metadata_for_2_and_40_mirrored_tables(tmp_path: Path) -> None:
    small, small_written = one_table_epoch(tmp_path / "two", 2)
    large, large_written = one_table_epoch(tmp_path / "forty", 40)
    # The decision names the one changed table; the bytes differ only by compression noise of
    # the random file names in it.
    assert abs(large - small) <= 64, (small, large)
    assert len(small_written) == len(large_written), (small_written, large_written)
    for written in (small_written, large_written):
        outside = sorted(p for p in written if not p.startswith(("lake/public/t_001/", "meta/sinks/m/")))
        assert outside == [], outside  # no other target, no other metadata touched
        assert any(p.startswith("lake/public/t_001/_delta_log/") for p in written)
        assert any(p.startswith("meta/sinks/m/decisions/") for p in written)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "threads"])
def test_an_epoch_changing_many_tables_commits_each_once_also_after_a_crash_after_the_first(tmp_path: Path, monkeypatch,
                                                                                             staged: bool) -> None:
    """The tables after the first have their versions staged behind one sync (a local disk) or are committed
    several at once (object storage: routed.staged_writes): every one gets the epoch's rows in one version, and a
    restart after a crash past the first table commits the others and leaves the first as it was."""
    import deltalake
    import pyarrow as pa

    from flinkish_spark.connectors.delta import routed
    from flinkish_spark.connectors.lakehouse.routing import Route

    meta = str(tmp_path / "meta")
    log = DecisionLog(FileIO.for_url(meta), meta, "m")
    sink = routed.RoutedDeltaSink(FileIO.for_url(str(tmp_path)), Route(str(tmp_path / "lake" / "{schema}" / "{table}"), "path"),
                                  "m", metadata_io=FileIO.for_url(meta), metadata_dir=log.directory)
    schemas = [table_schema(f"public.t_{i:03d}", [("id", "int"), ("v", "text")], ("id",)) for i in range(20)]
    s = StreamBuilder()
    for schema in schemas:
        s.snapshot(schema, [{"id": 1, "v": "a"}])
    commit_epoch(sink, log, 0, [sink.prepare(iter(s.batch().to_batches()), PrepareContext("m", 0, 0, 0))], "run")
    s.transaction(*[(schema, "u", {"id": 1, "v": f"b{i}"}) for i, schema in enumerate(schemas)])
    s.transaction(*[(schema, "c", {"id": 2, "v": "new"}) for schema in schemas])
    prepared = [sink.prepare(iter(s.batch().to_batches()), PrepareContext("m", 1, 0, 0))]

    def killed_after_the_first_table(point: str) -> None:
        if point == "sink.between_tables":
            raise SystemExit("killed")  # a BaseException, as a kill: nothing in the commit catches it

    monkeypatch.setattr(routed, "crash_point", killed_after_the_first_table)
    monkeypatch.setattr(routed, "staged_writes", lambda io: staged)  # False: as object storage would have it
    with pytest.raises(SystemExit, match="killed"):
        commit_epoch(sink, log, 1, prepared, "run")
    monkeypatch.setattr(routed, "crash_point", lambda point: None)

    def table(i: int) -> deltalake.DeltaTable:
        return deltalake.DeltaTable(str(tmp_path / "lake" / "public" / f"t_{i:03d}"))

    base = table(1).version()  # after the snapshot epoch
    assert [table(i).version() for i in range(20)] == [base + 1] + [base] * 19  # the first table only
    commit_epoch(sink, log, 1, prepared, "run")  # the restart: recover-and-commit of the decision
    assert [table(i).version() for i in range(20)] == [base + 1] * 20  # one version each, the first not again
    for i in range(20):
        rows = sorted(pa.table(table(i).scan()).to_pylist(), key=lambda r: r["id"])
        assert rows == [{"id": 1, "v": f"b{i}"}, {"id": 2, "v": "new"}]
