"""flinkish.delta keyed modes on real Spark, in the test session: writeStream.format and foreachBatch."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")

KEYS = 25
LENGTH = 700


def changes(spark, meta: str):
    """One sequence split as changes of 25 keys: many per key and epoch, one in nine a delete."""
    return (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", meta)
            .option("rowsPerSplit", str(LENGTH)).option("maxRowsPerTrigger", "200").load()
            .selectExpr(f"CAST(seq % {KEYS} AS BIGINT) AS id", "concat('v', seq) AS v",
                        "CASE WHEN seq % 9 = 4 THEN 'd' ELSE 'u' END AS _op", "CAST(seq AS BIGINT) AS _lsn"))


def expected() -> list[tuple]:
    last: dict[int, tuple | None] = {}
    for seq in range(LENGTH):
        last[seq % KEYS] = None if seq % 9 == 4 else (seq % KEYS, f"v{seq}")
    return sorted(v for v in last.values() if v is not None)


def last_batch(cp: Path) -> int:
    return max(int(p.name) for p in (cp / "commits").iterdir() if p.name.isdigit())


def read(path: Path) -> list[tuple]:
    return sorted((r["id"], r["v"]) for r in pa.table(deltalake.DeltaTable(str(path)).scan()).to_pylist())


def test_format_upsert_with_deletes(spark, tmp_path: Path) -> None:
    q = (changes(spark, str(tmp_path / "meta")).writeStream.format("flinkish.delta").option("uid", "out")
         .option("path", str(tmp_path / "t")).option("mode", "upsert").option("key", "id").option("deletes", "true")
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None, q.exception()
    assert read(tmp_path / "t") == expected()
    table = deltalake.DeltaTable(str(tmp_path / "t"))
    assert table.transaction_version("out") == last_batch(tmp_path / "cp") > 0
    assert table.schema().to_arrow().names == ["id", "v"]


def test_foreach_batch_upsert_with_deletes(spark, tmp_path: Path) -> None:
    from flinkish_spark import transactional
    from flinkish_spark.connectors.delta import DeltaSink

    df = changes(spark, str(tmp_path / "meta"))
    sink = DeltaSink.at(str(tmp_path / "t"), uid="out", schema=df.schema, mode="upsert", key="id", deletes="true")
    q = (df.writeStream.foreachBatch(transactional(sink, uid="out", checkpoint=str(tmp_path / "fb")))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None, q.exception()
    assert read(tmp_path / "t") == expected()
    assert deltalake.DeltaTable(str(tmp_path / "t")).transaction_version("out") == last_batch(tmp_path / "cp") > 0
