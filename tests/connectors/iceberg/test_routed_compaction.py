"""Routed Iceberg targets with ``compactEvery``: each table's data files with position deletes rewritten, and its
small data files merged, every N of its snapshots at its own offset, its data and delete files bounded, its rows
those of the reference model, a crash before the compaction's snapshot replayed (in process, no Spark: as
tests/connectors/iceberg/test_routed.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.changes import Change, Model
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from flinkish_spark.testing.kills import Killed

pyiceberg = pytest.importorskip("pyiceberg")

EVERY = 3
KEYS = 60
SCHEMAS = [table_schema(f"public.t{i}", [("id", "bigint"), ("v", "text"), ("n", "int")], ("id",)) for i in range(2)]



class Mirror:
    def __init__(self, tmp_path: Path, retain: int = 100) -> None:
        from flinkish_spark.connectors.iceberg.catalog import catalog_properties

        self.tmp, self.meta, self.epochs, self.retain = tmp_path, str(tmp_path / "meta"), 0, retain
        self.props = catalog_properties(None, None, None, str(tmp_path / "cp"), {}, "test")

    def sink(self) -> Any:
        from flinkish_spark.connectors.iceberg.routed import RoutedIcebergSink

        return RoutedIcebergSink(self.props, Route("mirror.{schema}_{table}", "iceberg"), "m", {},
                                 metadata_io=FileIO.for_url(self.meta), metadata_dir=self.log().directory,
                                 compact_every=EVERY, retain_snapshots=self.retain)

    def log(self) -> DecisionLog:
        return DecisionLog(FileIO.for_url(self.meta), self.meta, "m")

    def epoch(self, batch: pa.Table) -> None:
        sink = self.sink()
        prepared = [sink.prepare(iter(batch.to_batches()), PrepareContext("m", self.epochs, 0, 0))]
        commit_epoch(self.sink(), self.log(), self.epochs, [p for p in prepared if p is not None], "run")
        self.epochs += 1

    def table(self, table: str) -> Any:
        from flinkish_spark.connectors.iceberg.catalog import load

        return load(self.props).load_table("mirror." + table.replace(".", "_"))

    def rows(self, table: str) -> list[dict]:
        return sorted(self.table(table).scan().to_arrow().to_pylist(), key=lambda r: r["id"])

    def live(self, table: str) -> tuple[int, int]:
        """(data files, delete files) a reader of the current snapshot reads."""
        tasks = list(self.table(table).scan().plan_files())
        return len(tasks), len({d.file_path for t in tasks for d in t.delete_files})

    def compactions(self, table: str) -> int:
        return sum(1 for s in self.table(table).snapshots()
                   if s.summary is not None and s.summary.additional_properties.get("flinkish.compaction") == "true")


class Source:
    def __init__(self, seed: int, schemas: list[Any] = SCHEMAS) -> None:
        self.rng, self.stream, self.schemas = random.Random(seed), StreamBuilder(), schemas
        self.models = {s.table: Model("upsert", "true") for s in schemas}
        self.lsn = 0
        for s in schemas:
            self.stream.snapshot(s, [{"id": k, "v": f"s{k}", "n": 1 + len(str(k))} for k in range(KEYS)])
            self.models[s.table].apply([Change(k, "r", f"s{k}", None) for k in range(KEYS)])

    def epoch(self, e: int) -> pa.Table:
        changes = []
        for s in self.schemas:
            for _ in range(self.rng.randint(1, 4)):
                k, op = self.rng.randrange(KEYS + KEYS // 4), self.rng.choice("cuud")
                value = None if op == "d" else f"e{e}-{self.rng.randrange(1000)}"
                changes.append((s, op, {"id": k} if op == "d" else {"id": k, "v": value, "n": len(value or "")}))
                self.lsn += 1
                self.models[s.table].apply([Change(k, op, value, self.lsn)])
        self.stream.transaction(*changes)
        return self.stream.batch()

    def expected(self, table: str) -> list[dict]:
        return sorted(self.models[table].table(), key=lambda r: r["id"])


def test_each_routed_iceberg_table_rewrites_its_deleted_rows_every_n_snapshots_and_a_crash_is_replayed(
        tmp_path: Path, monkeypatch) -> None:
    """12 epochs of 2 tables, compactEvery=3, a kill before one compaction's snapshot: after every epoch each
    table has at most 3 live delete files (0 after a compaction, at most 1 per snapshot until the next; 5
    for the table whose compaction was killed, until its next), the restart skips the killed table's epoch
    and its cleanup deletes the compaction's files, and every table ends with the rows of the reference
    model."""
    from flinkish_spark.connectors.iceberg import compact

    m, src = Mirror(tmp_path), Source(3)
    killed = None

    def crash(name: str) -> None:
        # not the first ones: those merge the first small files, before any table has deletes to pile up
        if name == "iceberg.compaction.before_snapshot" and killed is None and m.epochs >= 5:
            raise Killed

    monkeypatch.setattr(compact, "crash_point", crash)
    most = 0
    for e in range(12):
        batch = src.epoch(e) if e else src.stream.batch()
        try:
            m.epoch(batch)
        except Killed:
            killed = m.epochs
            m.epoch(batch)  # the restart: the decided epoch once more
        for s in SCHEMAS:
            deletes = m.live(s.table)[1]
            most = max(most, deletes)
            # N at most; the table whose compaction was killed waits for its next due snapshot: 2N - 1
            assert deletes <= (EVERY if killed is None else 2 * EVERY - 1), (e, s.table, deletes)
    assert killed is not None and most > EVERY  # the killed compaction's table went past N, and came back
    for s in SCHEMAS:
        assert m.rows(s.table) == src.expected(s.table), s.table
        assert m.compactions(s.table) >= 2, s.table
        assert m.live(s.table)[1] <= EVERY, s.table
        location = Path(m.table(s.table).location().removeprefix("file://"))
        on_disk = {str(p) for p in (location / "data").rglob("*.parquet")}
        named = {f.removeprefix("file://") for snap in m.table(s.table).snapshots()
                 for f in _files_of(m.table(s.table), snap)}
        assert on_disk <= named, sorted(on_disk - named)


def _files_of(table: Any, snap: Any) -> list[str]:
    return [e.data_file.file_path for mf in snap.manifests(table.io) for e in mf.fetch_manifest_entry(table.io, discard_deleted=False)]


def test_each_routed_iceberg_tables_small_data_files_are_merged_so_its_live_files_stay_bounded_for_200_epochs(
        tmp_path: Path) -> None:
    """200 epochs of a table changing in every epoch (about one data file and one delete file per snapshot; one
    table: 2 took 30 s, the other test covers the offsets), compactEvery=3: after every epoch the table has at
    most 3 live data files and 3 live delete files (1 data file and no delete file after a compaction, which
    merges the files smaller than a quarter of rowsPerFile, + at most 1 of each per snapshot until the next),
    and ends with the rows of the reference model. Rewriting only the files with deletes, one file each, left
    the rows spread over ever more small files: up to 43 live data files (37 after the 200th epoch), measured."""
    schemas = SCHEMAS[:1]
    # retainSnapshots=10: smaller metadata for every commit to parse (100, the default: 1.6x slower); the live files
    # do not depend on it
    m, src = Mirror(tmp_path, retain=10), Source(5, schemas)
    m.epoch(src.stream.batch())
    most = (0, 0)
    for e in range(1, 200):
        m.epoch(src.epoch(e))
        for s in schemas:
            data, deletes = m.live(s.table)
            most = (max(most[0], data), max(most[1], deletes))
            assert data <= EVERY and deletes <= EVERY, (e, s.table, data, deletes)
    for s in schemas:
        assert m.rows(s.table) == src.expected(s.table), s.table
    assert most[0] > 1  # data files did pile up between compactions: the bound is not trivially met
