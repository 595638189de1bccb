"""The SQL that applies one source table's staged rows of an epoch to its routed PostgreSQL target, per table mode.

Every statement runs in the epoch's one commit transaction (:mod:`.routed`); these builders only say what
each mode does with the staged rows (``_op`` r/c/u/d, ``_lsn``/``_seq`` and the staging order, ``_commit_ts``,
the row as JSON of PostgreSQL input texts), a truncate and a re-snapshot's end:

* ``upsert`` (:func:`upsert_sql`): the target holds each key's last change. ``deletes=true``: a delete removes
  the key; ``false``: deletes are not applied (the rows of ``d`` are left out, so the key's earlier change in the
  epoch or its target row stays); ``soft``: a key whose last change is a delete keeps its last values -- the
  epoch's last data row of the key, else its target row (live or soft-deleted: its values stay) -- with
  ``_deleted = true``, and a later insert sets ``_deleted = false`` again; a key with neither was never live (an
  update of a row the filter never kept, a delete of a key never seen) and gets no row, as a hard delete of an
  absent key changes nothing. One statement (``INSERT ... ON CONFLICT (key)``, the bare deletes an ``UPDATE``).
* ``history`` (:func:`history_statements`, SCD type 2): every change of a key is a version: ``_valid_from`` = its
  ``_commit_ts``, ``_valid_to`` = the key's next change's ``_commit_ts`` (null while current), ``_current``. The key's
  current target row is closed by its first change in the epoch (``_valid_to`` = that change's ``_commit_ts``); a
  delete closes without a new version (``deletes=false``: deletes are left out). The epoch's versions are first
  computed into a temporary table -- their unchanged columns filled from the key's current row while it is still
  current -- then the current rows are closed, then the versions inserted: the target's unique index on the key
  ``WHERE _current`` (:mod:`.routed_schema`) never sees two current versions of a key. A snapshot row (no ``_lsn``,
  a re-snapshot's) that is its key's only change in the epoch and equal in the source's columns to the key's current
  row adds no version (the current one stays open); a different one closes the current row and starts its version
  at one time, the epoch's newest change time of the table, else the commit's own -- the rules of the routed Delta
  and Iceberg sinks (:func:`~flinkish_spark.connectors.lakehouse.routed_modes.close_time_us`), so a history target
  means the same in every format.
* **Unchanged columns** (an update that left a TOASTed value unchanged does not carry it): the row takes the value
  of the key's latest earlier staged row that carries it (any task), else the key's (current) target row; null when
  neither holds the key. In every mode: a new history version never holds a null where the source has a value.
* A **truncate** (:func:`truncate_sql`): upsert deletes=true empties the target (the epoch's rows before it do not
  matter); soft marks every row ``_deleted``; history closes every current version at the truncate's
  ``_commit_ts``; deletes=false ignores it. Soft and history apply the epoch's rows before the truncate first
  (:func:`segments`), so their versions and last values are kept as the source had them.
* A re-snapshot's **end** (:func:`retire_sql`): the keys it did not deliver are deleted, marked ``_deleted`` or
  their current versions closed (at that same time: the source cannot tell when, in the gap, they went; never a
  null ``_valid_to``); deletes=false: nothing.

Ordering within the epoch: snapshot rows (no ``_lsn``) first, then ``(_lsn, _seq)``, then the task's partition and
row; deterministic in the staged rows and the target before the epoch, so the commit's retry after a crash (its
transaction rolled back) computes the same rows.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from flinkish_spark.connectors.lakehouse.changes import CURRENT, DELETED, VALID_FROM, VALID_TO
from flinkish_spark.connectors.lakehouse.table_modes import TableMode
from flinkish_spark.connectors.postgres.connection import quote_ident
from flinkish_spark.connectors.postgres.staging import S_ATTEMPT, S_EPOCH, S_PART, S_ROW

JSON = "_flinkish_json"
OP = "_flinkish_op"
FIRST = "_flinkish_first"
SNAP = "_flinkish_snap"  # a version that is a snapshot row (no _lsn), its key's only change in the epoch
SAME = "_flinkish_same"  # such a row equal to the key's current target row: no new version
NTH = "_flinkish_n"  # the version's place among its key's (1, 2, ...)
ABSORB = "_flinkish_absorb"  # tracked columns: equal to its predecessor's, which it replaces (_valid_from kept)
DROPPED = "_flinkish_dropped"  # tracked columns: a version the next one absorbed (not inserted)
#: Types whose ``=`` is not "the same value" (json, xml, the geometric types have none or compare areas) or unknown
#: to be: compared by their text output instead -- anything but the common built-in types below.
_EQUALITY = frozenset((
    "smallint", "integer", "bigint", "numeric", "real", "double precision", "boolean", "text", "character varying",
    "character", "bpchar", "name", "uuid", "date", "time without time zone", "time with time zone",
    "timestamp without time zone", "timestamp with time zone", "bytea", "jsonb", "inet", "cidr", "macaddr", "oid",
))
VERSIONS = "pg_temp.flinkish_versions"  # a history epoch's versions (the session's own; dropped after each table)
_ORDER = f"_lsn NULLS FIRST, _seq NULLS FIRST, {S_PART}, {S_ROW}"
_ORDER_DESC = f"_lsn DESC NULLS LAST, _seq DESC NULLS LAST, {S_PART} DESC, {S_ROW} DESC"


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def timestamp_sql(us: int) -> str:
    """A ``timestamptz`` literal of ``us`` µs since the epoch, exact to the microsecond."""
    return f"(TIMESTAMPTZ 'epoch' + {int(us)} * INTERVAL '1 microsecond')"


def same_value_sql(a: str, b: str, type_: str) -> str:
    """SQL true when the values ``a`` and ``b`` of a column of type ``type_`` (format_type's text) are the same,
    nulls included: ``IS NOT DISTINCT FROM``, over the text output where the type's ``=`` is not known to mean it."""
    base = re.sub(r"\(\d+(,\d+)?\)", "", type_).replace("[]", "").strip()
    if base in _EQUALITY:
        return f"{a} IS NOT DISTINCT FROM {b}"
    return f"{a}::text IS NOT DISTINCT FROM {b}::text"


class Position(NamedTuple):
    """A truncate's place in the stream (``_lsn``, ``_seq``) and its commit time."""

    lsn: int
    seq: int
    ts: object  # datetime | None, as psycopg read it


def segments(truncates: list[Position], mode: TableMode) -> list[tuple[Position | None, Position | None]]:
    """The ranges of the epoch's rows to apply, each ``(after, up to)`` a truncate; after each but the last
    range its ``up to`` truncate is applied. Upsert deletes=true applies only the rows after the last truncate
    (it empties the target anyway); deletes=false ignores truncates (one range, everything)."""
    if not truncates or mode.deletes == "false":
        return [(None, None)]
    if mode.mode == "upsert" and mode.deletes == "true":
        return [(truncates[-1], None)]
    bounds: list[Position | None] = [None, *truncates, None]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _range(after: Position | None, upto: Position | None) -> str:
    out = ""
    if after is not None:
        out += f" AND (_lsn, _seq) > ({int(after.lsn)}, {int(after.seq)})"
    if upto is not None:  # snapshot rows (no _lsn) come before every change
        out += f" AND (_lsn IS NULL OR (_lsn, _seq) < ({int(upto.lsn)}, {int(upto.seq)}))"
    return out


def _source(staging: str, columns: dict[str, str], key: tuple[str, ...], mode: TableMode, unchanged: list[str],
            after: Position | None, upto: Position | None) -> str:
    """The table's staged data rows in range (params: epoch, attempt ids, source table): key columns typed, the
    row's JSON (unchanged columns filled from the key's latest earlier staged row carrying them), op, order."""
    keys = ", ".join(quote_ident(k) for k in key)
    key_exprs = ", ".join(f"({JSON}->>{literal(k)})::{columns[k]} AS {quote_ident(k)}" for k in key)
    ops = "('r', 'c', 'u')" if mode.deletes == "false" else "('r', 'c', 'u', 'd')"
    where = f"{S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s) AND _table = %s AND _op IN {ops}" + _range(after, upto)
    meta = f"_lsn, _seq, _commit_ts, {S_PART}, {S_ROW}"
    src = (f"SELECT {key_exprs}, {JSON}, _op AS {OP}, {meta} FROM "
           f"(SELECT _row::jsonb AS {JSON}, _op, {meta} FROM {staging} WHERE {where}) s")
    if not unchanged:
        return src
    carried = ", ".join(f"array_agg({JSON}->{literal(n)}) FILTER (WHERE {JSON} ? {literal(n)}) OVER w AS _f{i}"
                        for i, n in enumerate(unchanged))
    merged = JSON
    for i, n in enumerate(unchanged):
        merged = (f"CASE WHEN {JSON} ? {literal(n)} OR _f{i} IS NULL THEN {merged} "
                  f"ELSE {merged} || jsonb_build_object({literal(n)}, _f{i}[array_upper(_f{i}, 1)]) END")
    return (f"SELECT {keys}, {merged} AS {JSON}, {OP}, {meta} FROM "
            f"(SELECT x.*, {carried} FROM ({src}) x WINDOW w AS (PARTITION BY {keys} ORDER BY {_ORDER} "
            "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)) y")


def _values(target: str, columns: dict[str, str], key: tuple[str, ...], unchanged: list[str], live: str) -> list[str]:
    """Each target data column's value from the row alias ``l``; an unchanged column the row lacks: the key's
    target row's (``live``: the condition that picks its current one)."""
    kept = " AND ".join(f"kept.{quote_ident(k)} = l.{quote_ident(k)}" for k in key) + live
    return [f"(l.{JSON}->>{literal(n)})::{t}" if n not in unchanged else
            f"CASE WHEN l.{JSON} ? {literal(n)} THEN (l.{JSON}->>{literal(n)})::{t} "
            f"ELSE (SELECT kept.{quote_ident(n)} FROM {target} kept WHERE {kept}) END" for n, t in columns.items()]


def upsert_sql(staging: str, target: str, columns: dict[str, str], key: tuple[str, ...], mode: TableMode,
               unchanged: list[str], after: Position | None = None, upto: Position | None = None) -> str:
    """One statement (params: epoch, attempt ids, source table) applying the range's last change per key."""
    keys = ", ".join(quote_ident(k) for k in key)
    src = _source(staging, columns, key, mode, unchanged, after, upto)
    last = f"SELECT DISTINCT ON ({keys}) {keys}, {JSON}, {OP} FROM x ORDER BY {keys}, {_ORDER_DESC}"
    cols = ", ".join(quote_ident(n) for n in columns)
    values = ", ".join(_values(target, columns, key, unchanged, ""))
    others = [n for n in columns if n not in key]
    sets = [f"{quote_ident(n)} = EXCLUDED.{quote_ident(n)}" for n in others]
    match = " AND ".join(f"t.{quote_ident(k)} = l.{quote_ident(k)}" for k in key)
    if mode.deletes != "soft":
        update = ("DO UPDATE SET " + ", ".join(sets)) if sets else "DO NOTHING"
        gone = f", gone AS (DELETE FROM {target} t USING l WHERE l.{OP} = 'd' AND {match})" if mode.deletes == "true" else ""
        return (f"WITH x AS ({src}), l AS ({last}){gone} "
                f"INSERT INTO {target} ({cols}) SELECT {values} FROM l WHERE l.{OP} <> 'd' ON CONFLICT ({keys}) {update}")
    # soft: a key whose last change is a delete takes its last data row's values in the range (v); without one
    # ("bare"), the target row keeps its own (only _deleted set; one marked already is left alone), and a key the
    # target lacks gets no row: it was never live (issue 30). One index look-up per bare delete, no scan.
    data = f"SELECT DISTINCT ON ({keys}) {keys}, {JSON} AS _v FROM x WHERE {OP} <> 'd' ORDER BY {keys}, {_ORDER_DESC}"
    w = f"SELECT {keys}, coalesce(v._v, l.{JSON}) AS {JSON}, {OP}, v._v IS NULL AS _bare FROM l LEFT JOIN v USING ({keys})"
    deleted = quote_ident(DELETED)
    return (f"WITH x AS ({src}), l AS ({last}), v AS ({data}), w AS ({w}), "
            f"marked AS (UPDATE {target} t SET {deleted} = true FROM w l "
            f"WHERE l.{OP} = 'd' AND l._bare AND {match} AND t.{deleted} IS NOT TRUE) "
            f"INSERT INTO {target} ({cols}, {deleted}) SELECT {values}, l.{OP} = 'd' FROM w l "
            f"WHERE NOT (l.{OP} = 'd' AND l._bare) ON CONFLICT ({keys}) DO UPDATE SET "
            + ", ".join(sets + [f"{deleted} = EXCLUDED.{deleted}"]))


def history_statements(staging: str, target: str, columns: dict[str, str], key: tuple[str, ...], mode: TableMode,
                       unchanged: list[str], after: Position | None = None, upto: Position | None = None,
                       snapshot_at: int | None = None, compared: list[str] | None = None,
                       tracked: tuple[str, ...] | None = None) -> list[tuple[str, bool]]:
    """The statements (each with whether it takes the params epoch, attempt ids, source table) adding the range's
    versions and closing the current rows they replace.

    ``snapshot_at`` (µs; None: every snapshot row is a version without times): a snapshot row that is its key's only
    change and equal in ``compared`` (default: every column) to the key's current row adds no version; a different
    one closes the current row and starts its version at this time (its change's own time is not known).

    ``tracked`` (``trackHistoryColumns``; None: every column): a version equal in these to its predecessor -- the
    key's previous version in the epoch (no delete between), or for its first the key's current row -- absorbs it:
    the predecessor is not inserted (the current row is deleted, not closed) and the version takes its
    ``_valid_from`` (:mod:`flinkish_spark.connectors.lakehouse.tracked`, the lakehouse sinks' rule)."""
    keys = ", ".join(quote_ident(k) for k in key)
    cols = ", ".join(quote_ident(n) for n in columns)
    hist = ", ".join(quote_ident(c) for c in (VALID_FROM, VALID_TO, CURRENT))
    src = _source(staging, columns, key, mode, unchanged, after, upto)
    values = ", ".join(f"{v} AS {quote_ident(n)}" for v, n in zip(
        _values(target, columns, key, unchanged, f" AND kept.{quote_ident(CURRENT)}"), columns))
    temp = ", ".join(f"{quote_ident(n)} {t}" for n, t in columns.items())
    match = " AND ".join(f"t.{quote_ident(k)} = v.{quote_ident(k)}" for k in key)
    by_key = ", ".join("l." + quote_ident(k) for k in key)
    snap = f"l._lsn IS NULL AND l.{OP} = 'r' AND count(*) OVER k = 1" if snapshot_at is not None else "false"
    out = [
        (f"CREATE TEMPORARY TABLE {VERSIONS} ({temp}, {OP} text, {quote_ident(VALID_FROM)} timestamptz, "
         f"{quote_ident(VALID_TO)} timestamptz, {quote_ident(CURRENT)} boolean, {FIRST} boolean, {SNAP} boolean, "
         f"{SAME} boolean, {NTH} bigint, {ABSORB} boolean, {DROPPED} boolean) ON COMMIT DROP", False),
        (f"INSERT INTO {VERSIONS} SELECT {values}, l.{OP}, l._commit_ts, lead(l._commit_ts) OVER w, "
         f"lead(true) OVER w IS NULL, row_number() OVER w = 1, {snap}, false, row_number() OVER w, false, false "
         f"FROM ({src}) l "
         f"WINDOW w AS (PARTITION BY {by_key} ORDER BY {_ORDER}), k AS (PARTITION BY {by_key})", True),
        (f"ANALYZE {VERSIONS}", False),  # a temporary table has no statistics: the close below finds rows by index
    ]
    if snapshot_at is not None:
        # One look-up of the key's current row per snapshot row (the unique index on the key WHERE _current): equal
        # -> no version, the current one stays open; different -> the version starts when the close ends the old.
        same = " AND ".join(same_value_sql(f"t.{quote_ident(n)}", f"v.{quote_ident(n)}", columns[n])
                            for n in (compared if compared is not None else list(columns))) or "true"
        out.append((f"UPDATE {VERSIONS} v SET {SAME} = ({same}), {quote_ident(VALID_FROM)} = {timestamp_sql(snapshot_at)} "
                    f"FROM {target} t WHERE v.{SNAP} AND {match} AND t.{quote_ident(CURRENT)}", False))
    if tracked is not None:
        out += _absorb_statements(target, columns, key, tracked)
    return out + [
        (f"UPDATE {target} t SET {quote_ident(VALID_TO)} = v.{quote_ident(VALID_FROM)}, {quote_ident(CURRENT)} = false "
         f"FROM {VERSIONS} v WHERE v.{FIRST} AND NOT v.{SAME} AND NOT v.{ABSORB} AND {match} AND t.{quote_ident(CURRENT)}",
         False),
        (f"INSERT INTO {target} ({cols}, {hist}) SELECT {cols}, {hist} FROM {VERSIONS} WHERE {OP} <> 'd' "
         f"AND NOT {SAME} AND NOT {DROPPED} ORDER BY {keys}", False),
        (f"DROP TABLE {VERSIONS}", False),
    ]


def _absorb_statements(target: str, columns: dict[str, str], key: tuple[str, ...],
                       tracked: tuple[str, ...]) -> list[tuple[str, bool]]:
    """Tracked columns: mark the versions equal to their predecessor in ``tracked`` (ABSORB), give each run of them
    its first one's ``_valid_from`` (the current row's, when the first absorbs it), mark the absorbed versions
    (DROPPED) and delete the current rows absorbed."""
    def same(a: str, b: str) -> str:
        return " AND ".join(same_value_sql(f"{a}.{quote_ident(n)}", f"{b}.{quote_ident(n)}", columns[n])
                            for n in tracked) or "true"

    def on(a: str, b: str) -> str:
        return " AND ".join(f"{a}.{quote_ident(k)} = {b}.{quote_ident(k)}" for k in key)

    keys = ", ".join(quote_ident(k) for k in key)
    fr, cur = quote_ident(VALID_FROM), quote_ident(CURRENT)
    runs = (f"SELECT {keys}, {NTH}, first_value({fr}) OVER (PARTITION BY {keys}, _run ORDER BY {NTH}) AS _f FROM "
            f"(SELECT {keys}, {NTH}, {fr}, sum(CASE WHEN {ABSORB} THEN 0 ELSE 1 END) OVER (PARTITION BY {keys} "
            f"ORDER BY {NTH}) AS _run FROM {VERSIONS}) q")
    return [
        (f"UPDATE {VERSIONS} v SET {ABSORB} = true FROM {VERSIONS} p WHERE {on('p', 'v')} AND p.{NTH} = v.{NTH} - 1 "
         f"AND p.{OP} <> 'd' AND v.{OP} <> 'd' AND {same('p', 'v')}", False),
        (f"UPDATE {VERSIONS} v SET {ABSORB} = true, {fr} = t.{fr} FROM {target} t WHERE v.{FIRST} AND v.{OP} <> 'd' "
         f"AND NOT v.{SAME} AND {on('t', 'v')} AND t.{cur} AND {same('t', 'v')}", False),
        (f"UPDATE {VERSIONS} v SET {fr} = r._f FROM ({runs}) r WHERE v.{ABSORB} AND {on('r', 'v')} "
         f"AND r.{NTH} = v.{NTH}", False),
        (f"UPDATE {VERSIONS} p SET {DROPPED} = true FROM {VERSIONS} v WHERE v.{ABSORB} AND {on('p', 'v')} "
         f"AND v.{NTH} = p.{NTH} + 1", False),
        (f"DELETE FROM {target} t USING {VERSIONS} v WHERE v.{FIRST} AND v.{ABSORB} AND {on('t', 'v')} AND t.{cur}",
         False),
    ]


def _gone_sql(target: str, mode: TableMode, close: str) -> str | None:
    """The statement that takes the target's live rows ``t`` away in ``mode`` (a condition may follow with ``AND``):
    deleted, marked ``_deleted`` (soft), closed at ``close`` (history: SQL of ``_valid_to``); None: kept."""
    if mode.deletes == "false":
        return None
    if mode.mode == "history":
        return (f"UPDATE {target} t SET {quote_ident(VALID_TO)} = {close}, {quote_ident(CURRENT)} = false "
                f"WHERE t.{quote_ident(CURRENT)}")
    if mode.deletes == "soft":
        return f"UPDATE {target} t SET {quote_ident(DELETED)} = true WHERE NOT t.{quote_ident(DELETED)}"
    return f"DELETE FROM {target} t WHERE TRUE"


def truncate_sql(target: str, mode: TableMode) -> str | None:
    """What a truncate does to the target (param for history: its commit time); None: nothing."""
    return _gone_sql(target, mode, "%s")


def retire_sql(target: str, mode: TableMode, close_us: int) -> str | None:
    """How a re-snapshot's end retires the target's rows ``t`` a condition appended to it selects; None: it does not.
    History closes their current versions at ``close_us`` (µs since the epoch)."""
    gone = _gone_sql(target, mode, timestamp_sql(close_us))
    return None if gone is None else gone + " AND"
