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

**Snapshot chunks and changes are read side by side** (:func:`follow`, shared with the
PostgreSQL target): a schema that only snapshot rows carry (``announced`` False) is the
catalog's when the chunk was read, which can be older *or newer* than the change stream's
position. Older: its narrower types are no change (the rows fit the wider column). Newer: a
chunk read after ``ALTER ... TYPE bigint`` widens -- or creates -- the target *ahead* of the
changes from before the ``ALTER``, which still announce the narrower type. The target
records such a column in its *ahead* map (column -> the type the changes announced last,
``None`` when they announced none yet: the column came with a snapshot); an announced type
between that one and the target's is no narrowing, and the entry goes once the changes
announce the target's type. A narrower type than what the changes announced before is a
narrowing, and refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, TypeVar

import pyarrow as pa

from flinkish_spark.errors import SchemaChangeError

T = TypeVar("T")
Step = Literal["same", "widen", "narrowed", "other"]


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


def narrowable(t: pa.DataType) -> bool:
    """Whether some narrower type widens to ``t`` (what an older change can announce for a column of type ``t``)."""
    return ((pa.types.is_signed_integer(t) and t.bit_width > 8) or (pa.types.is_floating(t) and t.bit_width > 16)
            or pa.types.is_decimal(t))


def follow(column: str, have: T, new: T, announced: bool, ahead: dict[str, T | None],
           widens: Callable[[T, T], bool], passing: bool = False) -> Step:
    """What the source's type ``new`` asks of the target's column of type ``have``: ``same`` (nothing),
    ``widen`` (the column becomes ``new``), ``narrowed`` / ``other`` (refused: a narrower type, another kind).

    ``announced``: whether a change carried ``new`` (False: snapshot rows only). ``ahead`` (updated in
    place): the columns a snapshot brought ahead of the change stream, each with the type the changes
    announced last (None: none yet). A column not in it has the type the changes announced last.
    ``passing``: ``new`` is an older schema of a change task, before its newest one: it only moves
    ``ahead`` (the task's newest type decides the column, as a restart after the user changed the
    target needs) -- always ``same``.
    """
    if passing:
        if have == new or widens(have, new):
            ahead.pop(column, None)
        elif widens(new, have) and column in ahead:
            before = ahead[column]
            if before is None or before == new or widens(before, new):
                ahead[column] = new
        return "same"
    if have == new:
        if announced:
            ahead.pop(column, None)  # the changes caught up
        return "same"
    if widens(have, new):
        if announced:
            ahead.pop(column, None)
        elif column not in ahead:
            ahead[column] = have  # what the changes announced: ``have``, the column followed them so far
        return "widen"
    if widens(new, have):
        if not announced:
            return "same"  # snapshot rows of an older schema: they fit
        if column in ahead:
            before = ahead[column]
            if before is None or before == new or widens(before, new):
                ahead[column] = new  # a change from before the ALTER the snapshot saw
                return "same"
        return "narrowed"
    return "other"


@dataclass(frozen=True)
class Evolution:
    """What the target gets before the epoch's rows: columns added (in order), types widened, and its
    ahead map afterwards (see :func:`follow`; kept by the target with its schema)."""

    added: tuple[pa.Field, ...] = ()
    widened: tuple[tuple[str, pa.DataType, pa.DataType], ...] = ()  # (column, from, to)
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))  # the target's schema afterwards
    ahead: tuple[tuple[str, pa.DataType | None], ...] = ()  # afterwards, sorted by column
    ahead_before: tuple[tuple[str, pa.DataType | None], ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.added or self.widened) or self.ahead != self.ahead_before


