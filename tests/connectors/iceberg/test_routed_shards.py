"""Merged shards into one routed Iceberg target, in process (no Spark): several source tables routed by one merging
rule (flinkish_spark.connectors.lakehouse.routes) through prepare / the decision log / commit, the target read back
with pyiceberg and compared with the reference model of each shard (flinkish_spark/testing/changes.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.connectors.lakehouse.routes import parse_routes
from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import SchemaChangeError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.changes import Model, merged_table, normalized, random_epochs
from flinkish_spark.testing.kills import Killed, kill_at
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from tests.connectors.iceberg.test_routed import Mirror
from tests.connectors.postgres.test_routed_shards import ITEMS, SHARDS, tasks

pyiceberg = pytest.importorskip("pyiceberg")

RULES = [{"source-table": "shop_*.orders", "sink-table": "mirror.orders"}]


class Shards(Mirror):
    """:class:`Mirror` (targets ``mirror.{schema}_{table}``) with route rules."""

    def __init__(self, tmp_path: Path, rules: list[dict[str, Any]] = RULES, **options: Any) -> None:
        modes = options.pop("modes", None)
        super().__init__(tmp_path, modes=modes)
        self.route = parse_routes(Route(self.template, "iceberg"), {"routes": json.dumps(rules), **options}.get, "test")

    def sink(self) -> Any:
        from flinkish_spark.connectors.iceberg.routed import RoutedIcebergSink

        return RoutedIcebergSink(self.props, self.route, self.uid, {}, self.merge_mode,  # type: ignore[arg-type]
                                 rows_per_file=3, metadata_io=FileIO.for_url(self.meta),
                                 metadata_dir=self.log().directory,
                                 **({"modes": self.modes} if self.modes is not None else {}))

    def read(self, name: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
        rows = self.catalog().load_table(name).scan().to_arrow().to_pylist()
        return normalized([{c: r.get(c) for c in columns} for r in rows])

    def snapshots(self, name: str) -> int:
        return len(self.catalog().load_table(name).snapshots())


def test_three_shards_merge_into_one_target_one_snapshot_per_epoch_and_a_replay_adds_nothing(tmp_path: Path) -> None:
    m = Shards(tmp_path)
    names = [s.table for s in SHARDS] + [ITEMS.table]
    models = {n: Model("upsert", "true") for n in names}
    epochs = {n: random_epochs(seed=i, epochs=4, keys=8, per_epoch=20, tasks=2) for i, n in enumerate(names)}
    for e in range(4):
        changes = {n: epochs[n][e] for n in names}
        m.epoch(*tasks(changes))
        for n in names:
            models[n].apply(changes[n])
        assert m.read("mirror.orders", ("id", "v", "n", "_source_table")) == merged_table(
            {n: models[n] for n in names if n.endswith(".orders")})
        assert m.read("mirror.shop_a_items", ("id", "v", "n")) == models[ITEMS.table].table()
    assert m.snapshots("mirror.orders") == 4  # one snapshot per epoch for the three shards
    from flinkish_spark.mirror.compare import iceberg_reader

    compare = iceberg_reader(m.template, {"routes": json.dumps(RULES)}, str(tmp_path / "cp"))  # the embedded catalog
    for n in names:  # what `flinkish mirror compare` sees of each table: a shard's rows of the merged target
        rows = compare(n)
        assert rows is not None and normalized(rows.select(["id", "v", "n"]).to_pylist()) == models[n].table()
    m.epochs -= 1
    m.epoch(*tasks({n: epochs[n][-1] for n in names}))  # a replay of the last epoch: nothing added
    assert m.snapshots("mirror.orders") == 4
    m.catalog().drop_table("mirror.shop_a_items")
    assert m.sink().last_committed_epoch() == 3  # found in the merged target (a rule's target)


@pytest.mark.parametrize("deletes", ["true", "soft"])
def test_a_truncate_resnapshot_or_added_column_of_one_shard_touches_only_its_rows_and_a_kill_commits_once(
        tmp_path: Path, monkeypatch, deletes: str) -> None:
    from flinkish_spark.connectors.iceberg import routed
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    a, b, c = SHARDS
    m = Shards(tmp_path, modes=parse_table_modes({"deletes": deletes}.get, "test"))
    s = StreamBuilder()
    for shard in SHARDS:
        s.snapshot(shard, [{"id": i, "v": f"{shard.table[5]}{i}", "n": i} for i in (1, 2, 3)])
    s.snapshot(ITEMS, [{"id": 1, "v": "i", "n": 1}])
    m.epoch(s.batch())

    def live(columns: tuple[str, ...] = ("_source_table", "id", "v")) -> list[tuple]:
        rows = m.read("mirror.orders", columns + (("_deleted",) if deletes == "soft" else ()))
        return sorted(tuple(r[k] for k in columns) for r in rows if not r.get("_deleted"))

    s.transaction((a, "t", None), (a, "c", {"id": 7, "v": "a7", "n": 7}), (b, "u", {"id": 1, "v": "b1'", "n": 1}))
    m.epoch(s.batch())
    assert live() == [("shop_a.orders", 7, "a7"), ("shop_b.orders", 1, "b1'"), ("shop_b.orders", 2, "b2"),
                      ("shop_b.orders", 3, "b3"), ("shop_c.orders", 1, "c1"), ("shop_c.orders", 2, "c2"),
                      ("shop_c.orders", 3, "c3")]
    if deletes == "soft":  # the truncated shard's rows are kept, marked
        assert sum(1 for r in m.read("mirror.orders", ("_deleted",)) if r["_deleted"]) == 3

    wider = table_schema("shop_c.orders", [("id", "bigint"), ("v", "text"), ("n", "int"), ("extra", "text")], ("id",))
    s.marker(b, "B").snapshot(b, [{"id": 1, "v": "b1'", "n": 1}, {"id": 2, "v": "b2", "n": 2}]).marker(b, "E")
    s.transaction((wider, "u", {"id": 2, "v": "c2", "n": 2, "extra": "x"}), (a, "c", {"id": 3, "v": "a3", "n": 3}),
                  (ITEMS, "u", {"id": 1, "v": "i2", "n": 1}))
    batch = s.batch()
    kill_at(monkeypatch, routed, "sink.between_tables")  # the first target has the epoch, the other not yet
    with pytest.raises(Killed):
        m.epoch(batch)
    monkeypatch.undo()
    m.epoch(batch)  # the restart commits the recorded decision: the target without it, once
    m.epochs -= 1
    m.epoch(batch)
    assert live(("_source_table", "id", "v", "extra")) == [
        ("shop_a.orders", 3, "a3", None), ("shop_a.orders", 7, "a7", None), ("shop_b.orders", 1, "b1'", None),
        ("shop_b.orders", 2, "b2", None), ("shop_c.orders", 1, "c1", None), ("shop_c.orders", 2, "c2", "x"),
        ("shop_c.orders", 3, "c3", None)]
    assert m.read("mirror.shop_a_items", ("id", "v")) == [{"id": 1, "v": "i2"}]


def test_a_narrower_type_in_another_shard_fits_and_different_keys_stop_naming_the_shards(tmp_path: Path) -> None:
    a, b = (table_schema(f"shop_{x}.orders", [("id", "bigint"), ("n", t)], ("id",)) for x, t in (("a", "bigint"), ("b", "int")))
    m = Shards(tmp_path)
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "n": 2**40}]).snapshot(b, [{"id": 1, "n": 5}])
    m.epoch(s.batch())
    s.transaction((b, "u", {"id": 1, "n": 6}))  # an announced int in shop_b while the target holds bigint: fits
    m.epoch(s.batch())
    assert m.read("mirror.orders", ("id", "n", "_source_table")) == normalized(
        [{"id": 1, "n": 2**40, "_source_table": "shop_a.orders"}, {"id": 1, "n": 6, "_source_table": "shop_b.orders"}])
    other = table_schema("shop_c.orders", [("k", "text"), ("n", "int")], ("k",))
    s.snapshot(other, [{"k": "x", "n": 1}]).snapshot(b, [{"id": 2, "n": 1}])
    with pytest.raises(SchemaChangeError, match=r"orders have different primary keys: shop_b.orders keyed by \(id\); "
                                                r"shop_c.orders keyed by \(k\)"):
        m.epoch(s.batch())


def test_history_in_a_merged_target_closes_only_the_truncated_or_resnapshotted_shards_versions(tmp_path: Path) -> None:
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes
    from tests.connectors.delta.test_routed_shards import HISTORY, history_case, history_rows

    m = Shards(tmp_path, modes=parse_table_modes({"mode": "history"}.get, "test"))
    history_case(m, lambda: history_rows(m.read("mirror.orders", HISTORY)), lambda: m.snapshots("mirror.orders"))
