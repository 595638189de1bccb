"""A routed PostgreSQL target's columns: created with the source's own types, evolved by ``ALTER TABLE``.

The source's schema rows carry each column's PostgreSQL type as ``format_type`` spells it
(``numeric(12,2)``, ``character varying(20)``, ``timestamp with time zone``, ``text[]``), so
a PostgreSQL target gets exactly the source's types, and the rules of
:mod:`flinkish_spark.connectors.lakehouse.evolution` apply to those spellings:

* a source column the target lacks: ``ADD COLUMN`` (nullable);
* a target column the source no longer has: kept (null in every row written from then on);
* a type the target's column can be widened to in place (:func:`widens`: a wider integer,
  ``real -> double precision``, a ``numeric`` with more integer and fraction digits or without
  a limit, ``varchar(n) -> varchar(m > n)`` / ``varchar`` / ``text``; arrays element-wise):
  ``ALTER COLUMN ... TYPE``;
* anything else -- a narrower type announced by a change, a type of another kind, a changed
  primary key -- raises :class:`~flinkish_spark.errors.SchemaChangeError` naming the table, the
  column, both types and the fix. Snapshot rows' schema (``announced`` False) may be older
  than a change the target followed: a narrower type there is no change.
* Snapshot chunks and changes are read side by side, so a chunk read after a widening ``ALTER``
  can widen the target *ahead* of changes from before the ``ALTER``, which still announce the
  older type. Such a column carries the comment :data:`AHEAD` with the type it had; an announced
  type between that one and the target's is no narrowing, and the comment goes once the changes
  announce the target's type. Only a type narrower than what the changes announced before is one.

Every statement runs in the epoch's commit transaction (PostgreSQL's DDL is transactional), so
a refused change leaves nothing of the epoch in any table, and an evolution is committed
exactly when the epoch's rows are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from flinkish_spark.connectors.lakehouse.evolution import check_key
from flinkish_spark.connectors.postgres.connection import qualified, quote_ident
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.errors import SchemaChangeError

_INTS = {"smallint": 1, "integer": 2, "bigint": 3}
_FLOATS = {"real": 1, "double precision": 2}
_NUMERIC = re.compile(r"^numeric\((\d+),(-?\d+)\)$")
_VARCHAR = re.compile(r"^character varying\((\d+)\)$")


def widens(old: str, new: str) -> bool:
    """Whether every value of PostgreSQL type ``old`` is one of ``new``, another type a column can become in place."""
    if old == new:
        return False
    if old.endswith("[]") and new.endswith("[]"):
        return widens(old[:-2], new[:-2])
    if old in _INTS:
        return (new in _INTS and _INTS[new] > _INTS[old]) or new == "numeric"
    if old in _FLOATS:
        return new in _FLOATS and _FLOATS[new] > _FLOATS[old]
    numeric = _NUMERIC.match(old)
    if numeric:
        if new == "numeric":
            return True
        to = _NUMERIC.match(new)
        p, s = int(numeric.group(1)), int(numeric.group(2))
        return to is not None and int(to.group(2)) >= s and int(to.group(1)) - int(to.group(2)) >= p - s
    varchar = _VARCHAR.match(old)
    if varchar:
        to = _VARCHAR.match(new)
        return new in ("character varying", "text") or (to is not None and int(to.group(1)) > int(varchar.group(1)))
    return old == "character varying" and new == "text"


#: The comment on a column a snapshot chunk widened ahead of the change stream (see :func:`evolve`).
AHEAD = "flinkish.postgres: widened by a snapshot ahead of the changes, from "


@dataclass(frozen=True)
class TargetColumns:
    """A target table as the catalog describes it: columns (name -> ``format_type``), primary key, and
    the columns a snapshot widened ahead of the change stream (name -> the type before)."""

    columns: dict[str, str]
    key: tuple[str, ...] | None  # None: no primary key
    ahead: dict[str, str] = field(default_factory=dict)


def read_target(c: Any, schema: str, table: str) -> TargetColumns | None:
    """The target's columns and primary key, None when there is no such table (one query each)."""
    name = qualified(schema, table)
    if c.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None:
        return None
    described = c.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), col_description(a.attrelid, a.attnum) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (name,)).fetchall()
    columns = {r[0]: r[1] for r in described}
    ahead = {r[0]: r[2][len(AHEAD):] for r in described if r[2] and r[2].startswith(AHEAD)}
    row = c.execute(
        "SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum)) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary", (name,)).fetchone()
    return TargetColumns(columns, tuple(row[0]) if row and row[0] else None, ahead)


