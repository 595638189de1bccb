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
  column, both types and the fix.
* Snapshot chunks and changes are read side by side: the rule of
  :func:`~flinkish_spark.connectors.lakehouse.evolution.follow` (shared with the lakehouse targets)
  tells an older change from a narrowing. A column a snapshot widened or brought ahead of the
  changes carries the comment :data:`AHEAD` with the type the changes announced last (or
  :data:`AHEAD_NEW` when they announced none yet); it goes once the changes announce the
  column's type.

The table's mode (:class:`~flinkish_spark.connectors.lakehouse.table_modes.TableMode`) adds its columns when
the target is created (``_deleted``; ``_valid_from``, ``_valid_to``, ``_current`` -- a history target keyed by a
unique index on the key ``WHERE _current`` instead of a primary key); evolution keeps them, and an existing
target whose mode columns are another mode's is refused (:func:`check_shape`), as is a source column of such a
name.

Every statement runs in the epoch's commit transaction (PostgreSQL's DDL is transactional), so
a refused change leaves nothing of the epoch in any table, and an evolution is committed
exactly when the epoch's rows are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from flinkish_spark.connectors.lakehouse.changes import CURRENT, DELETED, VALID_FROM, VALID_TO
from flinkish_spark.connectors.lakehouse.evolution import check_key, follow
from flinkish_spark.connectors.lakehouse.routing import SchemaStep
from flinkish_spark.connectors.lakehouse.table_modes import UPSERT, TableMode
from flinkish_spark.connectors.postgres.connection import qualified, quote_ident
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.errors import SchemaChangeError, TargetSchemaError

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


def narrowable(t: str) -> bool:
    """Whether some narrower PostgreSQL type widens to ``t`` (what an older change can announce for it)."""
    if t.endswith("[]"):
        return narrowable(t[:-2])
    return (t in ("integer", "bigint", "double precision", "numeric", "character varying", "text")
            or bool(_NUMERIC.match(t)) or bool(_VARCHAR.match(t)))


#: The comment on a column a snapshot chunk widened ahead of the change stream (see :func:`evolve`).
AHEAD = "flinkish.postgres: widened by a snapshot ahead of the changes, from "
#: ... and on one a snapshot brought before any change announced it.
AHEAD_NEW = "flinkish.postgres: brought by a snapshot ahead of the changes"


@dataclass(frozen=True)
class TargetColumns:
    """A target table as the catalog describes it: columns (name -> ``format_type``), primary key, and
    the columns a snapshot brought ahead of the change stream (name -> the type the changes announced
    last, None: none yet; :func:`~flinkish_spark.connectors.lakehouse.evolution.follow`)."""

    columns: dict[str, str]
    key: tuple[str, ...] | None  # None: no primary key
    ahead: dict[str, str | None] = field(default_factory=dict)


def _ahead_of(comment: str | None) -> tuple[bool, str | None]:
    if comment == AHEAD_NEW:
        return True, None
    if comment and comment.startswith(AHEAD):
        return True, comment[len(AHEAD):]
    return False, None


def read_target(c: Any, schema: str, table: str) -> TargetColumns | None:
    """The target's columns and primary key, None when there is no such table (one query each)."""
    name = qualified(schema, table)
    if c.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None:
        return None
    described = c.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), col_description(a.attrelid, a.attnum) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (name,)).fetchall()
    columns = {r[0]: r[1] for r in described}
    ahead = {r[0]: _ahead_of(r[2])[1] for r in described if _ahead_of(r[2])[0]}
    # The key: the primary key; of a history target (no primary key), its unique index WHERE _current.
    row = c.execute(
        "SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum)) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND (i.indisprimary OR (i.indisunique AND i.indexprs IS NULL "
        "AND pg_get_expr(i.indpred, i.indrelid) = %s)) GROUP BY i.indexrelid, i.indisprimary "
        "ORDER BY i.indisprimary DESC LIMIT 1", (name, CURRENT)).fetchone()
    return TargetColumns(columns, tuple(row[0]) if row and row[0] else None, ahead)


#: The target columns each table mode adds (their PostgreSQL types, as ``format_type`` spells them).
EXTRA_TYPES = {DELETED: "boolean", VALID_FROM: "timestamp with time zone", VALID_TO: "timestamp with time zone",
               CURRENT: "boolean"}
