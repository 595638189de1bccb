"""A bounded two-table stream made with Spark SQL from two ``flinkish.sequence`` splits, for routed-sink crash tests.

Split 0 becomes ``public.a``, split 1 ``public.b``; each data row follows its table's ``s``
row, as the multi-table source writes them. Hot keys are changed several times per epoch,
one change in seven is a delete, and from ``seq`` :data:`EVOLVE_AT` on ``public.a`` has a
column more (its schema evolves under the kills). :func:`expected` is what each target must
hold at the end.
"""

from __future__ import annotations

from flinkish_spark.testing.stream_rows import table_schema

LENGTHS = [400, 300]
EVOLVE_AT = 200  # public.a gains the column 'extra' here
A1 = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
A2 = table_schema("public.a", [("id", "int"), ("v", "text"), ("extra", "bigint")], ("id",))
B = table_schema("public.b", [("k", "text"), ("n", "bigint")], ("k",))


def _lit(text: str) -> str:
    assert "'" not in text
    return f"'{text}'"


def _row(schema_id: str, schema_json: str, op: str, data: str) -> str:
    """An ``s`` row and the data row after it, at one LSN (``_seq`` 0 and 1)."""
    table = "'public.a'" if '"public.a"' in schema_json else "'public.b'"
    lsn = "CAST(seq * 2 + split + 1 AS BIGINT)"

    def row(op: str, seq: int, text: str) -> str:
        return (f"named_struct('_table', {table}, '_op', {op}, '_lsn', {lsn}, '_seq', {seq}, '_commit_ts', "
                f"CAST(NULL AS TIMESTAMP), '_schema_id', {_lit(schema_id)}, 'row', {text})")

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
