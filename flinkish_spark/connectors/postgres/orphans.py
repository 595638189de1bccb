"""Find and remove what a crashed ``flinkish.postgres`` sink left in the database.

* prepared transactions ``flinkish/<uid>/<epoch>/...`` (``pg_prepared_xacts``): a forgotten
  one holds its locks and stops VACUUM until it is resolved;
* staged rows of the sink's staging table(s), by (epoch, task attempt).

States, from the sink's decision log (as for Parquet staging files,
:mod:`flinkish_spark.sink.orphans`): ``decided`` -- named by a recorded decision whose commit
is not done (a restart commits it: never removed); ``orphan`` -- its epoch is committed and it
is not what was committed, or a later epoch is decided; ``pending`` -- an undecided newest
epoch, which a running or restarted query redoes (removed only with ``include_pending``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from flinkish_spark.connectors.postgres.connection import ConnectionInfo, connect, qualified
from flinkish_spark.connectors.postgres.routed import ROUTED_PREFIX, decode_staged
from flinkish_spark.connectors.postgres.sink import GID_PREFIX, S_ATTEMPT, S_EPOCH, decode_committable, staging_table_name
from flinkish_spark.sink.decisions import DecisionLog

OrphanState = Literal["orphan", "pending", "decided"]


@dataclass(frozen=True)
class PgLeftover:
    kind: Literal["prepared", "staged"]
    epoch: int
    name: str  # the gid, or "<schema>.<staging table>:<attempt id>"
    rows: int | None
    state: OrphanState


def _state(epoch: int, ident: str, log: DecisionLog, decided: list[int], done: set[int]) -> OrphanState:
    if epoch in done:
        return "orphan"
    if epoch in decided:
        decision = log.read(epoch)
        named = set()
        if decision is not None:
            for raw in decision.committables:
                c = decode_staged(raw) if raw.startswith(ROUTED_PREFIX) else decode_committable(raw)
                named.add(getattr(c, "gid", None) or getattr(c, "attempt_id", None))
        return "decided" if ident in named else "orphan"
    return "orphan" if decided and epoch < decided[-1] else "pending"


def scan(conn: ConnectionInfo, log: DecisionLog) -> list[PgLeftover]:
    decided, done = log.epochs()
    out: list[PgLeftover] = []
    with connect(conn, autocommit=True) as c:
        for (gid,) in c.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s) "
                                "ORDER BY gid", (f"{GID_PREFIX}/{log.uid}/",)).fetchall():
            parts = gid.split("/")
            if len(parts) == 6 and parts[2].isdigit():
                epoch = int(parts[2])
                out.append(PgLeftover("prepared", epoch, gid, None, _state(epoch, gid, log, decided, done)))
        for schema, table in _staging_tables(c, log.uid):
            rows = c.execute(f"SELECT {S_EPOCH}, {S_ATTEMPT}, count(*) FROM {qualified(schema, table)} GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
            for epoch, attempt, n in rows:
                state = _state(int(epoch), attempt, log, decided, done)
                out.append(PgLeftover("staged", int(epoch), f"{schema}.{table}:{attempt}", int(n), state))
    return out


def _staging_tables(c: Any, uid: str) -> list[tuple[str, str]]:
    # The name is staging_table_name(uid, target): its uid part is fixed, its digest depends on the target.
    prefix = staging_table_name(uid, "")[: -len("0123456789")]
    rows = c.execute("SELECT schemaname, tablename FROM pg_tables WHERE starts_with(tablename, %s)", (prefix,)).fetchall()
    return [(r[0], r[1]) for r in rows]


def remove(conn: ConnectionInfo, entries: list[PgLeftover], include_pending: bool = False) -> list[PgLeftover]:
    doomed = [e for e in entries if e.state == "orphan" or (include_pending and e.state == "pending")]
    with connect(conn, autocommit=True) as c:
        for e in doomed:
            if e.kind == "prepared":
                c.execute(f"ROLLBACK PREPARED '{e.name}'")
            else:
                table, attempt = e.name.split(":", 1)
                schema, name = table.split(".", 1)
                c.execute(f"DELETE FROM {qualified(schema, name)} WHERE {S_EPOCH} = %s AND {S_ATTEMPT} = %s", (e.epoch, attempt))
    return doomed
