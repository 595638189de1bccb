"""``flinkish mirror``'s preflight: every mistake that can be found before Spark starts, found there.

(A MySQL/MariaDB source: :mod:`flinkish_spark.mirror.mysql_preflight`, the same guarantee; the sink's checks
below are the same for both.)

Guarantee: :func:`problems` creates nothing -- no replication slot, publication, folder or
object (a storage probe it writes is deleted again at once) -- and takes a few hundred
milliseconds. It returns one line per problem, each naming the thing and the fix, all of
them at once (not one per attempt):

* the source: reachable with these credentials (the password never shown), a supported
  version, ``wal_level = logical``, a role with REPLICATION (or superuser) for the slot;
* the publication: one that exists and is given (``publication``) or the mirror's own must publish
  every matching table completely; one the source will create (the mirror's, or a given name that
  does not exist yet) needs CREATE on the database and ownership of the tables; a publication or
  slot of the mirror's names must not belong to something else;
* the tables: at least one matches, and each is readable -- the source's own checks
  (:func:`~flinkish_spark.connectors.postgres.source.discovery.table_problems`), so what the
  running source refuses and what the preflight refuses stay the same; a table without a usable
  key (a primary key, or REPLICA IDENTITY USING INDEX) is no problem but a *warning*: the source
  leaves it out and picks it up once it has one (docs/postgres-source.md, "Keys");
* the sink: its options, checked by the sink's own DataSource (what ``writeStream.start()``
  would refuse), the metadata root and the target root writable (a probe file created and
  deleted), and a PostgreSQL target that does not write onto the source tables (the source database with
  a template that names them).
"""

from __future__ import annotations

import importlib
import os
import tempfile
import uuid
from typing import Any

from flinkish_spark.errors import FlinkishError, StorageAccessError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.mirror.config import MirrorConfig

#: The DataSource of each routing sink (constructed here exactly as ``writeStream.start()`` does).
SINK_CLASSES = {"delta": ("flinkish_spark.connectors.delta.sink", "DeltaSinkDataSource"),
                "iceberg": ("flinkish_spark.connectors.iceberg.sink", "IcebergSinkDataSource"),
                "postgres": ("flinkish_spark.connectors.postgres.sink", "PostgresSinkDataSource")}
#: How the tables of a suggested CREATE PUBLICATION are listed at most (then "...").
_LISTED = 8


def source_of(config: MirrorConfig) -> Any:
    """The mirror's ``flinkish.postgres`` source DataSource, its options validated (nothing connected or written)."""
    from flinkish_spark.connectors.postgres.connection import ConnectionInfo
    from flinkish_spark.connectors.postgres.source.datasource import PostgresSourceDataSource

    source = PostgresSourceDataSource(config.source_options())
    source.setup_source()
    if config.source_password is not None:  # in this process the password is not in the variable yet
        source.conn_info = ConnectionInfo(source.conn_info.url, None, config.source_password)
    return source


def problems(config: MirrorConfig, warnings: list[str] | None = None) -> list[str]:
    """Every problem the preflight finds, one line each (empty: the mirror may start); what does not stop the
    mirror but deserves a word (a table left out for want of a key) is added to ``warnings``, if given."""
    if config.source_kind == "mysql":  # the server's binary log settings, its tables, a purged restart position
        from flinkish_spark.mirror import mysql_preflight

        return mysql_preflight.problems(config, [] if warnings is None else warnings) + _sink_problems(config)
    found: list[str] = []
    try:
        source = source_of(config)
    except FlinkishError as e:
        return [str(e)]
    try:
        found += _source_problems(config, source, [] if warnings is None else warnings)
    except __import__("psycopg").Error as e:  # a catalog query refused or timed out: say so, start nothing
        found.append(source.conn_info.mask(f"--from: checking the source failed: {type(e).__name__}: {e}"))
    found += _sink_problems(config)
    return found


# ---------------------------------------------------------------- the source


def _source_problems(config: MirrorConfig, source: Any, warnings: list[str]) -> list[str]:
    from flinkish_spark.connectors.postgres import slot as slots
    from flinkish_spark.connectors.postgres.connection import check_server_version, connect
    from flinkish_spark.connectors.cdc.patterns import split_followable
    from flinkish_spark.connectors.postgres.source.discovery import find_tables, table_problems

    what = "--from"
    uses_slot = source.startup != "snapshot"
    out: list[str] = []
    try:
        conn = connect(source.conn_info, autocommit=True, connect_timeout=10)
    except FlinkishError as e:
        return [str(e)]
    with conn:
        try:
            check_server_version(conn, source.conn_info, what)
        except FlinkishError as e:
            return [str(e)]
        user = str(conn.execute("SELECT current_user").fetchone()[0])
        if uses_slot:
            for check in (slots.check_wal_level, slots.check_replication_role):
                try:
                    check(conn, what)
                except FlinkishError as e:
                    out.append(str(e))
        tables = find_tables(conn, source.patterns)
        out += [str(e) for e in table_problems(tables, source.patterns, "--tables", uses_slot, user)]
        followed, left_out = split_followable(tables)
        warnings += [t.not_followed() for t in left_out]
        if uses_slot and followed:
            out += _publication_problems(conn, source, followed, user)
        if config.format == "postgres":
            out += _target_is_source(config, conn, tables, source.patterns)
        out += _transform_problems(config, conn, followed)
        from flinkish_spark.mirror.route_rules import shard_problems

        out += shard_problems(config.format, config.target, dict(config.sink_extra), [t.name for t in followed])
    return out


