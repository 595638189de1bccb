"""The prepared transactions of ``commitMode=prepared``: their names, and clearing the way for a task.

A task attempt of sink uid U, run R, epoch E, Spark partition P, attempt A prepares its rows as
``flinkish/U/E/P/A/R`` (the committable). A prepared transaction keeps the locks of every key it
inserted until COMMIT or ROLLBACK PREPARED -- which only the driver runs, after *all* of the
epoch's tasks. So a task that inserts a key an earlier attempt of its epoch still holds would
wait for the driver, which waits for the task: for ever. Earlier attempts of an epoch come from

* a run that died past PREPARE (killed driver) -- Spark replays the epoch in the next run, and
* an attempt of the same task whose executor died past PREPARE -- Spark retries the task.

Guarantee (:func:`clear_the_way`, called by each task before it writes, on an epoch that has no
recorded decision -- the callers make sure of that: the stream writer does not prepare decided
epochs, ``transactional`` does not either): the epoch's prepared transactions of *other runs* are
rolled back (nothing can commit them: commits follow decisions, and the epoch has none); an
earlier attempt of the *same* task in this run that got as far as PREPARE is adopted -- the retry
reports it instead of writing the rows again -- so a retry never waits on it, and an attempt that
a speculative copy still runs is never rolled back under it. Any other wait (another client's
transaction, two tasks of one epoch inserting the same key) ends after the sink's ``lockTimeout``
with an error naming the prepared transactions that hold locks (:func:`lock_timeout_error`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flinkish_spark.connectors.postgres.connection import ConnectionInfo, connect, require_psycopg

GID_PREFIX = "flinkish"


@dataclass(frozen=True)
class Gid:
    """The parts of ``flinkish/<uid>/<epoch>/<partition>/<attempt>/<run>``."""

    uid: str
    epoch: int
    partition: int
    attempt: int
    run: str

    def __str__(self) -> str:
        return f"{GID_PREFIX}/{self.uid}/{self.epoch}/{self.partition}/{self.attempt}/{self.run}"

    @classmethod
    def parse(cls, gid: str) -> "Gid | None":
        parts = gid.split("/")
        if len(parts) != 6 or parts[0] != GID_PREFIX:
            return None
        try:
            return cls(parts[1], int(parts[2]), int(parts[3]), int(parts[4]), parts[5])
        except ValueError:
            return None


def epoch_prefix(uid: str, epoch: int) -> str:
    return f"{GID_PREFIX}/{uid}/{epoch}/"


def prepared_gids(c: Any, prefix: str) -> set[str]:
    """Prepared transactions of this database whose gid starts with ``prefix``."""
    rows = c.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
                     (prefix,)).fetchall()
    return {r[0] for r in rows}


def clear_the_way(conn: ConnectionInfo, me: Gid) -> str | None:
    """Before task attempt ``me`` writes its undecided epoch: roll back other runs' prepared
    transactions of the epoch; return the gid of an earlier attempt of the same task in this
    run that prepared (the caller adopts it and writes nothing), else None."""
    psycopg = require_psycopg()
    adopt: Gid | None = None
    with connect(conn, autocommit=True) as c:
        for text in sorted(prepared_gids(c, epoch_prefix(me.uid, me.epoch))):
            gid = Gid.parse(text)
            if gid is None:
                continue
            if gid.run != me.run:
                try:
                    c.execute(f"ROLLBACK PREPARED '{text}'")
                except (psycopg.errors.UndefinedObject, psycopg.errors.ObjectNotInPrerequisiteState):
                    pass  # another task of the epoch is rolling it back (or did)
            elif gid.partition == me.partition and gid.attempt < me.attempt and (adopt is None or gid.attempt > adopt.attempt):
                adopt = gid
    return None if adopt is None else str(adopt)


def is_lock_timeout(error: BaseException) -> bool:
    text = str(error)
    return "55P03" in text or "lock timeout" in text


def lock_timeout_error(conn: ConnectionInfo, uid: str, me: Gid, table: str, timeout_s: int) -> str:
    """What a task that gave up waiting for a lock tells the user: who holds locks, and what to do."""
    try:
        with connect(conn, autocommit=True) as c:
            held = sorted(r[0] for r in c.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY prepared").fetchall())
    except Exception:  # noqa: BLE001 - best effort: the message is still clear without the list
        held = []
    siblings = [g for g in held if (p := Gid.parse(g)) is not None and p.uid == uid and p.epoch == me.epoch
                and p.run == me.run and p.partition != me.partition]
    shown = ", ".join(repr(g) for g in held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
    return (
        f"flinkish.postgres sink uid {uid!r}: epoch {me.epoch}, partition {me.partition} (attempt {me.attempt}) waited "
        f"longer than lockTimeout ({timeout_s} s) for a lock on {table}: another transaction holds a row with one of the "
        f"task's keys, or the table. Prepared transactions in this database (they hold their locks until COMMIT or "
        f"ROLLBACK PREPARED): {shown or 'none'}. "
        + (f"{', '.join(map(repr, siblings))} belong to other tasks of this epoch: the epoch's rows hold a key twice, which "
           "the table's unique key refuses -- deduplicate the rows, or use mode=upsert. " if siblings else "")
        + "Resolve the prepared transactions that are not this query's (`flinkish orphans` lists this sink's), let the "
        "other writer finish, or raise the option lockTimeout (0 waits for ever). Nothing of the epoch is visible"
    )
