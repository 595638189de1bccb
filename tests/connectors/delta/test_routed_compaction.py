"""Routed Delta targets with ``compactEvery``: each table compacted every N of its versions at its own offset,
its file count bounded, its rows those of the reference model, a crash at the compaction's commit replayed
(in process, no Spark: the routed sink and its decision log, as tests/connectors/delta/test_routed.py)."""

from __future__ import annotations

import collections
import json
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

deltalake = pytest.importorskip("deltalake")

EVERY = 4
KEYS = 100  # rows enough that a file's rows are rarely all replaced: without compaction the files pile up
SCHEMAS = [table_schema(f"public.t{i}", [("id", "bigint"), ("v", "text"), ("n", "int")], ("id",)) for i in range(5)]



class Mirror:
    def __init__(self, tmp_path: Path, modes: Any = None) -> None:
        self.tmp, self.meta, self.epochs, self.modes = tmp_path, str(tmp_path / "meta"), 0, modes
        self.readers: dict[str, Any] = {}

    def sink(self):
        from flinkish_spark.connectors.delta.routed import RoutedDeltaSink

        log = self.log()
        return RoutedDeltaSink(FileIO.for_url(str(self.tmp / "lake")), Route(str(self.tmp / "lake" / "{schema}" / "{table}"), "path"),
                               "m", checkpoint_interval=10, metadata_io=FileIO.for_url(self.meta),
                               metadata_dir=log.directory, compact_every=EVERY,
                               **({"modes": self.modes} if self.modes is not None else {}))

    def log(self) -> DecisionLog:
        return DecisionLog(FileIO.for_url(self.meta), self.meta, "m")

    def epoch(self, batch: pa.Table) -> None:
        sink = self.sink()
        prepared = [sink.prepare(iter(batch.to_batches()), PrepareContext("m", self.epochs, 0, 0))]
        commit_epoch(self.sink(), self.log(), self.epochs, prepared, "run")
        self.epochs += 1

    def path(self, table: str) -> Path:
        return self.tmp / "lake" / table.replace(".", "/")

    def rows(self, table: str) -> list[dict]:
        return sorted(pa.table(deltalake.DeltaTable(str(self.path(table))).scan()).to_pylist(), key=lambda r: r["id"])

    def live_files(self, table: str) -> list[str]:
        """What a reader of the newest version reads (one delta-rs table per target, brought up to date)."""
        dt = self.readers.get(table)
        if dt is None:
            dt = self.readers[table] = deltalake.DeltaTable(str(self.path(table)))
        else:
            dt.update_incremental()
        return dt.file_uris()

    def operations(self, table: str) -> list[tuple[int, str]]:
        return sorted((h["version"], h["operation"]) for h in deltalake.DeltaTable(str(self.path(table))).history())

    def parquet_on_disk(self, table: str) -> set[str]:
        return {str(p) for p in (self.path(table) / "flinkish").rglob("*.parquet")}


