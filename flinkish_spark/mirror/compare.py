"""Is every target of a mirror equal to its source table? Row by row, by primary key.

:func:`compare_delta`, :func:`compare_iceberg` and :func:`compare_postgres` (and
:func:`compare_mirror`, which picks one from a ``flinkish mirror`` configuration: ``flinkish mirror
compare``) read each source table that matches the mirror's ``tables`` the way the source's
snapshot does -- PostgreSQL: :func:`~flinkish_spark.connectors.postgres.rows.row_sql` under the rows' session
settings, then :func:`~flinkish_spark.connectors.postgres.rows.decode_rows` to the stream's Arrow
types; MySQL/MariaDB (a ``mysql://`` URL): the ``flinkish.mysql`` chunk read, typed by the columns' types --
and its target the way a reader of the format does, found through the routing sink's own
route (and catalog, connection):

* Delta: delta-rs's scan, deletion vectors applied; ``s3://`` targets with the sink's storage
  options (``endpointUrl``, ``region``, ``storageOptions`` or the AWS environment variables);
* Iceberg: pyiceberg's scan (position deletes applied) through the sink's catalog (``catalog``,
  ``catalogUri`` + ``warehouse``, or the embedded one in the metadata root);
* PostgreSQL: the target table read as the source table is (its columns have the source's types);

and compares them value for value (:func:`compare_rows`, format-independent: any reader that gives
an Arrow table will do).

What counts: the source table's current columns, and of a target with a shape of its own (``mode`` / ``deletes`` /
``tableModes``, :mod:`flinkish_spark.mirror.shapes`) what it holds of the table *now* (:func:`current_rows`): a
history target's current versions, a soft-delete target's rows not deleted; a target that ignores deletes
(``deletes=false``) may hold keys the table no longer has, which are not counted as extra. A column the target has and the table no longer
has is not compared (a mirror keeps a dropped column, null from then on); a column the target does
not have counts as null in every target row. Values compare as Python values (``Decimal('1.50') ==
Decimal('1.5')``, timestamps by instant, NaN equal to NaN).

Both sides are read into memory: a check for the demo, the tests and a user who wants to see a
mirror of moderate size verified, not a tool for billions of rows. Run it when the mirror has
caught up (drained, or the source idle): a table changed while it is read differs by the changes
not yet mirrored.
"""

from __future__ import annotations

import collections
import math
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import CURRENT, DELETED
from flinkish_spark.connectors.lakehouse.table_modes import UPSERT, TableMode, TableModes, parse_table_modes
from flinkish_spark.connectors.lakehouse.transform.hooks import as_target
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms, parse_transforms
from flinkish_spark.connectors.postgres.rows import TableSchema, decode_rows, row_sql

#: A row's primary key values, in key order.
Key = tuple[Any, ...]


@dataclass(frozen=True)
class TableComparison:
    """One source table against its target. ``target_rows`` is None when the target does not exist."""

    table: str  # schema.table of the source
    source_rows: int
    target_rows: int | None
    missing: tuple[Key, ...]  # keys the table has and the target does not
    extra: tuple[Key, ...]  # keys the target has and the table does not
    different: tuple[Key, ...]  # keys both have, with other values in some column
    #: keys the target holds more than once (a row written twice: never right for a mirror, whatever its values)
    duplicated: tuple[Key, ...] = ()

    @property
    def equal(self) -> bool:
        return self.target_rows is not None and not (self.missing or self.extra or self.different or self.duplicated)

    def summary(self, examples: int = 3) -> str:
        """``equal``, ``no target``, or what differs with a few keys of each kind."""
        if self.target_rows is None:
            return "no target"
        if self.equal:
            return "equal"
        parts = [f"{len(keys)} {what} (e.g. {', '.join(map(repr, keys[:examples]))})"
                 for what, keys in (("missing", self.missing), ("extra", self.extra), ("different", self.different),
                                    ("duplicated", self.duplicated))
                 if keys]
        return "; ".join(parts)