_EXTRA_DDL = {DELETED: "boolean NOT NULL DEFAULT false", VALID_FROM: "timestamp with time zone",
              VALID_TO: "timestamp with time zone", CURRENT: "boolean NOT NULL DEFAULT true"}


def check_shape(current: TargetColumns, source_columns: set[str] | None, mode: TableMode, source_table: str, shown: str,
                key: tuple[str, ...] = ()) -> None:
    """Refuse an existing target whose mode columns (``_deleted``; ``_valid_from``, ``_valid_to``, ``_current``)
    are not those of its table's mode -- created under another mode, or changed by hand -- and a history target
    without its unique index on the key ``WHERE _current``: one error naming the table and the fix, raised in the
    epoch's transaction before any of its rows is written."""
    want = set(mode.extra_columns)
    # a target column of another mode's name may be the source's own (None: the source's columns are not known,
    # an epoch of markers only -- then only a missing column of the mode is refused)
    have = {n for n in EXTRA_TYPES if n in current.columns
            and (n in want or (source_columns is not None and n not in source_columns))}
    wrong = sorted(n for n in have & want if current.columns[n] != EXTRA_TYPES[n])
    if have != want or wrong:
        shape = lambda names: ", ".join(sorted(names)) or "none of them"  # noqa: E731
        raise TargetSchemaError(
            f"source table {source_table} is mirrored as {mode.describe()}, whose target holds the columns "
            f"{shape(want)} besides the source's; its target {shown} has {shape(have)}"
            + (f" ({', '.join(f'{n} is {current.columns[n]}, not {EXTRA_TYPES[n]}' for n in wrong)})" if wrong else "")
            + f". Nothing of this epoch was written. Mirror it in the mode its target was written in (a tableModes "
            f"rule for {source_table}), or mirror it anew: drop {shown} and restart with a new sink uid (a new "
            "snapshot creates it in its mode).")
    if mode.mode == "history" and current.key is None:
        raise TargetSchemaError(
            f"source table {source_table} is mirrored as history; its target {shown} has no unique index on the key "
            f"WHERE {CURRENT}, which finds each key's current version. Nothing of this epoch was written. Add it: "
            f"CREATE UNIQUE INDEX ON {shown} ({', '.join(map(_plain, key)) or '<the key columns>'}) WHERE {CURRENT}, "
            "and restart.")


