"""A routed Iceberg target: one source table's table, created on first use and evolved by its schema rows.

* **Types** are compared as Iceberg holds them (:func:`iceberg_arrow`: a source ``smallint`` and
  ``int`` are both Iceberg ``int``; ``varchar(n)`` and ``text`` both ``string``), with the rules
  of :mod:`flinkish_spark.connectors.lakehouse.evolution` -- restricted to Iceberg's own
  promotions: ``int -> long``, ``float -> double``, a decimal's precision up at the same scale
  (:func:`follows`). Another widening (a decimal's scale up) is a :class:`SchemaChangeError`.
* **Field ids.** Readers resolve a Parquet column by its field id, so an executor writes each
  table's files with the ids the column will have when the epoch commits
  (:func:`write_schema`: the target's ids as the executor loads it, the ids the commit's schema
  update or creation assigns to new columns). The commit checks every file against the
  target's schema after its update (:func:`misfits`) and rewrites the rare file whose ids or
  types differ (the target changed between prepare and commit, or tasks saw different new
  columns): one file for one file, row positions kept.
* **Ahead of the changes**: a column a snapshot chunk widened (or brought) ahead of the change
  stream is listed in the table property ``flinkish.ahead-of-changes`` (JSON: column -> the type the
  changes announced last), set in the schema update's own metadata commit; see
  :mod:`~flinkish_spark.connectors.lakehouse.evolution`. Absent when no column is ahead.
* **Created** with the table properties ``flinkish.primary-key`` (the key the sink writes it
  by) and ``flinkish.source-table`` (the source table it mirrors: two tables routed to one
  target are refused), format version 2 and the merge mode's write properties.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from flinkish_spark.connectors.lakehouse.evolution import Evolution, ahead_property, widens
from flinkish_spark.connectors.iceberg.table import PARTITION_FIELD_ID_START
from flinkish_spark.errors import SchemaChangeError

KEY_PROPERTY = "flinkish.primary-key"
SOURCE_PROPERTY = "flinkish.source-table"
AHEAD_PROPERTY = "flinkish.ahead-of-changes"  # columns a snapshot widened ahead of the change stream


def iceberg_arrow(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Iceberg types read back (one Arrow type per Iceberg type, no field ids)."""
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids, schema_to_pyarrow

    return schema_to_pyarrow(_pyarrow_to_schema_without_ids(schema), include_field_ids=False)


def table_arrow(table_schema: Any) -> pa.Schema:
    """An Iceberg schema's columns as :func:`iceberg_arrow` types."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(table_schema, include_field_ids=False)


def follows(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether Iceberg can promote a column of ``old`` to ``new`` in place."""
    if pa.types.is_decimal(old) and pa.types.is_decimal(new) and old.scale != new.scale:
        return False
    return widens(old, new)


def check_promotions(table: str, target_name: str, evolution: Evolution) -> None:
    """The widenings of ``evolution`` that Iceberg cannot do in place (a decimal's scale up)."""
    for column, old, new in evolution.widened:
        if not follows(old, new):
            raise SchemaChangeError(
                f"source table {table}: column {column!r} is now {new}, but its target {target_name} holds {old}; "
                "Iceberg can raise a decimal's precision in place but not its scale. Nothing of this epoch was "
                "written. Rewrite the target with the column cast to the new type (e.g. create a new table with "
                "pyiceberg and copy the rows cast) and restart, or mirror the table to a new target with a new sink uid."
            )


def _iceberg_type(t: pa.DataType) -> Any:
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids

    return _pyarrow_to_schema_without_ids(pa.schema([pa.field("c", t)])).fields[0].field_type


def write_schema(table: Any | None, columns: pa.Schema) -> Any:
    """The Iceberg schema (with field ids) a task writes ``columns`` with into ``table`` (None: not created yet).

    A column the target has keeps its id and gets the wider of the two types (the commit widens
    the target to a wider source type; rows of a narrower one are cast up). A new column gets the
    id the commit's schema update assigns: the table's ``last-column-id`` + 1, ... in column order.
    """
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
    from pyiceberg.schema import Schema, assign_fresh_schema_ids
    from pyiceberg.types import NestedField

    if table is None:
        return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(columns))
    current = table.schema()
    have = {f.name: f for f in current.fields}
    have_arrow = table_arrow(current)
    counter = itertools.count(int(table.metadata.last_column_id) + 1)
    next_id: Callable[[], int] = lambda: next(counter)  # noqa: E731
    fields = []
    for f in iceberg_arrow(columns):
        old = have.get(f.name)
        if old is None:
            field_id = next_id()
            fresh: Any = assign_fresh_schema_ids(_iceberg_type(f.type), next_id)  # a type given a type
            fields.append(NestedField(field_id, f.name, fresh, required=False))
        elif have_arrow.field(f.name).type == f.type or follows(f.type, have_arrow.field(f.name).type):
            fields.append(NestedField(old.field_id, f.name, old.field_type, required=False))
        else:  # the source's type: wider (the commit widens the target) or refused there
            fields.append(NestedField(old.field_id, f.name, _iceberg_type(f.type), required=False))
    return Schema(*fields)


def misfits(files_schema: Any, target_schema: Any) -> bool:
    """Whether files written with ``files_schema`` disagree with the target's schema (ids or types)."""
    for f in files_schema.fields:
        try:
            have = target_schema.find_field(f.name)
        except ValueError:
            return True
        if have.field_id != f.field_id or have.field_type != f.field_type:
            return True
    return False


def fitted_schema(files_schema: Any, target_schema: Any) -> Any:
    """The target's fields for the columns of ``files_schema`` (what a misfit file is rewritten with)."""
    from pyiceberg.schema import Schema

    return Schema(*[target_schema.find_field(f.name) for f in files_schema.fields])


def read_file(io: Any, path: str) -> pa.Table:
    with io.fs.open(io.strip(path), "rb") as handle:
        return pq.read_table(handle)


def evolve_table(table: Any, evolution: Evolution) -> Any:
    """Add the evolution's columns (in order), widen its types and set its ahead map: one metadata commit;
    the table afterwards."""
    if not evolution.changes:
        return table
    with table.transaction() as tx:
        if evolution.added or evolution.widened:
            with tx.update_schema() as update:
                for f in evolution.added:
                    update.add_column(f.name, _iceberg_type(f.type))
                for column, _, new in evolution.widened:
                    update.update_column(column, field_type=_iceberg_type(new))
        ahead = ahead_property(evolution)
        if ahead:
            tx.set_properties({AHEAD_PROPERTY: ahead})
        elif AHEAD_PROPERTY in table.properties:
            tx.remove_properties(AHEAD_PROPERTY)
    return table


def identity_spec(schema: Any, partition_by: tuple[str, ...]) -> Any:
    """The identity partition spec of ``partition_by`` over ``schema`` (with field ids; none: unpartitioned)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    return PartitionSpec(*[PartitionField(schema.find_field(c).field_id, PARTITION_FIELD_ID_START + i,
                                          IdentityTransform(), c) for i, c in enumerate(partition_by)])


def partitioning(table: Any) -> tuple[str, ...]:
    """A table's partition columns as a rule names them (a transform other than identity as ``transform(column)``)."""
    schema = table.schema()
    return tuple(schema.find_column_name(f.source_id) if str(f.transform) == "identity"
                 else f"{f.transform}({schema.find_column_name(f.source_id)})" for f in table.spec().fields)
