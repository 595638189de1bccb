"""The format-independent core of the keyed modes: options, the plan, row checks, resolution by key."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.lakehouse.changes import (
    KEYED_SINK_OPTIONS, check_rows, parse_keyed_options, plan_changes,
)
from flinkish_spark.connectors.lakehouse.resolve import Matches, resolve_epoch
from flinkish_spark.connectors.lakehouse.resolve_task import E_POS, resolve_task, taken
from flinkish_spark.connectors.primary_key import PRIMARY_KEY_METADATA, carried_key, with_primary_key
from flinkish_spark.errors import ChangeDataError, ConfigError
from flinkish_spark.options import Options
from flinkish_spark.testing.changes import SCHEMA, Change, batch


def plan(**options: str):
    from pyspark.sql.pandas.types import to_arrow_schema

    opts = parse_keyed_options(Options({"mode": "upsert", **options}, "t", KEYED_SINK_OPTIONS))
    return plan_changes(opts, SCHEMA if "schema" not in options else options["schema"], to_arrow_schema(SCHEMA, timezone="UTC"), "t")


def test_the_primary_key_travels_in_column_metadata() -> None:
    schema = with_primary_key([{"name": "b", "type": "long", "nullable": True}, {"name": "a", "type": "string", "nullable": True},
                               {"name": "v", "type": "string", "nullable": True}], ["a", "b"])
    assert schema["a"].metadata == {PRIMARY_KEY_METADATA: 1} and schema["b"].metadata == {PRIMARY_KEY_METADATA: 2}
    assert carried_key(schema) == ("a", "b")
    assert carried_key(StructType([StructField("x", LongType())])) == ()
    # a carried key is the default; the option wins over it
    from pyspark.sql.pandas.types import to_arrow_schema

    marked = StructType([StructField("id", LongType(), True, {PRIMARY_KEY_METADATA: 1}), StructField("v", StringType())])
    opts = parse_keyed_options(Options({"mode": "upsert"}, "t", KEYED_SINK_OPTIONS))
    assert plan_changes(opts, marked, to_arrow_schema(marked), "t").key == ("id",)
    opts = parse_keyed_options(Options({"mode": "upsert", "key": "v"}, "t", KEYED_SINK_OPTIONS))
    assert plan_changes(opts, marked, to_arrow_schema(marked), "t").key == ("v",)


def test_a_query_that_keeps_only_part_of_the_carried_key_gets_one_clear_error() -> None:
    """Primary key (tenant, id); the query selected id but dropped tenant: id alone is not the key --
    rows of different tenants would replace each other. The sink must not guess."""
    from pyspark.sql.pandas.types import to_arrow_schema

    partial = StructType([StructField("id", LongType(), True, {PRIMARY_KEY_METADATA: 2}), StructField("v", StringType())])
    opts = parse_keyed_options(Options({"mode": "upsert"}, "t", KEYED_SINK_OPTIONS))
    with pytest.raises(ConfigError, match=r"carry only part of a primary key.*'id' is column 2 of it.*option\('key'"):
        plan_changes(opts, partial, to_arrow_schema(partial), "t")
    # naming the key explicitly is the way out
    opts = parse_keyed_options(Options({"mode": "upsert", "key": "id"}, "t", KEYED_SINK_OPTIONS))
    assert plan_changes(opts, partial, to_arrow_schema(partial), "t").key == ("id",)


def test_table_columns_per_mode() -> None:
    assert plan(key="id").table_schema.names == ["id", "v", "n"]
    assert plan(key="id", deletes="soft").table_schema.names == ["id", "v", "n", "_deleted"]
    assert plan(key="id", mode="history").table_schema.names == ["id", "v", "n", "_valid_from", "_valid_to", "_current"]
    assert plan(key="id", mode="history").live_column == "_current"
    with pytest.raises(ConfigError, match="must be one of true, soft, false"):
        plan(key="id", deletes="maybe")


def test_rows_that_cannot_be_applied_by_key() -> None:
    p = plan(key="id", deletes="true")
    good = pa.Table.from_batches([batch([Change(1, "c", "a", 1), Change(2, "r", "b", None)])])
    check_rows(p, good, "t")
    nulls = pa.Table.from_batches([batch([Change(1, "c", "a", 1)])]).set_column(0, "id", pa.array([None], pa.int64()))
    with pytest.raises(ChangeDataError, match="null in the key column 'id'"):
        check_rows(p, nulls, "t")
    null_op = pa.Table.from_batches([batch([Change(1, "c", "a", 1)])]).set_column(3, "_op", pa.array([None], pa.string()))
    with pytest.raises(ChangeDataError, match="the column '_op' holds None"):
        check_rows(p, null_op, "t")


def test_within_a_task_the_last_change_in_lsn_then_input_order_wins() -> None:
    p = plan(key="id", deletes="true")
    changes = [Change(1, "u", "late", 9, row=0), Change(1, "u", "early", 3, row=1), Change(2, "r", "snap", None, row=2),
               Change(2, "u", "after", 1, row=3), Change(3, "u", "x", 5, row=4), Change(3, "d", None, 5, row=5),
               Change(4, "d", None, 5, row=6), Change(4, "c", "back", 5, row=7)]
    resolved = resolve_task(p, pa.Table.from_batches([batch(changes)]))
    assert resolved.rows.to_pylist() == [{"id": 1, "v": "late", "n": 4}, {"id": 2, "v": "after", "n": 5},
                                         {"id": 4, "v": "back", "n": 4}]
    entries = resolved.entries.to_pylist()
    assert [(e["id"], e["_e_kind"], e[E_POS]) for e in entries] == [(1, 0, 0), (2, 0, 1), (3, 1, -1), (4, 0, 2)]


def test_across_tasks_the_later_change_wins_and_the_losers_rows_are_dropped() -> None:
    p = plan(key="id", deletes="true")
    t0 = resolve_task(p, pa.Table.from_batches([batch([Change(1, "u", "a", 5), Change(2, "u", "b", 7)])]))
    t1 = resolve_task(p, pa.Table.from_batches([batch([Change(1, "u", "c", 5), Change(2, "d", None, 6)])]))
    epoch = resolve_epoch(p, [(0, t0.entries), (1, t1.entries)])
    assert epoch.keys().column("id").to_pylist() == [1, 2]
    # key 1: same LSN, partition 1 after partition 0 -> task 1's row; key 2: task 0's row (LSN 7 > 6)
    apply = epoch.apply(Matches({"f": (np.array([4, 8]), np.array([0, 1]))}))
    assert {t: p.tolist() for t, p in apply.new_deletes.items()} == {0: [0]}
    assert {f: p.tolist() for f, p in apply.table_deletes.items()} == {"f": [4, 8]}
    assert apply.copies == []


def test_taken_copies_only_when_the_rows_move() -> None:
    # An epoch of appended rows in key order (one change per key) is already what resolve_task writes: no copy.
    t = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    assert taken(t, np.arange(3)) is t
    assert taken(t, np.arange(0)).num_rows == 0
    assert taken(t, np.array([0, 2])).column("k").to_pylist() == [1, 3]
    assert taken(t, np.array([1, 2, 0])).column("v").to_pylist() == ["b", "c", "a"]
    assert taken(t.column("v"), np.array([2, 1, 0])).to_pylist() == ["c", "b", "a"]
