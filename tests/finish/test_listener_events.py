"""The finish controller's progress events, built from JSON (finish/listener_events.py), carry what PySpark's
field-by-field copy of the Java object carries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.listener import StreamingQueryProgress


def _offset(offset: Any) -> Any:
    """An offset as a value. Both keep Spark's JSON text; an absent offset (the first batch's start)
    is ``str(None)`` in the copy and ``"null"`` in the JSON event."""
    if offset == "None":
        return None
    if isinstance(offset, str):
        try:
            return json.loads(offset)
        except ValueError:
            return offset
    return offset


def _fields(p: StreamingQueryProgress) -> dict[str, Any]:
    return {
        "id": p.id, "runId": p.runId, "name": p.name, "timestamp": p.timestamp, "batchId": p.batchId,
        "batchDuration": p.batchDuration, "durationMs": p.durationMs, "eventTime": p.eventTime,
        "numInputRows": p.numInputRows,
        "stateOperators": [(s.operatorName, s.numRowsTotal, s.numRowsUpdated) for s in p.stateOperators],
        "sources": [(s.description, _offset(s.startOffset), _offset(s.endOffset), _offset(s.latestOffset),
                     s.numInputRows, s.metrics) for s in p.sources],
        "sink": (p.sink.description, p.sink.numOutputRows, p.sink.metrics),
    }


def test_progress_from_json_equals_pyspark_copy_of_the_java_object(spark, tmp_path: Path) -> None:
    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", str(tmp_path / "meta"))
          .option("rowsPerSplit", "60,60").option("maxRowsPerTrigger", "50").load())
    # A watermark and an aggregation: the event-time map and a state operator are filled too.
    counted = (df.selectExpr("split", "timestamp_seconds(seq) AS ts").withWatermark("ts", "10 seconds")
               .groupBy("split", "ts").count())
    q = (counted.writeStream.format("noop").outputMode("append").option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    jprogresses = list(q._jsq.recentProgress())
    copied = [StreamingQueryProgress.fromJObject(j) for j in jprogresses]
    from_json = [StreamingQueryProgress.fromJson(json.loads(j.json())) for j in jprogresses]
    assert any(p.numInputRows and p.eventTime and p.stateOperators for p in copied)  # every field was filled once
    for j, c in zip(from_json, copied):
        a, b = _fields(j), _fields(c)
        assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b[k]}  # what differs, from JSON vs copied
        # Spark's JSON rounds the rates to one decimal; nothing of flinkish reads them.
        for rate in ("inputRowsPerSecond", "processedRowsPerSecond"):
            assert getattr(j, rate) == pytest.approx(getattr(c, rate), abs=0.051)
