"""Schema evolution of a routed target: what a source table's new schema asks of the target's columns.

Format-independent, on Arrow types (each format maps its own). The rule compares the
source's columns with the target's *current* columns -- never with an older source schema --
so a restart after the user changed the target continues:

* a source column the target lacks is **added** (nullable);
* a target column the source no longer has is **kept** (null in rows written from now on);
* a column of the same type is fine; a type the target's column can be **widened** to in
  place (:func:`widens`: a wider integer, float -> double, a decimal with more integer and
  fraction digits) is widened;
* anything else -- a narrower type, a type of another kind -- and a changed primary key
  raise :class:`~flinkish_spark.errors.SchemaChangeError` naming the table, the column and what
  to do. It is raised before anything of the epoch is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from flinkish_spark.errors import SchemaChangeError


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of ``old`` is a value of ``new`` and ``new`` is another type a column can become in place."""
    if old == new:
        return False
    if pa.types.is_signed_integer(old) and pa.types.is_signed_integer(new):
        return new.bit_width > old.bit_width
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return new.bit_width > old.bit_width
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False


@dataclass(frozen=True)
class Evolution:
    """What the target gets before the epoch's rows: columns added (in order) and types widened."""

    added: tuple[pa.Field, ...] = ()
    widened: tuple[tuple[str, pa.DataType, pa.DataType], ...] = ()  # (column, from, to)
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))  # the target's schema afterwards

    @property
    def changes(self) -> bool:
        return bool(self.added or self.widened)


def evolve(table: str, target_name: str, target: pa.Schema, source: pa.Schema, fix: str,
           announced: bool = True) -> Evolution:
    """The evolution of ``target`` (the current columns) for the source's ``source`` columns.

    ``fix``: what the user can do about a type the target cannot follow (format-specific).
    ``announced`` False: ``source`` is the schema of snapshot rows, which a table's chunks carry
    from when it joined -- possibly older than a change the target already followed. Its
    narrower types are no change (the rows fit the wider column); only a type of another kind
    is refused.
    """
    added: list[pa.Field] = []
    widened: list[tuple[str, pa.DataType, pa.DataType]] = []
    fields = {f.name: f for f in target}
    for f in source:
        have = fields.get(f.name)
        if have is None:
            added.append(pa.field(f.name, f.type, nullable=True))
        elif have.type == f.type:
            continue
        elif widens(have.type, f.type):
            widened.append((f.name, have.type, f.type))
        elif not announced and widens(f.type, have.type):
            continue
        else:
            raise SchemaChangeError(
                f"source table {table}: column {f.name!r} is now {f.type}, but its target {target_name} holds "
                f"{have.type}, which cannot be widened to it ({'a narrower type' if widens(f.type, have.type) else 'another kind of type'}). "
                f"Nothing of this epoch was written. {fix}"
            )
    new = {name: to for name, _, to in widened}
    schema = pa.schema([pa.field(f.name, new.get(f.name, f.type), nullable=True) for f in target] + added)
    return Evolution(tuple(added), tuple(widened), schema)


def check_key(table: str, target_name: str, target_key: tuple[str, ...] | None, source_key: tuple[str, ...],
              fix: str) -> None:
    """A changed primary key cannot be followed: the target's rows are keyed by the old one."""
    if target_key is not None and tuple(target_key) != tuple(source_key):
        raise SchemaChangeError(
            f"source table {table}: its primary key is now ({', '.join(source_key)}), but its target "
            f"{target_name} is keyed by ({', '.join(target_key)}). Nothing of this epoch was written. {fix}"
        )


def evolve_epoch(table: str, target_name: str, current: pa.Schema, target_key: tuple[str, ...] | None,
                 schemas: list[tuple[pa.Schema, tuple[str, ...], bool]], fix: str, key_fix: str) -> Evolution:
    """The target's evolution for one epoch's source schemas of a table, oldest first: each as (its
    columns in the target format's types, its primary key, whether a change announced it -- see
    :func:`evolve`). Raises :class:`SchemaChangeError` for the first change the target cannot follow."""
    result = Evolution(schema=current)
    for columns, key, announced in schemas:
        check_key(table, target_name, target_key, key, key_fix)
        step = evolve(table, target_name, result.schema, columns, fix, announced)
        result = Evolution(result.added + step.added, result.widened + step.widened, step.schema)
    return result