def evolve(c: Any, schema: str, table: str, source_table: str, steps: list[SchemaStep], create: bool,
           mode: TableMode = UPSERT) -> TargetColumns:
    """Bring the target to the epoch's source schemas (:meth:`TableEpoch.steps
    <flinkish_spark.connectors.lakehouse.routing.TableEpoch.steps>`): create it or alter it, in the caller's
    transaction. Returns its columns afterwards (the mode's columns among them). Raises SchemaChangeError (a change
    it cannot follow) or TargetSchemaError (missing and ``create`` false; not the shape of ``mode``:
    :func:`check_shape`).

    ``mode``'s columns come last when it is created (:data:`EXTRA_TYPES`); a history target has no primary key --
    a key has many versions, and two of one source transaction (or two snapshot rows) share their ``_valid_from``
    -- but a unique index on the key ``WHERE _current``: at most one current version per key, and what closing
    it and filling unchanged values from it find by key."""
    name = qualified(schema, table)
    shown = f"{_plain(schema)}.{_plain(table)}"  # in messages: as the user types it
    current = read_target(c, schema, table)
    newest = [s.schema for s in steps if not s.passing][-1]
    extra = mode.extra_columns
    clash = sorted({col.name for s in steps for col in s.schema.columns} & set(extra))
    if clash:
        raise SchemaChangeError(
            f"source table {source_table} has the column(s) {', '.join(clash)}, which its mode ({mode.describe()}) "
            f"writes itself. Nothing of this epoch was written. Mirror it with mode upsert, deletes true (a tableModes "
            f"rule for {source_table}), or rename the column in the source.")
    if current is None and not create:
        shape = (f", {', '.join(f'{n} {_EXTRA_DDL[n]}' for n in extra)}" if extra else "")
        raise TargetSchemaError(
            f"flinkish.postgres routing: there is no table {shown} for source table {source_table} and "
            f"createTable is false; create it (with the source's columns{shape} and "
            + (f"a unique index on the key WHERE {CURRENT}" if mode.mode == "history" else "primary key")
            + "), or set createTable to true")
    if current is not None:
        check_shape(current, {col.name for s in steps for col in s.schema.columns}, mode, source_table, shown,
                    tuple(newest.key))
    if current is not None and current.key is None:
        raise SchemaChangeError(
            f"source table {source_table}: its target {shown} has no primary key, and a mirror writes it keyed by "
            f"({', '.join(newest.key)}). Nothing of this epoch was written. Add it: ALTER TABLE {shown} ADD PRIMARY KEY "
            f"({', '.join(map(_plain, newest.key))}) and restart.")
    key_fix = (f"Mirror the table to a new target with a new sink uid; or, if its rows are unique by the new key, change "
               f"the target's primary key (ALTER TABLE {shown} DROP CONSTRAINT <its primary key>, ADD PRIMARY KEY (...)) and restart.")
    # A target to create is evolved from no columns, as the lakehouse targets are: the same rule decides
    # its types and the columns it starts ahead of the changes with; then one CREATE TABLE.
    columns: dict[str, str] = {} if current is None else dict(current.columns)
    ahead: dict[str, str | None] = {} if current is None else dict(current.ahead)
    alter = (lambda sql: None) if current is None else c.execute
    for step in steps:
        if current is not None and not step.passing:
            check_key(source_table, shown, current.key, step.schema.key, key_fix)
        for col in step.schema.columns:
            have = columns.get(col.name)
            column = quote_ident(col.name)
            if have is None:
                if step.passing:
                    continue  # the task's newest schema decides which columns the target gets
                alter(f"ALTER TABLE {name} ADD COLUMN {column} {col.type}")
                columns[col.name] = col.type
                if not step.announced and narrowable(col.type):
                    ahead[col.name] = None  # came with a snapshot: no change announced it yet
                continue
            done = follow(col.name, have, col.type, step.announced, ahead, widens, step.passing)
            if done == "widen":
                alter(f"ALTER TABLE {name} ALTER COLUMN {column} TYPE {col.type}")
                columns[col.name] = col.type
            elif done != "same":
                kind = "a narrower type" if done == "narrowed" else "another kind of type"
                raise SchemaChangeError(
                    f"source table {source_table}: column {col.name!r} is now {col.type}, but its target {shown} holds "
                    f"{have}, which cannot be widened to it ({kind}). Nothing of this epoch was written. Change the "
                    f"target column yourself if its rows fit (ALTER TABLE {shown} ALTER COLUMN {_plain(col.name)} "
                    f"TYPE {col.type}) and restart; or mirror the table to a new target (exclude it here, mirror it "
                    "with a new sink uid).")
    key = current.key if current is not None else (tuple(newest.key) or None)
    if current is None:
        cols = ", ".join([f"{quote_ident(n)} {t}" for n, t in columns.items()]
                         + [f"{quote_ident(n)} {_EXTRA_DDL[n]}" for n in extra])
        history = mode.mode == "history"
        pk = f", PRIMARY KEY ({', '.join(map(quote_ident, newest.key))})" if newest.key and not history else ""
        c.execute(f"CREATE TABLE {name} ({cols}{pk})")
        if history and newest.key:
            c.execute(f"CREATE UNIQUE INDEX ON {name} ({', '.join(map(quote_ident, newest.key))}) "
                      f"WHERE {quote_ident(CURRENT)}")
        columns.update({n: EXTRA_TYPES[n] for n in extra})
        what = f" ({mode.describe()})" if mode.shape != UPSERT.shape else ""
        c.execute(f"COMMENT ON TABLE {name} IS 'flinkish.postgres mirror of {_literal_safe(source_table)}{what}'")
    before = {} if current is None else current.ahead
    for col_name in sorted(set(before) | set(ahead)):
        if col_name in ahead and (col_name not in before or before[col_name] != ahead[col_name]):
            text = AHEAD_NEW if ahead[col_name] is None else AHEAD + str(ahead[col_name])
            c.execute(f"COMMENT ON COLUMN {name}.{quote_ident(col_name)} IS '{_literal_safe(text)}'")
        elif col_name not in ahead:
            c.execute(f"COMMENT ON COLUMN {name}.{quote_ident(col_name)} IS NULL")  # the changes caught up
    return TargetColumns(columns, key, ahead)


def _plain(name: str) -> str:
    """``name`` as SQL: bare when it needs no quotes."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else quote_ident(name)


def _literal_safe(text: str) -> str:
    return text.replace("'", "''")
