"""A table's :class:`~flinkish_spark.connectors.postgres.rows.TableSchema` from the catalog (snapshot chunks)
and from a pgoutput Relation message (changes) -- the same schema, and so the same schema id, for the same columns.

Both paths resolve a column's type the same way (:func:`resolve_types`: the display name
``format_type`` prints, the base type after domains, an array's element type), and take the
key from the same place: the primary key. pgoutput's Relation message flags the replica
identity's columns, which are the primary key under the default identity (``d``); for any
other identity (FULL) the key is the one recorded when the table was planned (the registry
of the epoch: :func:`..registry.planned_keys`), so that a range gives the same schema whenever
it is read -- also after the table was dropped; the catalog only for a table planned by an
older version.

Generated columns are never part of a schema: pgoutput sends no value for them (before
PostgreSQL 18 never; on 18 only stored ones, and only with ``publish_generated_columns = stored``;
virtual ones never), so a change could only write null where the snapshot read a value. A target
computes them itself if it wants them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from flinkish_spark.connectors.postgres.pgoutput import Relation
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema, make_column
from flinkish_spark.errors import PostgresSourceError


#: Runs one SQL statement (no parameters; the only values inlined are integers) and returns its rows:
#: the same catalog reads work over psycopg and over the ADBC connection of a snapshot chunk.
Query = Callable[[str], list[Any]]


def psycopg_query(conn: Any) -> Query:
    return lambda sql: conn.execute(sql).fetchall()


def _int_array(values: Iterable[int]) -> str:
    return "'{" + ",".join(str(int(v)) for v in values) + "}'"


@dataclass(frozen=True)
class TypeInfo:
    display: str  # format_type(oid, typmod): 'numeric(12,2)', 'integer[]', 'my_domain'
    base: str  # typname of the base type (after domains)
    typmod: int  # the effective typmod (a domain's own when the column has none)
    element: str | None  # an array's element base typname


# Domains are resolved to their base types (recursively); an array's element type too.
_TYPES_SQL = """
WITH RECURSIVE input(oid, typmod) AS (SELECT * FROM unnest({oids}::oid[], {mods}::int[])),
base(orig, origmod, oid, mod, depth) AS (
    SELECT oid, typmod, oid, typmod, 0 FROM input
    UNION ALL
    SELECT b.orig, b.origmod, t.typbasetype, CASE WHEN b.mod = -1 THEN t.typtypmod ELSE b.mod END, b.depth + 1
    FROM base b JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd'
)
SELECT DISTINCT ON (b.orig, b.origmod) b.orig::int8, b.origmod, format_type(b.orig, b.origmod), t.typname::text, b.mod,
       CASE WHEN t.typelem <> 0 AND t.typlen = -1 AND t.typname NOT IN ('int2vector', 'oidvector')
            THEN (SELECT CASE WHEN e.typtype = 'd' THEN (SELECT typname::text FROM pg_type WHERE oid = e.typbasetype)
                              ELSE e.typname::text END FROM pg_type e WHERE e.oid = t.typelem) END