def _plain(value: Any) -> Any:
    """A value as it compares and hashes: lists as tuples, NaN equal to NaN."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    return value


def rows_by_key(rows: pa.Table, schema: TableSchema) -> dict[Key, dict[str, Any]]:
    """``rows`` (a source table's or a target's) as key -> {column: value} over ``schema``'s current columns;
    a column ``rows`` does not have is null."""
    if not schema.key:
        raise ValueError(f"{schema.table} has no primary key: a mirror's rows are compared by key")
    present = [n for n in schema.names if n in rows.column_names]
    records = rows.select(present).to_pylist()
    out: dict[Key, dict[str, Any]] = {}
    for r in records:
        row = {n: _plain(r.get(n)) for n in schema.names}
        out[tuple(row[k] for k in schema.key)] = row
    return out


def current_rows(target: pa.Table | None, mode: TableMode) -> pa.Table | None:
    """What a target of ``mode`` holds of its table now, without the mode's own columns: history's current
    versions (``_current``), soft deletes' rows not deleted (``_deleted``)."""
    if target is None:
        return None
    if mode.extra_columns:
        target = _without_views(target)  # pyarrow 26 cannot filter string views (delta-rs's scan gives them)
    if mode.mode == "history" and CURRENT in target.column_names:
        target = target.filter(pc.fill_null(target[CURRENT], False))
    if mode.deletes == "soft" and DELETED in target.column_names:
        target = target.filter(pc.invert(pc.fill_null(target[DELETED], False)))
    return target.drop_columns([c for c in mode.extra_columns if c in target.column_names])


