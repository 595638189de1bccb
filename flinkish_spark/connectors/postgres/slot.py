"""The replication slot and publication of a ``flinkish.postgres`` source: checks, create, advance, drop.

Guarantees:

* The slot is created *before* the snapshot's chunk boundaries are computed and before any
  chunk is read, so every change committed after the slot's consistent point stays in the
  WAL until the source has read it and the sink has committed it.
* The slot is advanced (``pg_replication_slot_advance``) only to the end of an epoch whose
  checkpoint is complete -- never before -- so a replayed epoch still finds its changes.
* Ownership: before the source creates a slot or publication it records that in its own
  checkpoint folder (``_postgres.json``). An existing slot or publication of the same name
  that this record does not claim belongs to something else, and the source refuses to
  use (or ever drop) it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

from flinkish_spark.connectors.postgres import publication as publications
from flinkish_spark.connectors.postgres.pgoutput import format_lsn, parse_lsn
from flinkish_spark.errors import PostgresSourceError
from flinkish_spark.io.fileio import FileIO

MARKER_FILE = "_postgres.json"

SlotState = Literal["ok", "missing", "lost"]


@dataclass(frozen=True)
class Ownership:
    """What this source created on the server (written before creating it)."""

    database: str
    slot: str
    publication: str
    slot_created: bool
    publication_created: bool

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def read(cls, io: FileIO, directory: str) -> "Ownership | None":
        path = f"{directory}/{MARKER_FILE}"
        if not io.exists(path):
            return None
        d = json.loads(io.read_bytes(path))
        return cls(str(d["database"]), str(d["slot"]), str(d["publication"]),
                   bool(d["slot_created"]), bool(d["publication_created"]))

    def write(self, io: FileIO, directory: str) -> None:
        io.write_bytes(f"{directory}/{MARKER_FILE}", self.to_json())


def check_logical_replication(conn: Any, what: str) -> None:
    """``wal_level = logical`` and a role that may use replication slots, or a clear error."""
    check_wal_level(conn, what)
    check_replication_role(conn, what)


def check_wal_level(conn: Any, what: str) -> None:
    """``wal_level = logical``, or a clear error."""
    wal_level = conn.execute("SHOW wal_level").fetchone()[0]
    if wal_level != "logical":
        raise PostgresSourceError(
            f"{what}: the server's wal_level is {wal_level!r}; reading changes needs 'logical'. Set it with "
            "ALTER SYSTEM SET wal_level = 'logical' (or wal_level = logical in postgresql.conf; on managed "
            "services the 'logical replication' parameter) and restart the server; or use startup=snapshot"
        )


def check_replication_role(conn: Any, what: str) -> None:
    """A role that may create and use replication slots (REPLICATION or superuser), or a clear error."""
    row = conn.execute(
        "SELECT rolreplication OR rolsuper, current_user FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if not row or not row[0]:
        user = row[1] if row else "?"
        raise PostgresSourceError(
            f"{what}: the role {user!r} has no REPLICATION privilege, which replication slots need. "
            f"Grant it: ALTER ROLE {user} WITH REPLICATION; or use startup=snapshot"
        )


def database_name(conn: Any) -> str:
    return str(conn.execute("SELECT current_database()").fetchone()[0])


def slot_info(conn: Any, slot: str) -> tuple[SlotState, int | None, str | None]:
    """(state, confirmed_flush_lsn, database) of ``slot``; ``lost`` = invalidated by the server.

    The view's columns differ by version, so the row is read as JSON and each sign of an
    invalidated slot is taken where the server has it: ``wal_status = 'lost'`` (13+: WAL
    removed, e.g. ``max_slot_wal_keep_size``), ``conflicting`` (16: a recovery conflict on a
    standby), ``invalidation_reason`` (17+: any invalidation, also an idle timeout).
    """
    row = conn.execute("SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return "missing", None, None
    info = row[0]
    confirmed = info.get("confirmed_flush_lsn")
    lsn = None if confirmed is None else parse_lsn(str(confirmed))
    database = info.get("database")
    lost = info.get("wal_status") == "lost" or info.get("conflicting") is True or info.get("invalidation_reason") is not None
    return ("lost" if lost else "ok"), lsn, None if database is None else str(database)


def ensure_slot_and_publication(
    conn: Any,
    io: FileIO,
    directory: str,
    slot: str,
    publication: str,
    tables: Mapping[tuple[str, str], Sequence[str]],
    publication_given: bool,
    what: str,
    column_lists: publications.ColumnLists | None = None,
) -> Ownership:
    """Create (or, after a crash of the first run, reuse) the source's publication and slot.

    ``tables``: (schema, table) -> its columns, every table the source reads (one, or the
    matching ones of a multi-table source; with ``column_lists`` the kept ones). Order matters: the publication first, then the
    slot, then (by the caller) the snapshot.
    """
    db = database_name(conn)
    claimed = Ownership.read(io, directory)
    pub_exists = publications.exists(conn, publication)
    state, _confirmed, slot_db = slot_info(conn, slot)
    ours_pub = claimed is not None and claimed.publication == publication and claimed.publication_created
    ours_slot = claimed is not None and claimed.slot == slot and claimed.slot_created and claimed.database == db
    if pub_exists and not ours_pub and not publication_given:
        raise foreign_publication(publication, directory, what)
    if pub_exists and ours_pub:
        publications.add(conn, publication, list(tables), column_lists)  # a first run that crashed before adding them all
    if pub_exists:
        for table, columns in tables.items():
            # A column list of its own publication is the source's to keep (source.columns: the catalog poll sets
            # it, and snapshots a table again whose list lacked a column): not checked.
            publications.check(conn, publication, table, () if ours_pub else columns, what)
    if state != "missing" and not ours_slot:
        raise foreign_slot(slot, slot_db if slot_db != db else None, directory, what)
    owned = Ownership(db, slot, publication, slot_created=True, publication_created=not pub_exists or ours_pub)
    # Recorded before creating: a crash in between leaves a claim on something that may not
    # exist (harmless), never something created and unclaimed (which would block the restart).
    owned.write(io, directory)
    if not pub_exists:
        publications.create(conn, publication, list(tables), column_lists)
    if state == "lost":
        # Ours, and invalidated by the server (max_slot_wal_keep_size, ...): it can never send a
        # change again. We start a snapshot now (a new source, or a re-snapshot), so a new slot
        # -- created before the chunk boundaries -- is all that is needed.
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    if state != "ok":
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return owned


def foreign_publication(publication: str, directory: str, what: str) -> PostgresSourceError:
    """The refusal of a publication of the source's name that its checkpoint folder does not claim."""
    return PostgresSourceError(
        f"{what}: a publication named {publication!r} already exists and was not created by this source "
        f"(its checkpoint folder {directory} does not claim it). Name another one with the option "
        f"'publication', drop the old one (DROP PUBLICATION {publication}), or pass it explicitly if it is meant "
        "to be used"
    )