FROM base b JOIN pg_type t ON t.oid = b.oid
ORDER BY b.orig, b.origmod, b.depth DESC
"""


def resolve_types(query: Query, pairs: Iterable[tuple[int, int]]) -> dict[tuple[int, int], TypeInfo]:
    """(type oid, typmod) -> :class:`TypeInfo`, in one query. A type the catalog no longer has is text."""
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    rows = query(_TYPES_SQL.format(oids=_int_array(p[0] for p in wanted), mods=_int_array(p[1] for p in wanted)))
    out = {(int(o), int(m)): TypeInfo(str(d), str(b), int(bm), None if e is None else str(e)) for o, m, d, b, bm, e in rows}
    for pair in wanted:
        out.setdefault(pair, TypeInfo(f"oid {pair[0]}", "unknown", -1, None))
    return out


def _column(name: str, info: TypeInfo) -> Column:
    return make_column(name, info.display, info.base, info.typmod, info.element)


def primary_keys(query: Query, relids: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """The key columns of each relation, in column order (as pgoutput flags them): its primary key, or under
    ``REPLICA IDENTITY USING INDEX`` that index's columns (what its updates and deletes carry); relations
    without one are absent."""
    ids = sorted(set(relids))
    if not ids:
        return {}
    rows = query(
        "SELECT i.indrelid, array_agg(a.attname::text ORDER BY a.attnum) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        f"WHERE i.indrelid = ANY({_int_array(ids)}::oid[]) "
        "AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END GROUP BY i.indrelid"
    )
    return {int(r[0]): tuple(str(c) for c in r[1]) for r in rows}


def table_columns(conn: Any, oids: Iterable[int]) -> dict[int, list[str]]:
    """Each table's column names in order (generated ones left out: see the module docstring), over psycopg, in one
    query -- also the column list of the publication."""
    out: dict[int, list[str]] = {int(o): [] for o in oids}
    if out:
        rows = conn.execute(
            "SELECT attrelid::int8, attname::text FROM pg_attribute WHERE attnum > 0 AND NOT attisdropped "
            f"AND attgenerated = '' AND attrelid = ANY({_int_array(out)}::oid[]) ORDER BY attrelid, attnum").fetchall()
        for oid, name in rows:
            out[int(oid)].append(str(name))
    return out


def table_oid(conn: Any, table: str, what: str) -> int:
    """The oid of ``table`` (resolved like ``to_regclass``, with the search path) over psycopg."""
    row = conn.execute("SELECT to_regclass(%s)::oid", (table,)).fetchone()
    if row is None or row[0] is None:
        raise PostgresSourceError(f"{what}: table {table!r} does not exist (or is not visible to this role)")
    return int(row[0])


def load_table_schema(query: Query, oid: int) -> TableSchema | None:
    """The schema of the table with ``oid`` as the query's snapshot sees it; None when there is no such table."""
    rows = query("SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                 f"WHERE c.oid = {int(oid)}")
    if not rows:
        return None
    schema_name, rel_name = str(rows[0][0]), str(rows[0][1])
    cols = query(f"SELECT attname::text, atttypid::int8, atttypmod FROM pg_attribute WHERE attrelid = {int(oid)} "
                 "AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum")
    types = resolve_types(query, [(int(t), int(m)) for _, t, m in cols])
    columns = tuple(_column(str(n), types[(int(t), int(m))]) for n, t, m in cols)
    return TableSchema(f"{schema_name}.{rel_name}", columns, primary_keys(query, [oid]).get(oid, ()))


def generated_columns(query: Query, relids: Iterable[int]) -> dict[int, frozenset[str]]:
    """The generated columns of each relation that has any."""
    ids = sorted(set(relids))
    if not ids:
        return {}
    rows = query(f"SELECT attrelid::int8, array_agg(attname::text) FROM pg_attribute WHERE attrelid = ANY({_int_array(ids)}"
                 "::oid[]) AND attnum > 0 AND NOT attisdropped AND attgenerated <> '' GROUP BY attrelid")
    return {int(r[0]): frozenset(str(c) for c in r[1]) for r in rows}


class RelationSchemas:
    """Schemas of the relations in a run of pgoutput messages, resolved with one catalog query per batch of new ones."""

    def __init__(self, query: Query, planned_keys: Callable[[], Mapping[int, tuple[str, ...]]] | None = None) -> None:
        """``planned_keys``: oid -> key as the tables were planned (called once, when a relation with a
        replica identity other than DEFAULT first needs one); a relation it lacks takes the catalog's."""
        self.query = query
        self._planned_keys = planned_keys
        self._planned: Mapping[int, tuple[str, ...]] | None = None
        # Generated columns exist since PostgreSQL 12, are published at all since 18.
        self._may_publish_generated = int(query("SHOW server_version_num")[0][0]) >= 180000
        self._types: dict[tuple[int, int], TypeInfo] = {}
        self._keys: dict[int, tuple[str, ...]] = {}
        self._generated: dict[int, frozenset[str]] = {}
        self._cache: dict[Relation, TableSchema] = {}

    def prepare(self, relations: Iterable[Relation]) -> None:
        """Resolve the types (and, for a non-default replica identity, the keys) of ``relations`` at once."""
        # (membership tests, not set() of the dicts: schema() calls this once per relation, and the dicts grow to
        # every table of the read -- copying them each time was ~0.07 s per read of 1,000 tables)
        rels = [r for r in relations if r not in self._cache]
        pairs = {(c.type_oid, c.type_mod) for r in rels for c in r.columns if (c.type_oid, c.type_mod) not in self._types}
        self._types.update(resolve_types(self.query, pairs))
        need_key = {r.relid for r in rels if r.replica_identity != "d" and r.relid not in self._keys}
        if need_key and self._planned_keys is not None:
            if self._planned is None:
                self._planned = self._planned_keys()
            self._keys.update({relid: self._planned[relid] for relid in need_key if relid in self._planned})
            need_key -= set(self._planned)
        found = primary_keys(self.query, need_key)
        self._keys.update({relid: found.get(relid, ()) for relid in need_key})
        # Only a publication with publish_generated_columns (PostgreSQL 18) sends generated columns: left out.
        need_generated = {r.relid for r in rels if r.relid not in self._generated}
        if need_generated and self._may_publish_generated:
            generated = generated_columns(self.query, need_generated)
            self._generated.update({relid: generated.get(relid, frozenset()) for relid in need_generated})

    def schema(self, rel: Relation) -> TableSchema:
        cached = self._cache.get(rel)
        if cached is not None:
            return cached
        self.prepare([rel])
        skip = self._generated.get(rel.relid, frozenset())
        columns = tuple(_column(c.name, self._types[(c.type_oid, c.type_mod)]) for c in rel.columns if c.name not in skip)
        if rel.replica_identity == "d":
            key = tuple(c.name for c in rel.columns if c.is_key)
        else:
            key = self._keys.get(rel.relid, ())
        schema = TableSchema(f"{rel.namespace}.{rel.name}", columns, key)
        self._cache[rel] = schema
        return schema
