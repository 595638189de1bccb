"""Columns and rows chosen, computed columns (the routing sinks' ``transforms``), in process (no Spark), on Delta,
Iceberg and PostgreSQL targets: every epoch each target equals the reference model with the transform
(``testing/changes.py``, the filter and computed columns written in Python) -- rows entering and leaving the filter
as their values change, an excluded column in no target (also after the source adds it), computed columns holding
their values, a kill between two tables' commits and the restart's commit leaving each row once."""

from __future__ import annotations

import collections
import json
from datetime import timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.transform.rules import parse_transforms
from flinkish_spark.errors import ConfigError
from flinkish_spark.testing.changes import Change, Model, normalized, ordered, random_epochs
from flinkish_spark.testing.kills import Killed
from flinkish_spark.testing.stream_rows import ARROW, table_schema

T = table_schema("public.t", [("id", "bigint"), ("v", "text"), ("n", "int")], ("id",))
U = table_schema("public.u", [("id", "bigint"), ("v", "text"), ("n", "int")], ("id",))
RULES = [{"tables": "public.t", "columns.exclude": ["n", "secret"], "filter": "v LIKE '%5%' OR v IN ('s1', 's2', 's3')",
          "computed": {"big": "upper(v) || '#' || _op", "at": "_commit_ts", "src": "__table_name__"}}]


def transforms(rules: list[dict[str, Any]] | None = None) -> Any:
    return parse_transforms({"transforms": json.dumps(RULES if rules is None else rules)}.get, "test")


def model() -> Model:
    return Model("upsert", "true", keep=lambda r: "5" in r["v"] or r["v"] in ("s1", "s2", "s3"), exclude=("n",),
                 computed={"big": lambda c: f"{(c.value or '').upper()}#{c.op}", "at": lambda c: c.ts, "src": lambda c: "t"})


def tasks(changes: list[Change], schemas: tuple[Any, ...] = (T, U)) -> list[pa.Table]:
    """The model's changes of one epoch for every table of ``schemas``, one task per partition, (``_lsn``, ``_seq``)
    in the model's order."""
    seq: dict[int, int] = {}
    count: collections.Counter[int] = collections.Counter()
    for c in ordered(changes):
        if c.lsn is not None:
            seq[id(c)], count[c.lsn] = count[c.lsn], count[c.lsn] + 1
    by_part: dict[int, list[Change]] = collections.defaultdict(list)
    for c in changes:
        by_part[c.part].append(c)
    out = []
    for part in sorted(by_part):
        rows: list[dict[str, Any]] = []
        for s in schemas:
            rows += [{"_table": s.table, "_op": "s", "_schema_id": s.schema_id, "row": s.to_json()}]
            rows += [{"_table": s.table, "_op": c.op, "_lsn": c.lsn, "_seq": seq.get(id(c)), "_commit_ts": c.ts,
                      "_schema_id": s.schema_id, "row": json.dumps({"id": c.key} if c.op == "d" else row(c, s))}
                     for c in sorted(by_part[part], key=lambda c: c.row)]
        out.append(pa.Table.from_pylist(rows, schema=ARROW))
    return out


def row(c: Change, schema: Any) -> dict[str, Any]:
    return {**c.row_dict(), **({"secret": f"pw{c.key}"} if "secret" in schema.names else {})}


class Target:
    """One format's routed sink with the transforms, in process; ``rows(table)``: what a reader of it sees."""

    def __init__(self, fmt: str, tmp_path: Path, request: pytest.FixtureRequest, modes: Any = None,
                 rules: list[dict[str, Any]] | None = None) -> None:
        self.fmt = fmt
        if fmt == "delta":
            from tests.connectors.delta.test_routed import Mirror as DeltaMirror

            self.m: Any = DeltaMirror(tmp_path, modes=modes)
        elif fmt == "iceberg":
            from tests.connectors.iceberg.test_routed import Mirror as IcebergMirror

            self.m = IcebergMirror(tmp_path, modes=modes)
        else:
            from flinkish_spark.connectors.lakehouse.table_modes import TableModes
            from tests.connectors.postgres.test_routed import Mirror as PostgresMirror

            self.url = request.getfixturevalue("pg_url")
            self.m = PostgresMirror(tmp_path, self.url, modes=modes or TableModes())
        make = self.m.sink

        def sink() -> Any:
            s = make()
            s.transforms = transforms(rules)
            return s
        self.m.sink = sink

    def epoch(self, batches: list[pa.Table]) -> None:
        self.m.epoch(*batches)

    def routed_module(self) -> Any:
        import importlib

        return importlib.import_module(f"flinkish_spark.connectors.{self.fmt}.routed")

    def rows(self, table: str) -> list[dict[str, Any]]:
        if self.fmt == "delta":
            import deltalake

            got = pa.table(deltalake.DeltaTable(self.m.path(table)).scan())
        elif self.fmt == "iceberg":
            got = self.m.table(table).scan().to_arrow()
        else:
            import psycopg

            with psycopg.connect(self.url) as c:
                cur = c.execute(f"SELECT * FROM mirror.{table.replace('.', '_')}")
                names = [d.name for d in cur.description or ()]
                got = pa.Table.from_pylist([dict(zip(names, r)) for r in cur.fetchall()])
        out = []
        for r in got.to_pylist():
            if r.get("at") is not None:
                r["at"] = r["at"].astimezone(timezone.utc)
            out.append(r)
        return normalized(out)


