"""Run one streaming pipeline from a JSON spec in this process, for crash tests and demos.

``python -m flinkish_spark.runner SPEC.json`` starts a local Spark
driver, runs ``readStream.format(source) -> writeStream.format(sink)`` with the
spec's options and trigger until the query ends (AvailableNow) or
``runSeconds`` pass, and exits 0. With ``FLINKISH_CRASH_AT`` set (see
:mod:`flinkish_spark.faults`) the driver is killed at that protocol point.

Spec keys: ``source`` {format, options, schema?}, ``sources`` (a list, unioned),
``select`` (a list of SQL expressions for ``selectExpr``),
``register`` (a list of "module:function" that register extra formats with the session),
``sink`` {format, options, checkpointLocation} or {foreachBatch: {uid, path, checkpoint, options}, checkpointLocation}
(``foreachBatch.kind`` = "postgres" with url, table, mode, key, createTable, commitMode instead of path: a PostgresSink),
or {sparkFiles: {uid, path, checkpoint, format, partitionBy, options}, checkpointLocation} (:func:`flinkish_spark.files_sink`),
``map`` (a list of "module:function" applied to the DataFrame before the sink), ``trigger`` ("availableNow" or
"N seconds"), ``runSeconds``, ``master``, ``remote`` (a Spark Connect URL: this process is then only the
client, see :func:`flinkish_spark.session`), ``serverTimeout`` (seconds a Connect client waits for a server that
stopped answering; ``server_timeout`` of :func:`flinkish_spark.session`), ``conf`` (Spark settings), and how the run ends: ``end`` = "finish"
(``await_finished``; the default for AvailableNow), "stop" / "drain" (``flinkish_spark.stop``
after ``stopAfterBatches`` committed batches), "external" (wait for ``flinkish stop`` from
another process) or "timeout" (``query.stop()`` after ``runSeconds``, or earlier once the file ``stopWhenExists`` names exists). The run prints
``QUERY_END=<how it ended>``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any


# For tests that start many short-lived drivers: a JVM that only JIT-compiles with C1 and
# uses the serial collector starts about 20 % faster on two cores (measured 26 s vs 32 s per
# pipeline run). Not a recommendation for long-running pipelines.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SHORT_LIVED_CONF = {"spark.driver.extraJavaOptions": SHORT_LIVED_JVM, "spark.executor.extraJavaOptions": SHORT_LIVED_JVM}


def child_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with :data:`SHORT_LIVED_CONF` added (the spec's own ``conf`` entries win)."""
    return {**spec, "conf": {**SHORT_LIVED_CONF, **spec.get("conf", {})}}


def _read(spark: Any, spec: dict[str, Any]) -> Any:
    reader = spark.readStream.format(spec["format"])
    if spec.get("schema"):
        reader = reader.schema(spec["schema"])
    for key, value in spec.get("options", {}).items():
        reader = reader.option(key, str(value))
    return reader.load()


def _named(target: str) -> Any:
    """The function a ``"module:function"`` spec entry names."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def run(spec: dict[str, Any]) -> None:
    from flinkish_spark.faults import arm_for_process_group

    arm_for_process_group()  # before Spark starts: crash points kill this process, the JVM and its workers
    import flinkish_spark
    from flinkish_spark.session import is_connect

    spark = flinkish_spark.session(master=spec.get("master", "local[2]"), app_name="flinkish-pipeline",
                                   conf=spec.get("conf"), remote=spec.get("remote"),
                                   server_timeout=spec.get("serverTimeout"))
    if not is_connect(spark):  # a Connect server's log level is the server's business
        spark.sparkContext.setLogLevel("ERROR")
    # Extra formats (e.g. the test suite's counting source): "module:function" names that
    # take the session. Imported by name so this module never depends on test helpers.
    for target in spec.get("register", []):
        _named(target)(spark)
    sources = spec.get("sources") or [spec["source"]]
    df = _read(spark, sources[0])
    for other in sources[1:]:
        df = df.unionByName(_read(spark, other))
    if spec.get("select"):  # SQL expressions applied before the sink (e.g. derive a key)
        df = df.selectExpr(*spec["select"])
    for target in spec.get("map", []):
        df = _named(target)(df)
    sink = spec["sink"]
    if "sparkFiles" in sink:
        sf = sink["sparkFiles"]
        writer = df.writeStream.foreachBatch(flinkish_spark.files_sink(
            sf["path"], uid=sf["uid"], checkpoint=sf["checkpoint"], format=sf.get("format", "parquet"),
            partitionBy=sf.get("partitionBy"), options=sf.get("options"),
        )).option("checkpointLocation", sink["checkpointLocation"])
    elif "foreachBatch" in sink:
        from flinkish_spark.connectors.parquet_sink import ParquetSink
        from flinkish_spark.sink.foreach_batch import transactional

        fb = sink["foreachBatch"]
        options = {k: str(v) for k, v in fb.get("options", {}).items()}
        fb_sink: Any
        if fb.get("kind") == "postgres":  # {kind, uid, checkpoint, url, table, mode?, key?, createTable?, commitMode?}
            from flinkish_spark.connectors.postgres import PostgresSink

            fb_sink = PostgresSink.create(fb["url"], fb["table"], uid=fb["uid"], schema=df.schema, mode=fb.get("mode", "append"),
                                          key=fb.get("key", ""), create_table=bool(fb.get("createTable", False)),
                                          commit_mode=fb.get("commitMode", "auto"))
        else:
            fb_sink = ParquetSink.at(fb["path"], uid=fb["uid"], schema=df.schema, options=options,
                                     rows_per_file=int(fb.get("rowsPerFile", 1_000_000)))
        writer = df.writeStream.foreachBatch(
            transactional(fb_sink, uid=fb["uid"], checkpoint=fb["checkpoint"], storage_options=options)
        ).option("checkpointLocation", sink["checkpointLocation"])
    else:
        writer = df.writeStream.format(sink["format"]).option("checkpointLocation", sink["checkpointLocation"])
        for key, value in sink.get("options", {}).items():
            writer = writer.option(key, str(value))
    trigger = spec.get("trigger", "availableNow")
    writer = writer.trigger(availableNow=True) if trigger == "availableNow" else writer.trigger(processingTime=trigger)
    query = writer.start()
    print("QUERY_STARTED", flush=True)  # for a caller that kills the run at a moment of its choosing
    end = spec.get("end", "finish" if trigger == "availableNow" else "timeout")
    run_seconds = float(spec["runSeconds"]) if "runSeconds" in spec else (None if trigger == "availableNow" else 10.0)
    if end in ("finish", "external"):
        how = flinkish_spark.await_finished(query, timeout=run_seconds)
        if how == "timeout":
            query.stop()
    elif end in ("stop", "drain"):
        batches = int(spec.get("stopAfterBatches", 1))
        while query.isActive and (query.lastProgress is None or query.lastProgress.batchId < batches - 1):
            time.sleep(0.05)
        how = flinkish_spark.stop(query, drain=end == "drain", timeout=run_seconds)
    else:
        deadline = time.time() + (run_seconds or 10.0)
        # "stopWhenExists": end early, gracefully, once the caller creates that file (a test
        # that must keep this run alive exactly as long as it needs, whatever the machine's speed).
        stop_file = spec.get("stopWhenExists")
        while time.time() < deadline and query.isActive and not (stop_file and os.path.exists(stop_file)):
            time.sleep(0.2)
        query.stop()
        how = "terminated"
    print(f"QUERY_END={how}", flush=True)
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m flinkish_spark.runner SPEC.json")
    with open(args[0]) as f:
        run(json.load(f))


if __name__ == "__main__":
    main()