def evolve(c: Any, schema: str, table: str, source_table: str, schemas: list[tuple[TableSchema, bool]],
           create: bool) -> TargetColumns:
    """Bring the target to the epoch's source schemas (oldest first, each with whether a change announced it):
    create it or alter it, in the caller's transaction. Returns its columns afterwards. Raises
    SchemaChangeError (a change it cannot follow) or TargetSchemaError (missing and ``create`` false)."""
    from flinkish_spark.errors import TargetSchemaError

    name = qualified(schema, table)
    shown = f"{_plain(schema)}.{_plain(table)}"  # in messages: as the user types it
    current = read_target(c, schema, table)
    newest = schemas[-1][0]
    if current is None:
        if not create:
            raise TargetSchemaError(
                f"flinkish.postgres routing: there is no table {shown} for source table {source_table} and "
                "createTable is false; create it (with the source's columns and primary key), or set createTable to true")
        cols = ", ".join(f"{quote_ident(col.name)} {col.type}" for col in newest.columns)
        pk = f", PRIMARY KEY ({', '.join(map(quote_ident, newest.key))})" if newest.key else ""
        c.execute(f"CREATE TABLE {name} ({cols}{pk})")
        c.execute(f"COMMENT ON TABLE {name} IS 'flinkish.postgres mirror of {_literal_safe(source_table)}'")
        current = TargetColumns({col.name: col.type for col in newest.columns}, tuple(newest.key) or None)
        created = True
    else:
        created = False
    key_fix = (f"Mirror the table to a new target with a new sink uid; or, if its rows are unique by the new key, change "
               f"the target's primary key (ALTER TABLE {shown} DROP CONSTRAINT <its primary key>, ADD PRIMARY KEY (...)) and restart.")
    if current.key is None:
        raise SchemaChangeError(
            f"source table {source_table}: its target {shown} has no primary key, and a mirror writes it keyed by "
            f"({', '.join(newest.key)}). Nothing of this epoch was written. Add it: ALTER TABLE {shown} ADD PRIMARY KEY "
            f"({', '.join(map(_plain, newest.key))}) and restart.")
    columns, ahead = dict(current.columns), dict(current.ahead)
    for source, announced in schemas:
        check_key(source_table, shown, current.key, source.key, key_fix)
        for col in source.columns:
            have = columns.get(col.name)
            column = quote_ident(col.name)
            if have is None:
                c.execute(f"ALTER TABLE {name} ADD COLUMN {column} {col.type}")
                columns[col.name] = col.type
            elif created or (not announced and widens(col.type, have)):
                continue  # rows of an older schema than the target's: they fit
            elif have == col.type or (announced and col.name in ahead and widens(col.type, have) and (
                    col.type == ahead[col.name] or widens(ahead[col.name], col.type))):
                # The same type -- or, for a column a snapshot widened ahead of the change stream, a
                # change from before that widening (its type between the one the target had and its own).
                if announced and col.name in ahead:
                    if have == col.type:
                        c.execute(f"COMMENT ON COLUMN {name}.{column} IS NULL")  # the changes caught up
                        del ahead[col.name]
                    elif col.type != ahead[col.name]:
                        c.execute(f"COMMENT ON COLUMN {name}.{column} IS '{_literal_safe(AHEAD + col.type)}'")
                        ahead[col.name] = col.type
            elif widens(have, col.type):
                c.execute(f"ALTER TABLE {name} ALTER COLUMN {column} TYPE {col.type}")
                columns[col.name] = col.type
                if not announced and col.name not in ahead:
                    # Snapshot chunks and changes are read side by side: a chunk read after a widening
                    # ALTER comes ahead of the changes from before it, whose older type is no narrowing.
                    c.execute(f"COMMENT ON COLUMN {name}.{column} IS '{_literal_safe(AHEAD + have)}'")
                    ahead[col.name] = have
                elif announced and col.name in ahead:
                    c.execute(f"COMMENT ON COLUMN {name}.{column} IS NULL")
                    del ahead[col.name]
            else:
                kind = "a narrower type" if widens(col.type, have) else "another kind of type"
                raise SchemaChangeError(
                    f"source table {source_table}: column {col.name!r} is now {col.type}, but its target {shown} holds "
                    f"{have}, which cannot be widened to it ({kind}). Nothing of this epoch was written. Change the "
                    f"target column yourself if its rows fit (ALTER TABLE {shown} ALTER COLUMN {_plain(col.name)} "
                    f"TYPE {col.type}) and restart; or mirror the table to a new target (exclude it here, mirror it "
                    "with a new sink uid).")
    return TargetColumns(columns, current.key, ahead)


def _plain(name: str) -> str:
    """``name`` as SQL: bare when it needs no quotes."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else quote_ident(name)


def _literal_safe(text: str) -> str:
    return text.replace("'", "''")