#: Tables whose schema the preflight checks against their transform rule at most (the others: when their schema
#: first reaches the sink, which checks every table).
TRANSFORM_CHECKS = 200


def _transform_problems(config: MirrorConfig, conn: Any, tables: list[Any]) -> list[str]:
    """Each followed table a transform rule matches, against its schema now: a column the rule names that the table
    lacks, a key column left out, a computed column's name or type (the sink checks the same when a table's schema
    arrives; here it is known before anything starts)."""
    from flinkish_spark.connectors.lakehouse.transform.rules import parse_transforms
    from flinkish_spark.connectors.postgres.source.catalog import load_table_schema, psycopg_query

    transforms = parse_transforms(config.sink_options().get, "--sink-option")
    out = []
    for t in [t for t in tables if transforms.of(t.name) is not None][:TRANSFORM_CHECKS]:
        rule = transforms.of(t.name)
        schema = load_table_schema(psycopg_query(conn), t.oid)
        if rule is None or schema is None:
            continue
        try:
            rule.schema(schema)
        except FlinkishError as e:
            out.append(str(e))
    return out


def _publication_problems(conn: Any, source: Any, tables: list[Any], user: str) -> list[str]:
    """The publication (given, or to be created by the source) and the slot's name, as the source will find them."""
    from flinkish_spark.connectors.postgres import publication as publications
    from flinkish_spark.connectors.postgres import slot as slots
    from flinkish_spark.connectors.postgres.source.catalog import table_columns

    pub, directory = source.publication, source.checkpoint_store().directory
    owned = slots.Ownership.read(source.io, directory)
    ours_pub = owned is not None and owned.publication == pub and owned.publication_created
    out: list[str] = []
    create = (f"CREATE PUBLICATION {pub} FOR TABLE {_listed(tables)} WITH (publish_via_partition_root = true)")
    exists = publications.exists(conn, pub)
    if not exists:  # the source creates it: a new mirror, a name given for it, or ours that a failed run dropped
        out += _may_create_publication(conn, pub, tables, user, create, given=source.publication_given)
    elif not source.publication_given and not ours_pub:
        out.append(str(slots.foreign_publication(pub, directory, "--from")))
    elif exists:
        columns = table_columns(conn, [t.oid for t in tables])
        members = publications.published(conn, pub)
        joining = [t for t in tables if not source.publication_given and (t.schema, t.table) not in members]
        for t in tables:
            if t not in joining:
                try:
                    publications.check(conn, pub, (t.schema, t.table), columns[t.oid], "--source-option publication")
                except FlinkishError as e:
                    out.append(str(e))
        if joining:  # the source adds them to its own publication: ALTER PUBLICATION ... ADD TABLE, owner only
            out += _may_create_publication(conn, pub, joining, user, create, database=False)
    state, _lsn, slot_db = slots.slot_info(conn, source.slot_name)
    ours_slot = owned is not None and owned.slot == source.slot_name and owned.slot_created
    if state != "missing" and not ours_slot:
        db = str(conn.execute("SELECT current_database()").fetchone()[0])
        out.append(str(slots.foreign_slot(source.slot_name, slot_db if slot_db != db else None, directory, "--from")))
    return out


def _may_create_publication(conn: Any, pub: str, tables: list[Any], user: str, create: str,
                            database: bool = True, given: bool = False) -> list[str]:
    """CREATE PUBLICATION ... FOR TABLE needs CREATE on the ``database`` and ownership of every table (ALTER
    PUBLICATION ... ADD TABLE the latter only): one line naming what is missing, and the alternative (an admin
    creates it, the mirror is given its name)."""
    db = str(conn.execute("SELECT current_database()").fetchone()[0])
    missing = []
    if database and not conn.execute("SELECT has_database_privilege(current_database(), 'CREATE')").fetchone()[0]:
        missing.append(f"CREATE on the database (GRANT CREATE ON DATABASE {db} TO {user})")
    not_owned = [str(r[0]) for r in conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = ANY(%s) AND NOT pg_has_role(c.relowner, 'USAGE') ORDER BY 1",
        ([t.oid for t in tables],)).fetchall()]
    if not_owned:
        listed = ", ".join(not_owned[:_LISTED]) + (", ..." if len(not_owned) > _LISTED else "")
        missing.append(f"ownership of the tables it publishes -- the role does not own {listed} "
                       f"(ALTER TABLE ... OWNER TO {user})")
    if not missing:
        return []
    if given:
        return [f"--source-option publication: the publication {pub!r} does not exist, and the role {user!r} may not "
                f"create it: that takes {' and '.join(missing)}. Or have the tables' owner (or a superuser) create it: "
                f"{create}"]
    act = "create the publication" if database else f"add {_listed(tables)} to the publication"
    return [f"--from: the role {user!r} may not {act} {pub!r} the mirror needs: that takes "
            f"{' and '.join(missing)}. Or have the tables' owner (or a superuser) create it -- {create} -- and pass "
            f"--source-option publication={pub} (pipeline file: source.publication)"]


