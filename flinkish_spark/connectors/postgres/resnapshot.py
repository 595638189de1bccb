"""A re-snapshot in a change stream, applied by the keyed ``flinkish.postgres`` sink (upsert, deletes=true).

When the source's replication slot is lost, the changes of the gap are lost with it -- among
them deletes, which a new snapshot cannot show (a deleted row is simply not there). With
``onSlotLost=resnapshot`` the source brackets the new snapshot with two marker rows, ``_op = 'B'``
before its first chunk and ``'E'`` after its last (every other column null). This module is the
sink's side: from the epoch holding 'B' on, it keeps the keys of the epoch's rows in a table of
its own next to the target (``flinkish_seen_<uid>_<hash>``); in the epoch holding 'E' it deletes
from the target every key the snapshot did not hold, and drops that table.

Guarantee: after the epoch with 'E' is committed, the target holds exactly the keys of the new
snapshot (then the changes after it follow as usual). It runs inside the epoch's commit
transaction, which is idempotent (``flinkish_commits``): a replay or a crash never applies it
twice or half. The marker rows themselves are never written to the target.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from flinkish_spark.connectors.postgres.connection import qualified, quote_ident

log = logging.getLogger(__name__)

BEGIN, END = "B", "E"  # the source's RESNAPSHOT_BEGIN / RESNAPSHOT_END
#: SQL: a staged row that is data, not a marker (``_op`` is null for sources without it).
NOT_A_MARKER = f"_op IS DISTINCT FROM '{BEGIN}' AND _op IS DISTINCT FROM '{END}'"


def seen_table_name(staging_table: str) -> str:
    return "flinkish_seen_" + staging_table[len("flinkish_staging_"):]


def apply_markers(c: Any, schema: str, target: str, staging: str, staging_table: str, key: Sequence[str],
                  where: str, params: Sequence[Any], retire: str | None = None) -> None:
    """Apply the markers among the staged rows ``where`` selects (after the epoch's rows moved to ``target``).

    ``retire``: how the end retires the target rows ``t`` of the keys the snapshot did not hold -- a statement a
    condition is appended to (default ``DELETE FROM <target> t WHERE``; the routed sink's soft deletes and
    history mark or close them instead, :func:`~flinkish_spark.connectors.postgres.routed_apply.retire_sql`)."""
    markers = {r[0] for r in c.execute(
        f"SELECT DISTINCT _op FROM {staging} WHERE {where} AND _op IN ('{BEGIN}', '{END}')", params).fetchall()}
    seen_name = seen_table_name(staging_table)
    seen = qualified(schema, seen_name)
    keys = ", ".join(quote_ident(k) for k in key)
    is_open = c.execute("SELECT to_regclass(%s)", (seen,)).fetchone()[0] is not None
    if BEGIN in markers:
        if not is_open:  # the key columns' types, from the target
            c.execute(f"CREATE TABLE {seen} AS SELECT {keys} FROM {target} WITH NO DATA")
        c.execute(f"TRUNCATE {seen}")  # a re-snapshot that began again (its 'E' never came)
        is_open = True
    if not is_open:
        if END in markers:
            log.warning("flinkish.postgres sink into %s: a re-snapshot ended whose beginning this sink never saw; "
                        "keys deleted while the source's slot was lost may remain", target)
        return
    c.execute(f"INSERT INTO {seen} ({keys}) SELECT {keys} FROM {staging} WHERE {where} AND {NOT_A_MARKER} "
              "AND _op IS DISTINCT FROM 'd'", params)
    if END in markers:
        match = " AND ".join(f"s.{quote_ident(k)} = t.{quote_ident(k)}" for k in key)
        gone = c.execute(f"{retire or f'DELETE FROM {target} t WHERE'} NOT EXISTS (SELECT 1 FROM {seen} s WHERE {match})").rowcount
        c.execute(f"DROP TABLE {seen}")
        log.warning("flinkish.postgres sink into %s: a re-snapshot after a lost replication slot is complete; "
                    "%d rows whose keys the table no longer holds were %s", target, gone,
                    "deleted" if retire is None or retire.startswith("DELETE") else "marked deleted or closed")
