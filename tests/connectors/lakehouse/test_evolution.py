"""Schema evolution of routed targets (connectors/lakehouse/evolution.py): added, kept, widened, refused."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.evolution import check_key, evolve, widens
from flinkish_spark.errors import SchemaChangeError


def test_widening_is_within_one_kind_and_never_loses_values() -> None:
    assert widens(pa.int32(), pa.int64()) and widens(pa.int16(), pa.int32())
    assert widens(pa.float32(), pa.float64())
    assert widens(pa.decimal128(12, 2), pa.decimal128(14, 2)) and widens(pa.decimal128(12, 2), pa.decimal128(14, 4))
    assert not widens(pa.int64(), pa.int32()) and not widens(pa.int32(), pa.int32())
    assert not widens(pa.decimal128(12, 2), pa.decimal128(12, 4))  # fewer integer digits
    assert not widens(pa.int32(), pa.float64()) and not widens(pa.int32(), pa.string())


def test_added_columns_come_at_the_end_dropped_ones_stay_and_widened_ones_change_type() -> None:
    target = pa.schema([("id", pa.int32()), ("v", pa.string()), ("n", pa.int16())])
    source = pa.schema([("id", pa.int32()), ("n", pa.int64()), ("extra", pa.bool_())])
    e = evolve("public.a", "T", target, source, "fix")
    assert e.changes
    assert [f.name for f in e.added] == ["extra"] and e.widened == (("n", pa.int16(), pa.int64()),)
    assert e.schema == pa.schema([("id", pa.int32()), ("v", pa.string()), ("n", pa.int64()), ("extra", pa.bool_())])
    assert not evolve("public.a", "T", e.schema, source, "fix").changes


def test_a_narrowed_or_other_type_is_refused_naming_table_column_types_and_fix() -> None:
    target = pa.schema([("id", pa.int64())])
    with pytest.raises(SchemaChangeError, match=r"public\.a: column 'id' is now int32.*T holds int64.*a narrower type.*DO THIS"):
        evolve("public.a", "T", target, pa.schema([("id", pa.int32())]), "DO THIS")
    with pytest.raises(SchemaChangeError, match="another kind of type"):
        evolve("public.a", "T", target, pa.schema([("id", pa.string())]), "DO THIS")


def test_a_changed_key_is_refused_and_an_unknown_one_is_accepted() -> None:
    check_key("public.a", "T", None, ("id",), "fix")
    check_key("public.a", "T", ("id",), ("id",), "fix")
    with pytest.raises(SchemaChangeError, match=r"primary key is now \(id, v\).*keyed by \(id\).*FIX"):
        check_key("public.a", "T", ("id",), ("id", "v"), "FIX")


def test_a_snapshot_schema_narrower_than_the_target_is_no_change_but_another_kind_still_is() -> None:
    target = pa.schema([("id", pa.int64()), ("n", pa.decimal128(14, 2))])
    stale = pa.schema([("id", pa.int32()), ("n", pa.decimal128(12, 2)), ("new", pa.string())])
    e = evolve("public.a", "T", target, stale, "fix", announced=False)
    assert e.widened == () and [f.name for f in e.added] == ["new"]
    assert e.schema.field("id").type == pa.int64() and e.schema.field("n").type == pa.decimal128(14, 2)
    with pytest.raises(SchemaChangeError, match="another kind of type"):
        evolve("public.a", "T", target, pa.schema([("id", pa.string())]), "fix", announced=False)


def test_a_column_a_chunk_widened_ahead_of_the_changes_accepts_their_older_type_until_they_catch_up() -> None:
    from flinkish_spark.connectors.lakehouse.evolution import ahead_property, read_ahead

    narrow = pa.schema([("id", pa.int32()), ("f", pa.float32()), ("n", pa.decimal128(12, 2))])
    wide = pa.schema([("id", pa.int64()), ("f", pa.float64()), ("n", pa.decimal128(14, 2))])
    chunk = evolve("public.a", "T", narrow, wide, "fix", announced=False)  # read after the ALTER
    assert [c for c, _, _ in chunk.widened] == ["id", "f", "n"]
    stored = read_ahead(ahead_property(chunk))  # what the target keeps with its schema
    assert stored == {"id": pa.int32(), "f": pa.float32(), "n": pa.decimal128(12, 2)} == dict(chunk.ahead)
    older = evolve("public.a", "T", chunk.schema, narrow, "fix", ahead=stored)  # a change from before the ALTER
    assert not older.changes and older.schema == chunk.schema
    caught_up = evolve("public.a", "T", chunk.schema, wide, "fix", ahead=stored)
    assert caught_up.changes and not caught_up.widened and ahead_property(caught_up) is None
    with pytest.raises(SchemaChangeError, match=r"'id' is now int32.*holds int64.*a narrower type"):
        evolve("public.a", "T", caught_up.schema, narrow, "fix", ahead=read_ahead(ahead_property(caught_up)))