def foreign_slot(slot: str, other_database: str | None, directory: str, what: str) -> PostgresSourceError:
    """The refusal of a replication slot of the source's name that its checkpoint folder does not claim."""
    where = f" (in database {other_database!r})" if other_database else ""
    return PostgresSourceError(
        f"{what}: a replication slot named {slot!r}{where} already exists and was not created by this "
        f"source (its checkpoint folder {directory} does not claim it). Name another one with the option "
        f"'slotName', or drop the old one: SELECT pg_drop_replication_slot('{slot}')"
    )


def start_lsn(conn: Any, slot: str) -> int:
    state, confirmed, _ = slot_info(conn, slot)
    if state != "ok" or confirmed is None:
        raise PostgresSourceError(f"the replication slot {slot!r} is {state}")
    return confirmed


def advance(conn: Any, slot: str, lsn: int) -> bool:
    """Move the slot's confirmed position up to ``lsn`` (never back); False when the slot is gone.

    The end of a drain is delivered by two parties at once (the finish controller's final
    notification and Spark's next ``latestOffset``), and the other may drop the slot between this
    look and this act: gone then is gone, not an error.
    """
    state, confirmed, _ = slot_info(conn, slot)
    if state != "ok":
        return False
    if confirmed is not None and confirmed >= lsn:
        return True
    try:
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, format_lsn(lsn)))
    except __import__("psycopg").errors.UndefinedObject:
        return False
    return True


def drop(conn: Any, owned: Ownership) -> None:
    """Drop what this source created; idempotent, also when another party drops it at the same time."""
    psycopg = __import__("psycopg")
    if owned.slot_created and slot_info(conn, owned.slot)[0] != "missing":
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (owned.slot,))
        except psycopg.errors.UndefinedObject:
            pass  # dropped by the other party between our look and our act: done
    if owned.publication_created:
        conn.execute(psycopg.sql.SQL("DROP PUBLICATION IF EXISTS {}").format(psycopg.sql.Identifier(owned.publication)))


def wal_held_back(conn: Any, slot: str) -> tuple[str, int] | None:
    """(confirmed position, bytes of WAL the slot holds back) or None when there is no such slot."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    return str(row[0]), int(row[1] or 0)
