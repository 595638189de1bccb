"""flinkish.delta with ``{schema}/{table}`` routing under kill -9, in child Spark drivers.

A bounded multi-table stream made with SQL from two sequence splits (split 0 -> ``public.a``,
split 1 -> ``public.b``; each data row follows its table's ``s`` row, as the source writes
them): hot keys changed several times per epoch, one change in seven a delete, and from
``seq`` 200 on ``public.a`` has a column more (its schema evolves under the kills). Runs are
killed at named points of the routed commit -- between the two tables' versions, before a
table's version, after the decision -- then a last run finishes. Each target must hold its
table's last change per key, each table must hold every epoch exactly once, and nothing on
storage may be unreferenced by its log.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.testing.delta_log import unreferenced
from flinkish_spark.testing.stream_rows import table_schema

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

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


def spec(tmp_path: Path) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 140}},
        "select": stream_sql(),
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "mirror", "path": str(tmp_path / "lake" / "{schema}" / "{table}"), "checkpointInterval": 3,
            "rowsPerFile": 40}},
        "master": "local[2,4]",
    }


def test_routed_delta_survives_kills_between_and_inside_the_tables_commits(run_pipeline, tmp_path: Path) -> None:
    lake = tmp_path / "lake" / "public"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "mirror")

    def txn(table: str) -> int:
        try:
            v = deltalake.DeltaTable(str(lake / table)).transaction_version("mirror")
        except deltalake.exceptions.TableNotFoundError:
            return -1
        return -1 if v is None else v

    # sink.between_tables is hit once per epoch (two tables): its 2nd hit is in epoch 1, after
    # public.a's version and before public.b's.
    run = run_pipeline(spec(tmp_path), crash_at="sink.between_tables:2")
    assert run.killed, f"no kill: {run.output[-3000:]}"
    decided, done = log.epochs()
    assert 1 in decided and 1 not in done
    assert (txn("a"), txn("b")) == (1, 0)  # one table has the epoch, the other not yet

    # The restart commits public.b's share of epoch 1 (public.a's is not applied again), then
    # is killed inside a later table commit, before its version.
    run = run_pipeline(spec(tmp_path), crash_at="delta.keyed.before_version:3")
    assert run.killed, f"no kill: {run.output[-3000:]}"
    assert txn("b") >= 1

    run = run_pipeline(spec(tmp_path), crash_at="sink.after_decision:2")
    assert run.killed, f"no kill: {run.output[-3000:]}"

    last = run_pipeline(spec(tmp_path))
    assert last.returncode == 0, last.output[-3000:]
    want_a, want_b = expected()
    a = deltalake.DeltaTable(str(lake / "a"))
    b = deltalake.DeltaTable(str(lake / "b"))
    assert [f.name for f in a.schema().fields] == ["id", "v", "extra"]
    assert sorted((r["id"], r["v"], r["extra"]) for r in pa.table(a.scan()).to_pylist()) == want_a
    assert sorted((r["k"], r["n"]) for r in pa.table(b.scan()).to_pylist()) == want_b
    for table in (a, b):
        epochs = [int(h["flinkish.epoch"]) for h in table.history()
                  if h.get("flinkish.uid") == "mirror" and "flinkish.epoch" in h]
        assert len(epochs) == len(set(epochs)) and epochs, epochs  # each epoch at most once in each table
    io = FileIO.for_url(str(tmp_path))
    assert unreferenced(io, str(lake / "a")) == set() and unreferenced(io, str(lake / "b")) == set()
