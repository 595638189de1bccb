"""Merged shards into one routed Delta target, in process (no Spark): several source tables routed by one merging
rule (flinkish_spark.connectors.lakehouse.routes) through prepare / the decision log / commit, the target read back
with delta-rs and compared with the reference model of each shard (flinkish_spark/testing/changes.py, merged_table)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routes import parse_routes, path_resolver
from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import ConfigError, SchemaChangeError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.changes import Model, merged_table, normalized, random_epochs
from flinkish_spark.testing.kills import Killed, kill_at
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from tests.connectors.delta.test_routed import Mirror
from tests.connectors.postgres.test_routed_shards import ITEMS, SHARDS, tasks

deltalake = pytest.importorskip("deltalake")

RULES = [{"source-table": "shop_*.orders", "sink-table": "orders"}]


class Shards(Mirror):
    """:class:`Mirror` (targets ``lake/{schema}/{table}``) with route rules."""

    def __init__(self, tmp_path: Path, rules: list[dict[str, Any]] = RULES, **options: Any) -> None:
        modes = options.pop("modes", None)
        super().__init__(tmp_path, modes=modes)
        template = str(tmp_path / "lake" / "{schema}" / "{table}")
        self.route = parse_routes(Route(template, "path"), {"routes": json.dumps(rules), **options}.get, "test",
                                  path_resolver(template, "test"))

    def sink(self):
        from flinkish_spark.connectors.delta.routed import RoutedDeltaSink

        log = self.log()
        return RoutedDeltaSink(FileIO.for_url(str(self.tmp / "lake")), self.route, self.uid, checkpoint_interval=3,
                               metadata_io=FileIO.for_url(self.meta), metadata_dir=log.directory,
                               **({"modes": self.modes} if self.modes is not None else {}))

    def read(self, table: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
        rows = pa.table(deltalake.DeltaTable(self.path(table)).scan()).to_pylist()  # deletion vectors applied
        return normalized([{c: r.get(c) for c in columns} for r in rows])


def test_three_shards_merge_into_one_target_one_version_per_epoch_and_a_replay_adds_nothing(tmp_path: Path) -> None:
    m = Shards(tmp_path)
    names = [s.table for s in SHARDS] + [ITEMS.table]
    models = {n: Model("upsert", "true") for n in names}
    epochs = {n: random_epochs(seed=i, epochs=5, keys=10, per_epoch=30, tasks=2) for i, n in enumerate(names)}
    for e in range(5):
        changes = {n: epochs[n][e] for n in names}
        m.epoch(*tasks(changes))
        for n in names:
            models[n].apply(changes[n])
        assert m.read("orders", ("id", "v", "n", "_source_table")) == merged_table(
            {n: models[n] for n in names if n.endswith(".orders")})
        assert m.read("shop_a.items", ("id", "v", "n")) == models[ITEMS.table].table()
    assert m.version("orders") == 5  # its creation, then one version per epoch for the three shards
    from flinkish_spark.mirror.compare import delta_reader

    compare = delta_reader(str(tmp_path / "lake" / "{schema}" / "{table}"), {"routes": json.dumps(RULES)})
    for n in names:  # what `flinkish mirror compare` sees of each table: a shard's rows of the merged target
        assert normalized(compare(n).select(["id", "v", "n"]).to_pylist()) == models[n].table()
    m.epochs -= 1
    m.epoch(*tasks({n: epochs[n][-1] for n in names}))  # a replay of the last epoch: nothing added
    assert m.version("orders") == 5
    # a reset checkpoint is recognised by the merged target too (a rule's target has no placeholder)
    import shutil

    shutil.rmtree(m.path("shop_a.items"))
    assert m.sink().last_committed_epoch() == 4
    assert m.read("orders", ("id", "v", "n", "_source_table")) == merged_table({n: models[n] for n in names[:3]})


@pytest.mark.parametrize("deletes", ["true", "soft"])
def test_a_truncate_resnapshot_or_added_column_of_one_shard_touches_only_its_rows_and_a_kill_commits_once(
        tmp_path: Path, monkeypatch, deletes: str) -> None:
    from flinkish_spark.connectors.delta import routed
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    a, b, c = SHARDS
    m = Shards(tmp_path, modes=parse_table_modes({"deletes": deletes}.get, "test"))
    s = StreamBuilder()
    for shard in SHARDS:
        s.snapshot(shard, [{"id": i, "v": f"{shard.table[5]}{i}", "n": i} for i in (1, 2, 3)])
    s.snapshot(ITEMS, [{"id": 1, "v": "i", "n": 1}])
    m.epoch(s.batch())

    def live(columns: tuple[str, ...] = ("_source_table", "id", "v")) -> list[tuple]:
        rows = m.read("orders", columns + (("_deleted",) if deletes == "soft" else ()))
        return sorted(tuple(r[k] for k in columns) for r in rows if not r.get("_deleted"))

    s.transaction((a, "t", None), (a, "c", {"id": 7, "v": "a7", "n": 7}), (b, "u", {"id": 1, "v": "b1'", "n": 1}))
    m.epoch(s.batch())
    assert live() == [("shop_a.orders", 7, "a7"), ("shop_b.orders", 1, "b1'"), ("shop_b.orders", 2, "b2"),
                      ("shop_b.orders", 3, "b3"), ("shop_c.orders", 1, "c1"), ("shop_c.orders", 2, "c2"),
                      ("shop_c.orders", 3, "c3")]
    if deletes == "soft":  # the truncated shard's rows are kept, marked
        assert sum(1 for r in m.read("orders", ("_source_table", "_deleted")) if r["_deleted"]) == 3

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
    assert m.version("orders") == 3 and m.read("shop_a.items", ("id", "v")) == [{"id": 1, "v": "i2"}]


def test_a_narrower_type_in_another_shard_fits_and_different_keys_or_modes_stop_naming_the_shards(tmp_path: Path) -> None:
    a, b = (table_schema(f"shop_{x}.orders", [("id", "bigint"), ("n", t)], ("id",)) for x, t in (("a", "bigint"), ("b", "int")))
    m = Shards(tmp_path)
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "n": 2**40}]).snapshot(b, [{"id": 1, "n": 5}])
    m.epoch(s.batch())
    s.transaction((b, "u", {"id": 1, "n": 6}))  # an announced int in shop_b while the target holds bigint: fits
    m.epoch(s.batch())
    assert m.read("orders", ("id", "n", "_source_table")) == normalized(
        [{"id": 1, "n": 2**40, "_source_table": "shop_a.orders"}, {"id": 1, "n": 6, "_source_table": "shop_b.orders"}])
    other = table_schema("shop_c.orders", [("k", "text"), ("n", "int")], ("k",))
    s.snapshot(other, [{"k": "x", "n": 1}]).snapshot(b, [{"id": 2, "n": 1}])
    with pytest.raises(SchemaChangeError, match=r"orders have different primary keys: shop_b.orders keyed by \(id\); "
                                                r"shop_c.orders keyed by \(k\)"):
        m.epoch(s.batch())
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    mixed = parse_table_modes({"tableModes": '[{"tables": "shop_b.*", "mode": "history"}]'}.get, "test")
    h = Shards(tmp_path / "h", modes=mixed)
    s.snapshot(a, [{"id": 1, "n": 1}]).snapshot(b, [{"id": 1, "n": 1}])
    with pytest.raises(ConfigError, match=r"merged into .*orders are shop_a.orders \(upsert\), shop_b.orders "
                                          r"\(history\): a merged Delta target takes one mode for all its shards"):
        h.epoch(s.batch())


def ts(seconds: int) -> dt.datetime:
    """A StreamBuilder change's commit time (its LSN in seconds since 1970)."""
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def history_case(m: Any, read: Callable[[], list[tuple]], version: Callable[[], int]) -> None:
    """History in a merged target: a truncate of one shard closes only its current versions, at the truncate's time
    (a version its key's later change replaces too); a re-snapshot's end of one shard closes only its keys it did not
    deliver (at the epoch's newest change), while the other shard's versions stay open; a replay adds nothing."""
    a, b = SHARDS[:2]
    s = StreamBuilder()
    for shard in (a, b):
        s.snapshot(shard, [{"id": i, "v": f"{shard.table[5]}{i}", "n": i} for i in (1, 2, 3)])
    m.epoch(s.batch())
    s.transaction((b, "u", {"id": 1, "v": "b1'", "n": 1}))
    b_updated = ts(s.lsn)
    s.transaction((a, "t", None))
    truncated = ts(s.lsn)
    s.transaction((a, "c", {"id": 2, "v": "a2'", "n": 2}), (b, "u", {"id": 2, "v": "b2'", "n": 2}))
    after = ts(s.lsn)
    m.epoch(s.batch())
    shop_a = [("shop_a.orders", 1, "a1", None, truncated, False), ("shop_a.orders", 2, "a2", None, truncated, False),
              ("shop_a.orders", 2, "a2'", after, None, True), ("shop_a.orders", 3, "a3", None, truncated, False)]
    b1 = ("shop_b.orders", 1, "b1", None, b_updated, False)
    first = shop_a + [b1, ("shop_b.orders", 1, "b1'", b_updated, None, True), ("shop_b.orders", 2, "b2", None, after, False),
                      ("shop_b.orders", 2, "b2'", after, None, True), ("shop_b.orders", 3, "b3", None, None, True)]
    assert read() == sorted(first, key=str)
    s.marker(b, "B").snapshot(b, [{"id": 1, "v": "b1'", "n": 1}, {"id": 2, "v": "r2", "n": 2}]).marker(b, "E")
    s.transaction((a, "c", {"id": 4, "v": "a4", "n": 4}))
    newest = ts(s.lsn)
    batch = s.batch()
    m.epoch(batch)
    expected = sorted(shop_a + [b1, ("shop_a.orders", 4, "a4", newest, None, True),
                                ("shop_b.orders", 1, "b1'", b_updated, None, True),  # delivered as it was
                                ("shop_b.orders", 2, "b2", None, after, False),
                                ("shop_b.orders", 2, "b2'", after, newest, False),  # changed: closed, r2 opens
                                ("shop_b.orders", 2, "r2", newest, None, True),
                                ("shop_b.orders", 3, "b3", None, newest, False)], key=str)  # not delivered
    assert read() == expected
    at = version()
    m.epochs -= 1
    m.epoch(batch)  # a replay of the epoch: nothing changes
    assert read() == expected and version() == at


