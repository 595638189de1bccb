"""One publication and one replication slot for all the tables of a multi-table source.

At the first start the publication is created ``FOR TABLE`` every matching table (with
``publish_via_partition_root``: a partitioned table's changes arrive under its own name),
then the slot -- the order the single-table source keeps, see :mod:`..slot`. A table that
joins later is added with ``ALTER PUBLICATION ... ADD TABLE`` when the source created the
publication; a publication given with the option ``publication`` must already publish it
(``FOR ALL TABLES`` and ``FOR TABLES IN SCHEMA`` do so by themselves).
"""

from __future__ import annotations

from typing import Any, Sequence

from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.errors import PostgresSourceError
from flinkish_spark.io.fileio import FileIO


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified(name: str) -> str:
    """``schema.table`` (unquoted, as the catalog spells it) as an SQL identifier."""
    schema, _, table = name.partition(".")
    return f"{_ident(schema)}.{_ident(table)}"


def published(conn: Any, publication: str) -> set[str] | None:
    """The ``schema.table`` names ``publication`` publishes, or None when it does not exist."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None:
        return None
    rows = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
    return {f"{s}.{t}" for s, t in rows.fetchall()}


def ensure(conn: Any, io: FileIO, directory: str, slot: str, publication: str, tables: Sequence[str],
           publication_given: bool, what: str) -> slots.Ownership:
    """Create (or, after a crash of the first run, reuse) the publication of ``tables``, then the slot."""
    db = slots.database_name(conn)
    claimed = slots.Ownership.read(io, directory)
    members = published(conn, publication)
    state, _confirmed, slot_db = slots.slot_info(conn, slot)
    ours_pub = claimed is not None and claimed.publication == publication and claimed.publication_created
    ours_slot = claimed is not None and claimed.slot == slot and claimed.slot_created and claimed.database == db
    if members is not None and not ours_pub and not publication_given:
        raise PostgresSourceError(
            f"{what}: a publication named {publication!r} already exists and was not created by this source "
            f"(its checkpoint folder {directory} does not claim it). Name another one with the option "
            "'publication', drop the old one (DROP PUBLICATION ...), or pass it explicitly if it is meant to be used"
        )
    if members is not None and not ours_pub:
        require_published(members, publication, tables, what)
    if state != "missing" and not ours_slot:
        where = f" (in database {slot_db!r})" if slot_db and slot_db != db else ""
        raise PostgresSourceError(
            f"{what}: a replication slot named {slot!r}{where} already exists and was not created by this "
            f"source (its checkpoint folder {directory} does not claim it). Name another one with the option "
            f"'slotName', or drop the old one: SELECT pg_drop_replication_slot('{slot}')"
        )
    owned = slots.Ownership(db, slot, publication, slot_created=True, publication_created=members is None or ours_pub)
    owned.write(io, directory)  # before creating: a crash leaves a claim, never an unclaimed slot
    if members is None:
        targets = ", ".join(qualified(t) for t in tables)
        conn.execute(
            f"CREATE PUBLICATION {_ident(publication)} FOR TABLE {targets} "
            "WITH (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)"
        )
    elif ours_pub:
        add(conn, publication, [t for t in tables if t not in members])
    if state == "missing":
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    elif state == "lost":
        raise PostgresSourceError(f"{what}: the replication slot {slot!r} was invalidated by the server before the first epoch")
    return owned


def require_published(members: set[str], publication: str, tables: Sequence[str], what: str) -> None:
    """Every one of ``tables`` in ``members`` (a publication the source did not create), or one clear error."""
    missing = [t for t in tables if t not in members]
    if missing:
        raise PostgresSourceError(
            f"{what}: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} matches 'tables' but the "
            f"publication {publication!r} (not created by this source) does not publish it, so its changes would be "
            f"lost. ALTER PUBLICATION {publication} ADD TABLE {missing[0]} (then restart), or exclude it: "
            f"'..., !{missing[0]}'"
        )


def add(conn: Any, publication: str, tables: Sequence[str]) -> None:
    """``ALTER PUBLICATION ... ADD TABLE`` for the tables not yet in it."""
    members = published(conn, publication) or set()
    todo = [t for t in tables if t not in members]
    if todo:
        conn.execute(f"ALTER PUBLICATION {_ident(publication)} ADD TABLE {', '.join(qualified(t) for t in todo)}")


def drop(conn: Any, publication: str, oid: int) -> None:
    """Take a table the source no longer follows (renamed out of the patterns) out of its own publication."""
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_publication_rel pr ON pr.prrelid = c.oid JOIN pg_publication p ON p.oid = pr.prpubid "
        "WHERE c.oid = %s AND p.pubname = %s", (oid, publication)).fetchone()
    if row is not None:  # gone with a DROP TABLE, or never a member by name
        conn.execute(f"ALTER PUBLICATION {_ident(publication)} DROP TABLE {qualified(f'{row[0]}.{row[1]}')}")
