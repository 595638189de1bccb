"""Merged shards into one routed flinkish.postgres target, in process (no Spark): several source tables routed by one
merging rule (flinkish_spark.connectors.lakehouse.routes), each target read back with psycopg and compared with the
reference model of each shard (flinkish_spark/testing/changes.py, merged_table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routes import parse_routes
from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import SchemaChangeError
from flinkish_spark.testing.changes import Change, Model, merged_table, normalized, ordered, random_epochs
from flinkish_spark.testing.kills import Killed, kill_at
from flinkish_spark.testing.stream_rows import ARROW, StreamBuilder, table_schema
from tests.connectors.postgres.test_routed import Mirror

psycopg = pytest.importorskip("psycopg")

COLUMNS = [("id", "bigint"), ("v", "text"), ("n", "int")]
SHARDS = [table_schema(f"shop_{s}.orders", COLUMNS, ("id",)) for s in ("a", "b", "c")]
ITEMS = table_schema("shop_a.items", COLUMNS, ("id",))
RULES = [{"source-table": "shop_*.orders", "sink-table": "mirror.orders"}]


class Shards(Mirror):
    """:class:`Mirror` with route rules over its template ``mirror.{schema}_{table}``."""

    def __init__(self, tmp_path: Path, url: str, rules: list[dict[str, Any]] = RULES, modes: Any = None,
                 **options: str) -> None:
        super().__init__(tmp_path, url, **({"modes": modes} if modes is not None else {}))
        self.route = parse_routes(Route("mirror.{schema}_{table}", "postgres"),
                                  {"routes": json.dumps(rules), **options}.get, "test")

    def sink(self) -> Any:
        from flinkish_spark.connectors.postgres.connection import parse_url
        from flinkish_spark.connectors.postgres.routed import RoutedPostgresSink, resolve_routed_plan

        plan = resolve_routed_plan(parse_url(self.url), self.route, self.uid, True, "test", self.modes)
        return RoutedPostgresSink(plan, self.uid, 60)

    def read(self, table: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
        with psycopg.connect(self.url) as c:
            rows = c.execute(f"SELECT {', '.join(columns)} FROM mirror.{table}").fetchall()
        return normalized([dict(zip(columns, r)) for r in rows])


def tasks(by_shard: dict[str, list[Change]]) -> list[pa.Table]:
    """The shards' changes of one epoch as the multi-table stream, one task per partition, all shards in each;
    shard i's LSNs are the model's * 4 + i (each change its own transaction position)."""
    parts: dict[int, list[dict[str, Any]]] = {}
    for i, (name, changes) in enumerate(sorted(by_shard.items())):
        schema = next(s for s in SHARDS + [ITEMS] if s.table == name)
        for seq, c in enumerate(ordered(changes)):
            lsn = None if c.lsn is None else c.lsn * 4 + i
            rows = parts.setdefault(c.part, [])
            if not any(r["_op"] == "s" and r["_table"] == name for r in rows):
                rows.append({"_table": name, "_op": "s", "_schema_id": schema.schema_id, "row": schema.to_json()})
            rows.append({"_table": name, "_op": c.op, "_lsn": lsn, "_seq": seq, "_commit_ts": c.ts,
                         "_schema_id": schema.schema_id, "row": json.dumps({"id": c.key} if c.op == "d" else c.row_dict())})
    return [pa.Table.from_pylist(parts[p], schema=ARROW) for p in sorted(parts)]


def test_three_shards_merge_into_one_target_keyed_with_their_name_and_a_replay_adds_nothing(pg_url, tmp_path: Path) -> None:
    m = Shards(tmp_path, pg_url)
    names = [s.table for s in SHARDS] + [ITEMS.table]
    models = {n: Model("upsert", "true") for n in names}
    epochs = {n: random_epochs(seed=i, epochs=5, keys=10, per_epoch=30, tasks=2) for i, n in enumerate(names)}
    for e in range(5):
        changes = {n: epochs[n][e] for n in names}
        m.epoch(*tasks(changes))
        for n in names:
            models[n].apply(changes[n])
        # the same ids in every shard: each shard's rows kept apart by _source_table
        assert m.read("orders", ("id", "v", "n", "_source_table")) == merged_table(
            {n: models[n] for n in names if n.endswith(".orders")})
        assert m.read("shop_a_items", ("id", "v", "n")) == models[ITEMS.table].table()  # no rule: its own target
    m.epoch(*tasks({n: epochs[n][-1] for n in names}), epoch=m.epochs - 1)  # a replay of the last epoch: nothing added
    assert m.read("orders", ("id", "v", "n", "_source_table")) == merged_table({n: models[n] for n in names[:3]})
    # one commit row per target and epoch, whatever the number of its shards
    assert m.commits()[-2:] == [(4, "mirror.orders"), (4, "mirror.shop_a_items")]
    with psycopg.connect(pg_url) as c:
        key = c.execute("SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i JOIN pg_attribute a ON "
                        "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'mirror.orders'::regclass "
                        "AND i.indisprimary").fetchone()[0]
    assert key == ["_source_table", "id"]


def test_a_truncate_resnapshot_or_added_column_of_one_shard_touches_only_its_rows_and_a_kill_leaves_nothing(
        pg_url, tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.postgres import routed

    a, b, c = SHARDS
    m = Shards(tmp_path, pg_url)
    s = StreamBuilder()
    for shard in SHARDS:
        s.snapshot(shard, [{"id": i, "v": f"{shard.table[5]}{i}", "n": i} for i in (1, 2, 3)])
    m.epoch(s.batch())

    def rows() -> list[tuple]:
        with psycopg.connect(pg_url) as conn:
            return conn.execute("SELECT _source_table, id, v FROM mirror.orders ORDER BY 1, 2").fetchall()

    s.transaction((a, "t", None), (a, "c", {"id": 7, "v": "a7", "n": 7}), (b, "u", {"id": 1, "v": "b1'", "n": 1}))
    m.epoch(s.batch())
    assert rows() == [("shop_a.orders", 7, "a7"), ("shop_b.orders", 1, "b1'"), ("shop_b.orders", 2, "b2"),
                      ("shop_b.orders", 3, "b3"), ("shop_c.orders", 1, "c1"), ("shop_c.orders", 2, "c2"),
                      ("shop_c.orders", 3, "c3")]

    # a re-snapshot of shop_b that no longer holds id 3: only shop_b's id 3 goes; a column added in shop_c only
    wider = table_schema("shop_c.orders", COLUMNS + [("extra", "text")], ("id",))
    s.marker(b, "B").snapshot(b, [{"id": 1, "v": "b1'", "n": 1}, {"id": 2, "v": "b2", "n": 2}]).marker(b, "E")
    s.transaction((wider, "u", {"id": 2, "v": "c2", "n": 2, "extra": "x"}), (a, "c", {"id": 3, "v": "a3", "n": 3}))
    batch = s.batch()
    kill_at(monkeypatch, routed, "sink.between_tables")  # after the first shard, in the epoch's open transaction
    with pytest.raises(Killed):
        m.epoch(batch)
    monkeypatch.undo()
    assert len(rows()) == 7 and "extra" not in m.types("orders")  # nothing of the epoch, not its ALTER TABLE
    m.epoch(batch, epoch=2)  # the restart commits the recorded decision, once
    m.epoch(batch, epoch=2)
    with psycopg.connect(pg_url) as conn:
        got = conn.execute("SELECT _source_table, id, v, extra FROM mirror.orders ORDER BY 1, 2").fetchall()
    assert got == [("shop_a.orders", 3, "a3", None), ("shop_a.orders", 7, "a7", None), ("shop_b.orders", 1, "b1'", None),
                   ("shop_b.orders", 2, "b2", None), ("shop_c.orders", 1, "c1", None), ("shop_c.orders", 2, "c2", "x"),
                   ("shop_c.orders", 3, "c3", None)]
    assert m.commits()[-1:] == [(2, "mirror.orders")]


def test_a_narrower_type_in_another_shard_fits_another_kind_stops_and_different_keys_stop_naming_the_shards(
        pg_url, tmp_path: Path) -> None:
    a, b = (table_schema(f"shop_{x}.orders", [("id", "bigint"), ("n", t)], ("id",)) for x, t in (("a", "bigint"), ("b", "int")))
    m = Shards(tmp_path, pg_url)
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "n": 2**40}]).snapshot(b, [{"id": 1, "n": 5}])
    m.epoch(s.batch())
    s.transaction((b, "u", {"id": 1, "n": 6}))  # an announced int in shop_b while the target holds bigint: fits
    m.epoch(s.batch())
    assert m.rows("orders", "_source_table") == [(1, 2**40, "shop_a.orders"), (1, 6, "shop_b.orders")]
    assert m.types("orders")["n"] == "bigint"
    texted = table_schema("shop_b.orders", [("id", "bigint"), ("n", "text")], ("id",))
    s.transaction((texted, "u", {"id": 1, "n": "six"}))
    with pytest.raises(SchemaChangeError, match=r"shop_b.orders: column 'n' is now text.*mirror.orders holds bigint"):
        m.epoch(s.batch())
    m = Shards(tmp_path / "other", pg_url)
    m.uid = "other"  # another mirror (the refused epoch stays decided in the first one's log)
    other = table_schema("shop_c.orders", [("k", "text"), ("n", "int")], ("k",))
    s.snapshot(other, [{"k": "x", "n": 1}])
    with pytest.raises(SchemaChangeError, match=r"mirror.orders have different primary keys: the target mirror.orders "
                                                r"keyed by \(id\); shop_c.orders keyed by \(k\)"):
        m.epoch(s.batch())


def test_keys_unique_across_shards_key_the_target_by_the_key_alone(pg_url, tmp_path: Path) -> None:
    a, b = SHARDS[:2]
    m = Shards(tmp_path, pg_url, keysUniqueAcrossShards="true")
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "v": "a1", "n": 1}]).snapshot(b, [{"id": 2, "v": "b2", "n": 2}])
    m.epoch(s.batch())
    s.transaction((a, "t", None))  # a truncate of shop_a takes the rows shop_a wrote last
    m.epoch(s.batch())
    assert m.rows("orders", "id") == [(2, "b2", 2, "shop_b.orders")]


def test_history_in_a_merged_target_keeps_each_shards_versions_and_a_truncate_closes_only_its_own(pg_url, tmp_path: Path) -> None:
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    a, b = SHARDS[:2]
    m = Shards(tmp_path, pg_url, modes=parse_table_modes({"mode": "history"}.get, "test"))
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "v": "a1", "n": 1}]).snapshot(b, [{"id": 1, "v": "b1", "n": 1}])
    m.epoch(s.batch())
    s.transaction((a, "u", {"id": 1, "v": "a1'", "n": 1}), (b, "t", None))
    m.epoch(s.batch())
    with psycopg.connect(pg_url) as c:
        rows = c.execute("SELECT _source_table, v, _current FROM mirror.orders ORDER BY 1, 2").fetchall()
    assert rows == [("shop_a.orders", "a1", False), ("shop_a.orders", "a1'", True), ("shop_b.orders", "b1", False)]