def _listed(tables: list[Any]) -> str:
    names = [t.name for t in tables]
    return ", ".join(names[:_LISTED]) + (", ..." if len(names) > _LISTED else "")


def _target_is_source(config: MirrorConfig, source_conn: Any, tables: list[Any], patterns: Any) -> list[str]:
    """A PostgreSQL target in the source database (however spelled) whose template names a table the mirror
    reads -- a source table itself, or one matching ``--tables`` -- would upsert onto the live source tables or
    mirror its own writes. (Another schema of the same database, e.g. ``mirror.{schema}_{table}``, is fine.)"""
    from flinkish_spark.connectors.lakehouse.routing import parse_route
    from flinkish_spark.connectors.postgres.connection import ConnectionInfo, connect, parse_url

    sink = dict(config.sink_extra)
    info = parse_url(sink["url"], None, "--to")
    if config.sink_password is not None:
        info = ConnectionInfo(info.url, None, config.sink_password)
    try:
        target = connect(info, autocommit=True, connect_timeout=10)
    except FlinkishError as e:
        return [str(e)]
    # The same server (its start time and port) and the same database: the same tables.
    identity = "SELECT current_database(), pg_postmaster_start_time(), current_setting('port')"
    with target:
        same = target.execute(identity).fetchone() == source_conn.execute(identity).fetchone()
    if not same:
        return []
    from flinkish_spark.connectors.lakehouse.routes import parse_routes

    route = parse_routes(parse_route(config.target, "postgres", "table", "--sink-option table"), sink.get, "--route")
    for t in tables:
        try:
            name = route.target(t.name)
        except FlinkishError as e:
            return [str(e)]
        if name == t.name or patterns.matches(name):
            return [f"--to names the source database itself ({info.masked}), and the target of {t.name} is "
                    f"{name}, a table the mirror reads: it would write onto the live source tables. Give another "
                    "database (or server) as --to, or a target template outside --tables "
                    "(--sink-option table=mirror.{schema}_{table})"]
    return []


# ---------------------------------------------------------------- the sink and storage


def _sink_problems(config: MirrorConfig) -> list[str]:
    module, name = SINK_CLASSES[config.format]
    options = {**config.sink_options(), "checkpointLocation": config.spark_checkpoint}
    try:
        sink = getattr(importlib.import_module(module), name)(options)  # the sink's own option checks
    except FlinkishError as e:
        return [str(e)]
    roots = [(sink.io, sink.checkpoint_root, "--checkpoint")]
    if config.format == "delta":
        roots.append((sink.data_io, config.target[:config.target.index("{")].rstrip("/"), "--to"))
    elif config.format == "iceberg":
        roots.append((sink.data_io, sink.catalog_props.get("warehouse") or sink.checkpoint_root, "warehouse"))
    out = []
    for io, url, what in roots:
        try:
            probe_writable(io, url, what)
        except FlinkishError as e:
            out.append(str(e))
    return out


def probe_writable(io: FileIO, url: str, what: str) -> None:
    """Write and delete a probe file where the first file under ``url`` would go, or raise StorageAccessError.

    Local: in the nearest folder of ``url`` that exists (nothing is created above it). Object
    stores: an object under ``url`` (put, then deleted). Nothing stays behind either way.
    """
    if io.is_local:
        folder = io.strip(url)
        while folder and not os.path.exists(folder):
            folder = os.path.dirname(folder.rstrip("/"))
        try:
            fd, probe = tempfile.mkstemp(prefix=".flinkish-probe-", dir=folder or ".")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise StorageAccessError(f"{what} {url!r} is not writable: no file can be created in {folder!r} "
                                     f"({e.strerror}). Give a folder this user may write") from None
        return
    probe = f"{url.rstrip('/')}/.flinkish-probe-{uuid.uuid4().hex}"
    try:
        io.write_bytes(probe, b"")
    except FlinkishError as e:
        raise StorageAccessError(f"{what} {url!r} is not writable: {e}") from None
    io.delete(probe)