def evolve(table: str, target_name: str, target: pa.Schema, source: pa.Schema, fix: str,
           announced: bool = True, ahead: Mapping[str, pa.DataType | None] | None = None,
           passing: bool = False) -> Evolution:
    """The evolution of ``target`` (the current columns, with its ``ahead`` map) for the source's ``source`` columns.

    ``fix``: what the user can do about a type the target cannot follow (format-specific).
    ``announced`` False: ``source`` is the schema of snapshot rows; ``passing``: an older schema of a
    change task, which only moves the ahead map (see :func:`follow`).
    """
    added: list[pa.Field] = []
    widened: list[tuple[str, pa.DataType, pa.DataType]] = []
    before = dict(ahead or {})
    now = dict(before)
    fields = {f.name: f for f in target}
    for f in source:
        have = fields.get(f.name)
        if have is None and passing:
            continue  # the task's newest schema decides which columns the target gets
        if have is None:
            added.append(pa.field(f.name, f.type, nullable=True))
            if not announced and narrowable(f.type):
                now[f.name] = None  # came with a snapshot: no change announced it yet
            continue
        step = follow(f.name, have.type, f.type, announced, now, widens, passing)
        if step == "widen":
            widened.append((f.name, have.type, f.type))
        elif step != "same":
            raise SchemaChangeError(
                f"source table {table}: column {f.name!r} is now {f.type}, but its target {target_name} holds "
                f"{have.type}, which cannot be widened to it "
                f"({'a narrower type' if step == 'narrowed' else 'another kind of type'}). "
                f"Nothing of this epoch was written. {fix}"
            )
    new = {name: to for name, _, to in widened}
    schema = pa.schema([pa.field(f.name, new.get(f.name, f.type), nullable=True) for f in target] + added)
    return Evolution(tuple(added), tuple(widened), schema, tuple(sorted(now.items())), tuple(sorted(before.items())))


def check_key(table: str, target_name: str, target_key: tuple[str, ...] | None, source_key: tuple[str, ...],
              fix: str) -> None:
    """A changed primary key cannot be followed: the target's rows are keyed by the old one."""
    if target_key is not None and tuple(target_key) != tuple(source_key):
        raise SchemaChangeError(
            f"source table {table}: its primary key is now ({', '.join(source_key)}), but its target "
            f"{target_name} is keyed by ({', '.join(target_key)}). Nothing of this epoch was written. {fix}"
        )


def evolve_epoch(table: str, target_name: str, current: pa.Schema, target_key: tuple[str, ...] | None,
                 schemas: list[tuple[pa.Schema, tuple[str, ...], bool, bool]], fix: str, key_fix: str,
                 ahead: Mapping[str, pa.DataType | None] | None = None) -> Evolution:
    """The target's evolution for one epoch's source schemas of a table, oldest first
    (:meth:`~flinkish_spark.connectors.lakehouse.routing.TableEpoch.steps`): each as (its columns in the
    target format's types, its primary key, whether a change announced it, whether it is passing -- see
    :func:`evolve`). ``ahead``: the target's ahead map (:func:`read_ahead`). Raises
    :class:`SchemaChangeError` for the first change the target cannot follow."""
    start = tuple(sorted((ahead or {}).items()))
    result = Evolution(schema=current, ahead=start, ahead_before=start)
    for columns, key, announced, passing in schemas:
        if not passing:
            check_key(table, target_name, target_key, key, key_fix)
        step = evolve(table, target_name, result.schema, columns, fix, announced, dict(result.ahead), passing)
        result = Evolution(result.added + step.added, result.widened + step.widened, step.schema, step.ahead, start)
    return result


# -- the ahead map as a table property (Delta configuration, Iceberg properties) -------------------

_DECIMAL = re.compile(r"^decimal(128|256)\((\d+), (-?\d+)\)$")
_NAMED = {"int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "halffloat": pa.float16(),
          "float": pa.float32(), "double": pa.float64()}


def _arrow_type(text: str | None) -> pa.DataType | None:
    """An ahead type as :func:`ahead_property` wrote it; None for none (or one this version cannot read:
    then the announced type is not checked against it, the safe side -- its rows fit the column)."""
    if text is None:
        return None
    m = _DECIMAL.match(text)
    if m:
        return (pa.decimal128 if m.group(1) == "128" else pa.decimal256)(int(m.group(2)), int(m.group(3)))
    return _NAMED.get(text)


def ahead_property(evolution: Evolution) -> str | None:
    """The table property's value for the evolution's ahead map (None: no entry, remove the property)."""
    if not evolution.ahead:
        return None
    return json.dumps({c: None if t is None else str(t) for c, t in evolution.ahead}, sort_keys=True, separators=(",", ":"))


def read_ahead(value: str | None) -> dict[str, pa.DataType | None]:
    """The ahead map from the table property's value (:func:`ahead_property`)."""
    if not value:
        return {}
    return {c: _arrow_type(t) for c, t in json.loads(value).items()}