@pytest.mark.parametrize("fmt, mode, deletes", [("delta", "upsert", "true"), ("iceberg", "upsert", "true"),
                                                ("postgres", "upsert", "true"), ("delta", "upsert", "soft"),
                                                ("delta", "history", "true")])
def test_rows_enter_and_leave_the_filter_columns_are_chosen_and_computed_as_the_reference_model(
        fmt: str, mode: str, deletes: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """In every shape: leaving the filter is a delete there (removed, soft-deleted, its version closed). (A
    PostgreSQL history target with a filter: the test of keys never in the target below; transforms are applied in
    the sink task before any mode, so computed and excluded columns are the upsert case's.)"""
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    target = Target(fmt, tmp_path, request, parse_table_modes({"mode": mode, "deletes": deletes}.get, "test"))
    expected, control = model(), Model(mode, deletes)
    expected.mode, expected.deletes = mode, deletes
    entered = left = 0
    extra = ["_valid_from", "_valid_to", "_current"] if mode == "history" else ["_deleted"] if deletes == "soft" else []
    for i, changes in enumerate(random_epochs(seed=11, epochs=7, keys=14, per_epoch=30, tasks=2)):
        batches = tasks(changes, (T, U) if i < 4 else (table_schema(T.table, [*[(c, "bigint" if c == "id" else "text"
                        if c == "v" else "int") for c in T.names], ("secret", "text")], ("id",)), U))
        if i == 3:  # kill -9 between the two tables' commits; the restart commits the decided epoch once
            module = target.routed_module()
            real = module.crash_point

            def crash(name: str) -> None:
                if name == "sink.between_tables":
                    raise Killed
                real(name)
            module.crash_point = crash
            try:
                with pytest.raises(Killed):
                    target.epoch(batches)
            finally:
                module.crash_point = real
        target.epoch(batches)
        before = {r["id"] for r in expected.table() if not r.get("_deleted") and r.get("_current", True)}
        expected.apply(changes)
        control.apply(changes)
        after = {r["id"] for r in expected.table() if not r.get("_deleted") and r.get("_current", True)}
        entered, left = entered + len(after - before), left + len(before - after)
        got = target.rows("public.t")
        assert [sorted(r) for r in got[:1]] in ([], [sorted(["at", "big", "id", "src", "v", *extra])]), (i, got[:1])
        assert got == normalized(expected.table()), i  # no n, no secret
        assert target.rows("public.u") == normalized(control.table()), i  # no rule: as it is
    assert entered > 5 and left > 5  # the filter was crossed both ways


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "postgres"])
def test_a_delete_of_a_key_never_in_the_target_adds_no_soft_deleted_row_and_no_closed_version(
        fmt: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Issue 30: an update of a row that never matched the filter is a delete of a key the target never held, as is
    a delete of a key never seen: a soft-delete target (public.t) gets no row for it -- no ``_deleted`` row of null
    values --, a history target (public.u) no closed version. A key inserted and deleted in one epoch (two tasks), a
    live key deleted, a row leaving the filter, a soft-deleted key deleted again: their last values, as before."""
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes

    modes = parse_table_modes({"tableModes": json.dumps([{"tables": "public.t", "deletes": "soft"},
                                                         {"tables": "public.u", "mode": "history"}])}.get, "test")
    keep = "v LIKE '%5%' OR v IN ('s1', 's2', 's3')"
    target = Target(fmt, tmp_path, request, modes, rules=[{"tables": "public.*", "filter": keep}])
    soft = Model("upsert", "soft", keep=lambda r: "5" in r["v"] or r["v"] in ("s1", "s2", "s3"))
    history = Model("history", "true", keep=soft.keep)
    epochs = [
        [Change(1, "r", "s1", None), Change(2, "r", "x2", None), Change(3, "r", "s3", None)],  # 2 never matches
        [Change(2, "u", "y2", 10), Change(9, "d", None, 11, part=1),  # never live: nothing
         Change(4, "c", "5a", 12), Change(4, "d", None, 13, part=1),  # inserted and deleted in the epoch
         Change(1, "d", None, 14), Change(3, "u", "x3", 15, part=1)],  # live: deleted, leaves the filter
        [Change(1, "d", None, 20), Change(2, "u", "y5", 21), Change(9, "d", None, 22, part=1)],  # 2 enters
    ]
    for i, changes in enumerate(epochs):
        target.epoch(tasks(changes))
        soft.apply(changes)
        history.apply(changes)
        got_soft, got_history = target.rows("public.t"), target.rows("public.u")
        assert [r for r in got_soft if r["v"] is None] == [], i  # no tombstone of a key never live
        assert [r for r in got_history if r["v"] is None] == [], i
        assert got_soft == normalized(soft.table()), i
        assert got_history == normalized(history.table()), i
    assert [(r["id"], r["v"], r["_deleted"]) for r in sorted(got_soft, key=lambda r: r["id"])] == [
        (1, "s1", True), (2, "y5", False), (3, "s3", True), (4, "5a", True)]
    assert sorted((r["id"], r["v"], r["_current"]) for r in got_history) == [
        (1, "s1", False), (2, "y5", True), (3, "s3", False), (4, "5a", False)]


def test_a_key_column_cannot_be_excluded_and_a_missing_column_stops_naming_the_table(tmp_path: Path,
                                                                                  request: pytest.FixtureRequest) -> None:
    global RULES
    saved = RULES
    try:
        RULES = [{"tables": "public.*", "columns.exclude": "id"}]
        with pytest.raises(ConfigError, match="source table public.t: .*leaves out its key column"):
            Target("delta", tmp_path, request).epoch(tasks([Change(1, "r", "s1", None)], (T,)))
        RULES = [{"tables": "public.*", "filter": "missing > 0"}]
        with pytest.raises(ConfigError, match="source table public.t: .*names column.*missing"):
            Target("delta", tmp_path / "2", request).epoch(tasks([Change(1, "r", "s1", None)], (T,)))
    finally:
        RULES = saved


def _markers(op: str) -> pa.Table:
    return pa.Table.from_pylist([{"_table": T.table, "_op": "s", "_schema_id": T.schema_id, "row": T.to_json()},
                                 {"_table": T.table, "_op": op, "_schema_id": T.schema_id}], schema=ARROW)


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "postgres"])
def test_a_resnapshot_removes_the_rows_that_stopped_matching(fmt: str, tmp_path: Path,
                                                             request: pytest.FixtureRequest) -> None:
    """Rows changed while no slot kept the WAL: the re-snapshot delivers only the matching ones, its end removes the
    others -- also a row that stopped matching (s2 -> x2) and one deleted."""
    target = Target(fmt, tmp_path, request)
    target.epoch(tasks([Change(k, "r", f"s{k}", None) for k in (1, 2, 3)], (T,)))
    assert [r["v"] for r in target.rows("public.t")] == ["s1", "s2", "s3"]
    resnapshot = tasks([Change(1, "r", "s1", None), Change(2, "r", "x2", None), Change(4, "r", "5x", None)], (T,))
    target.epoch([pa.concat_tables([_markers("B"), *resnapshot, _markers("E")])])
    assert [(r["id"], r["v"], r["big"]) for r in target.rows("public.t")] == [(1, "s1", "S1#r"), (4, "5x", "5X#r")]


def test_the_option_on_each_routing_sink_and_its_refusals(tmp_path: Path) -> None:
    """Compiled at start (a bad rule: the sink does not start), refused on a sink of one target; the mirror's
    --sink-option and pipeline file go through the same check."""
    from flinkish_spark.connectors.delta.sink import DeltaSinkDataSource
    from flinkish_spark.connectors.iceberg.sink import IcebergSinkDataSource
    from flinkish_spark.connectors.postgres.sink import PostgresSinkDataSource
    from flinkish_spark.mirror.shapes import check_modes

    option = json.dumps(RULES)
    base = {"uid": "m", "checkpoint": str(tmp_path / "meta")}
    delta = DeltaSinkDataSource({**base, "path": str(tmp_path / "lake" / "{schema}" / "{table}"), "transforms": option})
    iceberg = IcebergSinkDataSource({**base, "table": "mirror.{schema}_{table}", "transforms": option})
    pg = PostgresSinkDataSource({**base, "url": "postgresql://u@localhost/db", "table": "m.{schema}_{table}",
                                 "transforms": option})
    for ds in (delta, iceberg, pg):
        assert ds.transforms.of("public.t") is not None and ds.transforms.of("public.u") is None
    with pytest.raises(ConfigError, match=r"option 'transforms' transforms the tables of a routing sink"):
        DeltaSinkDataSource({**base, "path": str(tmp_path / "one"), "transforms": option})
    with pytest.raises(ConfigError, match=r"transforms rule 1 \('public.t'\): filter: 'v LIKE' is not a Spark SQL "
                                          "expression"):
        PostgresSinkDataSource({**base, "url": "postgresql://u@localhost/db", "table": "m.{schema}_{table}",
                                "transforms": json.dumps([{"tables": "public.t", "filter": "v LIKE"}])})
    with pytest.raises(ConfigError, match=r"--sink-option: transforms rule 1 .*is not deterministic"):
        check_modes({"transforms": json.dumps([{"tables": "public.t", "computed": {"at": "now()"}}])}, "--sink-option")