class Source:
    """Random changes of every table's keys, and the reference model of each table."""

    def __init__(self, seed: int) -> None:
        self.rng, self.stream = random.Random(seed), StreamBuilder()
        self.models = {s.table: Model("upsert", "true") for s in SCHEMAS}
        self.lsn = 0
        for s in SCHEMAS:
            self.stream.snapshot(s, [{"id": k, "v": f"s{k}", "n": 1 + len(str(k))} for k in range(KEYS)])
            self.models[s.table].apply([Change(k, "r", f"s{k}", None) for k in range(KEYS)])

    def epoch(self, e: int) -> pa.Table:
        for _ in range(3):  # three transactions, each changing a few keys of some tables
            changes = []
            for s in SCHEMAS:
                if self.rng.random() < 0.3 and s.table != "public.t0":
                    continue  # t0 changes in every epoch, the others in ~70%
                for _ in range(self.rng.randint(1, 3)):
                    k, op = self.rng.randrange(KEYS + KEYS // 4), self.rng.choice("cuud")
                    value = None if op == "d" else f"e{e}-{self.rng.randrange(1000)}"
                    row = {"id": k} if op == "d" else {"id": k, "v": value, "n": len(value or "")}
                    changes.append((s, op, row))
                    self.lsn += 1
                    self.models[s.table].apply([Change(k, op, value, self.lsn)])
            if changes:
                self.stream.transaction(*changes)
        return self.stream.batch()

    def expected(self, table: str) -> list[dict]:
        return sorted(self.models[table].table(), key=lambda r: r["id"])


def test_each_routed_table_is_compacted_every_n_of_its_versions_at_its_own_offset_with_its_files_bounded(
        tmp_path: Path) -> None:
    """200 epochs of 5 tables (one changing in every epoch, the others in ~70%), compactEvery=4: after every
    epoch each table has at most 4 live files (1 after a compaction of its small files, + at most 1 per
    commit until the next; without compaction 46-58 after 200 epochs, measured) and the rows of the
    reference model."""
    m, src = Mirror(tmp_path), Source(7)
    m.epoch(src.epoch(0))
    most = 0
    for e in range(1, 200):
        m.epoch(src.epoch(e))
        for s in SCHEMAS:
            most = max(most, len(m.live_files(s.table)))
            assert most <= EVERY, (e, s.table, m.live_files(s.table))
    for s in SCHEMAS:
        assert m.rows(s.table) == src.expected(s.table), s.table
        ops = m.operations(s.table)
        compactions = [v for v, op in ops if op == "OPTIMIZE"]
        assert len(compactions) >= (len(ops) - 1) // (EVERY + 1) - 1, ops  # ~ one per N of its commits
        assert all(b - a <= EVERY + 1 for a, b in zip(compactions, compactions[1:])), ops
    firsts = {s.table: min(v for v, op in m.operations(s.table) if op == "OPTIMIZE") for s in SCHEMAS}
    assert len(set(firsts.values())) > 1, firsts  # spread: not every table compacts in the same epoch
    assert most > 1  # files did pile up between compactions: the bound is not trivially met


@pytest.mark.parametrize("point", ["delta.compaction.before_version", "delta.compaction.after_version"])
def test_a_crash_at_a_routed_tables_compaction_is_replayed_without_losing_or_repeating_a_change(
        tmp_path: Path, monkeypatch, point: str) -> None:
    """kill -9 right before / after the compaction's version: the restart commits the decided epoch again
    (tables holding it skipped, the others committed), the compaction's files the table does not name are
    deleted, and the next compactions of that table go on. public.t1 is partitioned by 'n' (a rule's
    partitionBy): its compactions write per partition, its files bounded per partition."""
    from flinkish_spark.connectors.delta import compaction
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    partitioned = parse_table_modes({"tableModes": '[{"tables": "public.t1", "partitionBy": ["n"]}]'}.get, "test")
    m, src = Mirror(tmp_path, partitioned), Source(11)
    batches = [src.epoch(0)]
    killed = None

    def crash(name: str) -> None:
        if name == point and killed is None:
            raise Killed

    monkeypatch.setattr(compaction, "crash_point", crash)
    for e in range(1, 20):
        batches.append(src.epoch(e))
    for batch in batches:
        try:
            m.epoch(batch)
        except Killed:
            killed = m.epochs
            m.epoch(batch)  # the restart: the same epoch (its decision is recorded) once more
    assert killed is not None
    for s in SCHEMAS:
        assert m.rows(s.table) == src.expected(s.table), s.table
        named = {u.removeprefix("file://") for u in m.live_files(s.table)}
        assert m.parquet_on_disk(s.table) <= named | _named_by_any_version(m.path(s.table)), s.table
        if s.table == "public.t1":  # per partition
            parts = collections.Counter(u.split("/n=")[1].split("/")[0] for u in named)
            assert len(parts) > 1 and max(parts.values()) <= EVERY, parts
        else:
            assert len(named) <= EVERY
    assert sum(op == "OPTIMIZE" for s in SCHEMAS for _, op in m.operations(s.table)) >= 5 * 2


def _named_by_any_version(path: Path) -> set[str]:
    """Files some version added (a reader of an older version reads them: VACUUM's job, not the sink's)."""
    out = set()
    for f in (path / "_delta_log").glob("*.json"):
        for line in f.read_text().splitlines():
            add = json.loads(line).get("add")
            if add:
                out.add(str(path / add["path"]))
    return out
