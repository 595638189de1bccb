"""A bounded two-table stream made with Spark SQL from two ``flinkish.sequence`` splits, for routed-sink crash tests.

Split 0 becomes ``public.a``, split 1 ``public.b``; each data row follows its table's ``s``
row, as the multi-table source writes them. Hot keys are changed several times per epoch,
one change in seven is a delete, and from ``seq`` :data:`EVOLVE_AT` on ``public.a`` has a
column more (its schema evolves under the kills). :func:`expected` is what each target must
hold at the end; :func:`expected_history` and :func:`expected_soft` what ``public.a`` holds in mode ``history``
and ``public.b`` with ``deletes=soft`` (each change's ``_commit_ts`` is :func:`commit_ts` of its LSN).
"""

from __future__ import annotations

import datetime as dt

from flinkish_spark.testing.stream_rows import table_schema

LENGTHS = [400, 300]
EVOLVE_AT = 200  # public.a gains the column 'extra' here
A1 = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
A2 = table_schema("public.a", [("id", "int"), ("v", "text"), ("extra", "bigint")], ("id",))
B = table_schema("public.b", [("k", "text"), ("n", "bigint")], ("k",))
#: The commit time of LSN 0; a change's is this plus its LSN in seconds (``seq * 2 + split + 1``).
EPOCH_S = 1_767_225_600


def commit_ts(split: int, seq: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(EPOCH_S + seq * 2 + split + 1, dt.timezone.utc)


def _lit(text: str) -> str:
    assert "'" not in text
    return f"'{text}'"


def _row(schema_id: str, schema_json: str, op: str, data: str) -> str:
    """An ``s`` row and the data row after it, at one LSN (``_seq`` 0 and 1)."""
    table = "'public.a'" if '"public.a"' in schema_json else "'public.b'"
    lsn = "CAST(seq * 2 + split + 1 AS BIGINT)"

    def row(op: str, seq: int, text: str) -> str:
        return (f"named_struct('_table', {table}, '_op', {op}, '_lsn', {lsn}, '_seq', {seq}, '_commit_ts', "
                f"timestamp_seconds({EPOCH_S} + {lsn}), '_schema_id', {_lit(schema_id)}, 'row', {text})")

    return f"array({row(_lit('s'), 0, _lit(schema_json))}, {row(op, 1, data)})"


def stream_sql() -> list[str]:
    op = "CASE WHEN seq % 7 = 3 THEN 'd' ELSE 'u' END"
    a_key = "CAST(seq % 30 AS INT)"
    a_data = f"CASE WHEN seq % 7 = 3 THEN to_json(named_struct('id', {a_key})) ELSE to_json(named_struct('id', {a_key}, 'v', concat('v', seq))) END"
    a2_data = (f"CASE WHEN seq % 7 = 3 THEN to_json(named_struct('id', {a_key})) "
               f"ELSE to_json(named_struct('id', {a_key}, 'v', concat('v', seq), 'extra', seq)) END")
    b_data = ("CASE WHEN seq % 7 = 3 THEN to_json(named_struct('k', concat('k', seq % 25))) "
              "ELSE to_json(named_struct('k', concat('k', seq % 25), 'n', seq)) END")
    rows = (f"CASE WHEN split = 1 THEN {_row(B.schema_id, B.to_json(), op, b_data)} "
            f"WHEN seq < {EVOLVE_AT} THEN {_row(A1.schema_id, A1.to_json(), op, a_data)} "
            f"ELSE {_row(A2.schema_id, A2.to_json(), op, a2_data)} END")
    return [f"inline({rows})"]


def expected() -> tuple[list[tuple], list[tuple]]:
    a: dict[int, tuple | None] = {}
    b: dict[str, tuple | None] = {}
    for seq in range(LENGTHS[0]):
        key = seq % 30
        a[key] = None if seq % 7 == 3 else (key, f"v{seq}", seq if seq >= EVOLVE_AT else None)
    for seq in range(LENGTHS[1]):
        k = f"k{seq % 25}"
        b[k] = None if seq % 7 == 3 else (k, seq)
    return sorted(v for v in a.values() if v is not None), sorted(v for v in b.values() if v is not None)


def expected_history(track_extra: bool = False) -> list[tuple]:
    """``public.a`` in mode ``history`` (deletes applied): ``(id, v, extra, _valid_from, _valid_to, _current)`` sorted.
    ``track_extra``: only ``extra`` is tracked (``trackHistoryColumns.except: v``) -- a change that leaves it as it
    was (every change before :data:`EVOLVE_AT`: null) updates the key's current version in place."""
    versions: list[list] = []
    current: dict[int, list] = {}
    for seq in range(LENGTHS[0]):
        key, ts = seq % 30, commit_ts(0, seq)
        extra = seq if seq >= EVOLVE_AT else None
        if track_extra and seq % 7 != 3 and key in current and current[key][2] == extra:
            current[key][1] = f"v{seq}"  # in place: _valid_from kept
            continue
        if key in current:
            current.pop(key)[4:6] = [ts, False]
        if seq % 7 != 3:
            current[key] = [key, f"v{seq}", seq if seq >= EVOLVE_AT else None, ts, None, True]
            versions.append(current[key])
    return sorted(tuple(v) for v in versions)


def expected_soft() -> list[tuple]:
    """``public.b`` with ``deletes=soft``: ``(k, n, _deleted)`` sorted; a delete keeps the key's last values (a key
    never live gets no row: issue 30)."""
    rows: dict[str, tuple] = {}
    for seq in range(LENGTHS[1]):
        k = f"k{seq % 25}"
        if seq % 7 != 3:
            rows[k] = (k, seq, False)
        elif k in rows:
            rows[k] = (k, rows[k][1], True)
    return sorted(rows.values())