def _without_views(table: pa.Table) -> pa.Table:
    """``table`` with string and binary views (also inside lists, structs, maps) as plain large strings/binaries."""
    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_string_view(t):
            return pa.large_string()
        if pa.types.is_binary_view(t):
            return pa.large_binary()
        if pa.types.is_list(t):
            return pa.list_(t.value_field.with_type(plain(t.value_type)))
        if pa.types.is_large_list(t):
            return pa.large_list(t.value_field.with_type(plain(t.value_type)))
        if pa.types.is_struct(t):
            return pa.struct([t.field(i).with_type(plain(t.field(i).type)) for i in range(t.num_fields)])
        if pa.types.is_map(t):
            return pa.map_(plain(t.key_type), t.item_field.with_type(plain(t.item_type)))
        return t

    schema = pa.schema([f.with_type(plain(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def compare_rows(table: str, schema: TableSchema, source: pa.Table, target: pa.Table | None,
                 mode: TableMode = UPSERT) -> TableComparison:
    """``source`` (the table's rows in the stream's Arrow types) against ``target`` (as its format's reader sees
    it; None: no target), by ``schema``'s primary key over its current columns; ``mode``: the target's shape
    (:func:`current_rows`; with ``deletes=false`` keys the table no longer has are not extra)."""
    theirs = rows_by_key(source, schema)
    if target is None:
        return TableComparison(table, len(theirs), None, tuple(theirs), (), ())
    # one row per key: of history's current versions, else of the whole target (a soft delete's row included) ...
    once = current_rows(target, TableMode(mode.mode, "true"))
    assert once is not None
    counts = collections.Counter(tuple(_plain(v) for v in row) for row in
                                 zip(*(once.column(k).to_pylist() for k in schema.key if k in once.column_names)))
    target = current_rows(once, TableMode("upsert", mode.deletes))  # ... of which soft deletes' live rows count
    assert target is not None
    mine = rows_by_key(target, schema)
    return TableComparison(
        table, len(theirs), target.num_rows,
        missing=tuple(k for k in theirs if k not in mine),
        extra=() if mode.deletes == "false" else tuple(k for k in mine if k not in theirs),
        different=tuple(k for k, row in theirs.items() if k in mine and mine[k] != row),
        duplicated=tuple(k for k, n in counts.items() if n > 1),
    )


def source_rows(conn: Any, table: str) -> tuple[TableSchema, list[str]]:
    """``table``'s (``schema.table``) current schema and its rows as the stream's JSON (what a snapshot chunk
    reads: :func:`~flinkish_spark.connectors.postgres.rows.row_sql` under the rows' session settings), over a
    psycopg connection."""
    from flinkish_spark.connectors.postgres.connection import qualified
    from flinkish_spark.connectors.postgres.rows.encode import session_settings_sql
    from flinkish_spark.connectors.postgres.source.catalog import load_table_schema, psycopg_query, table_oid

    for statement in session_settings_sql():
        conn.execute(statement)
    sql_name = qualified(*table.split(".", 1))
    schema = load_table_schema(psycopg_query(conn), table_oid(conn, sql_name, "compare"))
    if schema is None:
        raise ValueError(f"compare: table {table} is gone")
    return schema, [r[0] for r in conn.execute(f"SELECT {row_sql(schema)} FROM {sql_name}").fetchall()]


def delta_storage(url: str, options: Mapping[str, str] | None = None) -> dict[str, str]:
    """delta-rs storage options for a Delta table at ``url``, from the sink's options (``endpointUrl``,
    ``region``, ``storageOptions``) and the AWS environment, as the ``flinkish.delta`` sink builds them."""
    from flinkish_spark.connectors.lakehouse.files import delta_storage_options
    from flinkish_spark.io.fileio import protocol_of, storage_options_from

    if protocol_of(url) != "s3":
        return {}
    return delta_storage_options(storage_options_from(dict(options or {}), url))


def read_delta(uri: str, storage_options: Mapping[str, str] | None = None) -> pa.Table | None:
    """The Delta table at ``uri`` as delta-rs reads it (deletion vectors applied); None when there is none."""
    from flinkish_spark.connectors.delta.table import deltalake

    dl = deltalake()
    try:
        table = dl.DeltaTable(uri, storage_options=dict(storage_options) if storage_options else None)
    except dl.exceptions.TableNotFoundError:
        return None
    return pa.table(table.scan())


def delta_reader(target: str, options: Mapping[str, str] | None = None) -> Callable[[str], pa.Table | None]:
    """A reader of each source table's (``schema.table``) routed Delta target: ``target`` is the mirror's ``--to``
    (a path with ``{schema}``/``{table}``, or a folder: ``folder/<schema>/<table>``), ``options`` the sink's
    storage options for ``s3://``; the reader gives :func:`read_delta`'s table, None when there is no target."""
    from flinkish_spark.connectors.lakehouse.routing import parse_route
    from flinkish_spark.mirror.config import delta_target

    from flinkish_spark.connectors.lakehouse.routes import compare_routes, path_resolver, shard_rows

    template = delta_target(target)
    route = compare_routes(parse_route(template, "path", "path", "compare"), options, path_resolver(template, "compare"))
    storage = delta_storage(target, options)
    return lambda table: shard_rows(route, table, read_delta(route.target(table), storage))


def iceberg_reader(target: str, options: Mapping[str, str], checkpoint: str) -> Callable[[str], pa.Table | None]:
    """A reader of each source table's routed Iceberg target: ``target`` is the sink's ``table`` template, ``options``
    its catalog and storage options, ``checkpoint`` its metadata root (where the embedded catalog lives when neither
    ``catalog`` nor ``catalogUri`` is set); pyiceberg's scan, position deletes applied (a merged shard: its rows of the
    target); None when there is no target."""
    from flinkish_spark.connectors.iceberg.catalog import catalog_properties, load, pyiceberg
    from flinkish_spark.connectors.lakehouse.routing import parse_route

    from flinkish_spark.connectors.lakehouse.routes import compare_routes, shard_rows

    route = compare_routes(parse_route(target, "iceberg", "table", "compare"), options)
    opts = dict(options)
    props = catalog_properties(opts.get("catalog"), opts.get("catalogUri"), opts.get("warehouse"), checkpoint, opts,
                               "compare", opts.get("catalogName"))
    pyiceberg()
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    def read(table: str) -> pa.Table | None:
        try:
            rows = load(props).load_table(route.target(table)).scan().to_arrow()
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        return shard_rows(route, table, rows)  # a merged shard: its rows of the target, as Delta's and PostgreSQL's

    return read


def postgres_reader(conn: Any, template: str, options: Mapping[str, str] | None = None) -> Callable[[str], pa.Table | None]:
    """A reader of each source table's routed PostgreSQL target over ``conn`` (a psycopg connection to the sink's
    ``url``): ``template`` is the sink's ``table`` option, ``options`` the sink's (its route rules: a merged shard's
    rows of its target); None when the target does not exist."""
    from flinkish_spark.connectors.lakehouse.routes import compare_routes, shard_rows
    from flinkish_spark.connectors.postgres.connection import qualified
    from flinkish_spark.connectors.postgres.routed import check_template

    route = compare_routes(check_template(template, "compare"), options)

    def read(table: str) -> pa.Table | None:
        name = route.target(table)
        if conn.execute("SELECT to_regclass(%s)", (qualified(*name.split(".", 1)),)).fetchone()[0] is None:
            return None
        schema, rows = source_rows(conn, name)
        return shard_rows(route, table, decode_rows(rows, schema))

    return read


def _matching_tables(conn: Any, tables: str) -> list[str]:
    from flinkish_spark.connectors.cdc.patterns import TablePatterns
    from flinkish_spark.connectors.postgres.source.discovery import find_tables

    # A table without a usable key is not mirrored (left out with a warning): not compared either.
    return [t.name for t in find_tables(conn, TablePatterns.parse(tables, "compare: tables")) if t.key_problem is None]


#: A source's matching tables, each as (``schema.table``, its schema, its rows in the stream's Arrow types).
SourceTables = Iterator[tuple[str, TableSchema, pa.Table]]


def postgres_tables(source_url: str, tables: str, password_env: str | None = None) -> SourceTables:
    """Each table of a PostgreSQL ``source_url`` that matches ``tables`` and has a key its changes are applied by
    (a table without one is not mirrored: docs/mirror.md), read as a snapshot chunk is (:func:`source_rows`), in
    name order. The password: in the URL, from the variable ``password_env`` names,
    ``PGPASSWORD`` or ``~/.pgpass`` (as libpq)."""
    from flinkish_spark.connectors.postgres.connection import connect, parse_url

    with connect(parse_url(source_url, password_env, "compare: source"), autocommit=True) as conn:
        for name in _matching_tables(conn, tables):
            schema, rows = source_rows(conn, name)
            yield name, schema, decode_rows(rows, schema)


def mysql_tables(source_url: str, tables: str, password_env: str | None = None) -> SourceTables:
    """Each table of a MySQL/MariaDB ``source_url`` that matches ``tables`` (``database.table`` patterns) and has a
    primary key (a table without one is not mirrored: docs/mysql-source.md), read as the ``flinkish.mysql`` snapshot
    reads a chunk (the whole table in a consistent snapshot of its own, typed by its column types), in name order.
    The password: in the URL, from the variable ``password_env`` names, or ``MYSQL_PWD``."""
    from flinkish_spark.connectors.cdc.patterns import TablePatterns
    from flinkish_spark.connectors.mysql import catalog
    from flinkish_spark.connectors.mysql.chunk_rows import read_chunk_arrow
    from flinkish_spark.connectors.mysql.connection import parse_url, session
    from flinkish_spark.connectors.mysql.snapshot import table_info
    from flinkish_spark.connectors.mysql.stream_rows import schema_of_info

    with session(parse_url(source_url, password_env, "compare: source")) as conn:
        for t in catalog.find_tables(conn, TablePatterns.parse(tables, "compare: tables")):
            if not t.has_key:
                continue
            info = table_info(conn, t.database, t.table)
            rows = pa.Table.from_batches(list(read_chunk_arrow({"database": t.database, "name": t.table}, conn)),
                                         info.arrow_schema)
            yield t.name, schema_of_info(info), rows


def matching_source_tables(source_url: str, tables: str, password_env: str | None = None) -> SourceTables:
    """:func:`mysql_tables` for a ``mysql://`` (or ``mariadb://``) URL, else :func:`postgres_tables`."""
    if urllib.parse.urlsplit(source_url).scheme in ("mysql", "mariadb"):
        return mysql_tables(source_url, tables, password_env)
    return postgres_tables(source_url, tables, password_env)


def compare_tables(source_url: str, tables: str, read: Callable[[str], pa.Table | None],
                   password_env: str | None = None, modes: TableModes = TableModes(),
                   transforms: Transforms = Transforms()) -> list[TableComparison]:
    """Each table of ``source_url`` that matches ``tables`` (the mirror's ``--tables``) against ``read(table)`` (its
    target's rows as a reader of the format sees them, None: no target), in name order, one table at a time;
    ``modes``: each target's shape (the sink's ``mode`` / ``deletes`` / ``tableModes``); ``transforms``: the sink's
    columns and rows chosen (a transformed table is compared as its target must hold it now:
    :func:`~flinkish_spark.connectors.lakehouse.transform.hooks.as_target`). ``source_url``: PostgreSQL or MySQL
    (:func:`matching_source_tables`, which says where the password comes from)."""
    out = []
    for name, schema, rows in matching_source_tables(source_url, tables, password_env):
        schema, typed = as_target(transforms, name, schema, rows)
        out.append(compare_rows(name, schema, typed, read(name), modes.of(name)))
    return out


def compare_delta(source_url: str, tables: str, target: str, options: Mapping[str, str] | None = None,
                  password_env: str | None = None) -> list[TableComparison]:
    """:func:`compare_tables` against the Delta targets of ``target`` (the mirror's ``--to``, a path with
    ``{schema}``/``{table}`` or a folder); ``options``: the sink's storage options for ``s3://`` targets."""
    return compare_tables(source_url, tables, delta_reader(target, options), password_env, _modes(options),
                          _transforms(options))


def compare_iceberg(source_url: str, tables: str, target: str, options: Mapping[str, str], checkpoint: str,
                    password_env: str | None = None) -> list[TableComparison]:
    """:func:`compare_tables` against the Iceberg targets of the ``table`` template ``target`` (see
    :func:`iceberg_reader`)."""
    return compare_tables(source_url, tables, iceberg_reader(target, options, checkpoint), password_env,
                          _modes(options), _transforms(options))


def compare_postgres(source_url: str, tables: str, target_url: str, template: str = "{schema}.{table}",
                     password_env: str | None = None, target_password_env: str | None = None,
                     options: Mapping[str, str] | None = None) -> list[TableComparison]:
    """:func:`compare_tables` against the tables ``template`` names in the database ``target_url``; ``options``: the
    sink's (its table modes)."""
    from flinkish_spark.connectors.postgres.connection import connect, parse_url

    with connect(parse_url(target_url, target_password_env, "compare: target"), autocommit=True) as conn:
        return compare_tables(source_url, tables, postgres_reader(conn, template, options), password_env, _modes(options),
                              _transforms(options))


def _modes(options: Mapping[str, str] | None) -> TableModes:
    return parse_table_modes((options or {}).get, "compare")


def _transforms(options: Mapping[str, str] | None) -> Transforms:
    return parse_transforms((options or {}).get, "compare")


def compare_mirror(config: Any) -> list[TableComparison]:
    """Every table of a ``flinkish mirror`` (its :class:`~flinkish_spark.mirror.config.MirrorConfig`) against its
    target, through the options the mirror gives its source and sink. Passwords the configuration carries must
    be in the environment variables :meth:`~flinkish_spark.mirror.config.MirrorConfig.password_env` names."""
    source, sink = config.source_options(), config.sink_options()
    url, tables, password_env = source["url"], source["tables"], source.get("passwordEnv")
    if config.format == "delta":
        return compare_delta(url, tables, sink["path"], sink, password_env)
    if config.format == "iceberg":
        return compare_iceberg(url, tables, sink["table"], sink, sink["checkpoint"], password_env)
    return compare_postgres(url, tables, sink["url"], sink["table"], password_env, sink.get("passwordEnv"), sink)