def test_history_in_a_merged_target_closes_only_the_truncated_or_resnapshotted_shards_versions(tmp_path: Path) -> None:
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    m = Shards(tmp_path, modes=parse_table_modes({"mode": "history"}.get, "test"))
    history_case(m, lambda: history_rows(m.read("orders", HISTORY)), lambda: m.version("orders"))


HISTORY = ("_source_table", "id", "v", "_valid_from", "_valid_to", "_current")


def history_rows(rows: list[dict[str, Any]]) -> list[tuple]:
    return sorted((tuple(r[c] for c in HISTORY) for r in rows), key=str)


def test_keys_unique_across_shards_key_the_target_by_the_key_alone(tmp_path: Path) -> None:
    a, b = SHARDS[:2]
    m = Shards(tmp_path, keysUniqueAcrossShards="true")
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "v": "a1", "n": 1}]).snapshot(b, [{"id": 2, "v": "b2", "n": 2}])
    m.epoch(s.batch())
    s.transaction((b, "u", {"id": 1, "v": "b1", "n": 1}))  # id 1 moves to shop_b: one row, written by shop_b
    m.epoch(s.batch())
    assert m.read("orders", ("id", "v", "_source_table")) == [
        {"id": 1, "v": "b1", "_source_table": "shop_b.orders"}, {"id": 2, "v": "b2", "_source_table": "shop_b.orders"}]
    s.transaction((a, "t", None))  # shop_a holds no row any more: its truncate takes nothing
    m.epoch(s.batch())
    assert len(m.read("orders", ("id",))) == 2
