"""flinkish.sequence -> PostgreSQL: flinkish.postgres (prepared, staged) vs Spark's JDBC writer vs raw COPY.

Same rows (split int, seq long, ts timestamp), 10 epochs, Trigger.AvailableNow, local[2],
into the embedded PostgreSQL (flinkish_spark.embedded.postgres) on the same machine:

* ``flinkish.postgres commitMode=prepared`` (append): each task's rows by binary COPY (ADBC),
  PREPARE TRANSACTION, the driver's COMMIT PREPARED;
* ``flinkish.postgres commitMode=staged`` (append): COPY into the staging table, then one
  driver transaction INSERT ... SELECT + DELETE;
* Spark's JDBC writer: ``df.write.jdbc(...)`` inside foreachBatch (at-least-once; batched
  INSERTs, with the driver's ``reWriteBatchedInserts=true``). It needs the PostgreSQL JDBC
  driver jar: ``--jar PATH`` (default: ~/.m2/repository/org/postgresql/postgresql/42.7.13/...);
  get it with ``mvn dependency:get -Dartifact=org.postgresql:postgresql:42.7.13`` or from
  https://jdbc.postgresql.org/download/. Without it that row is skipped with a message;
* raw COPY: one Python process, the same rows as one Arrow table, ADBC binary COPY in one
  transaction (no Spark): the ceiling for this server.

Then the commit alone: one epoch (rows/10, two partitions) prepared through the sink API and
its ``commit()`` timed, per mode.

    python benchmarks/postgres_sink.py [--rows 10000000] [--repeats 1] [--url postgresql://...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

EPOCHS = 10
DEFAULT_JAR = os.path.expanduser("~/.m2/repository/org/postgresql/postgresql/42.7.13/postgresql-42.7.13.jar")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--url", help="a PostgreSQL to use instead of a fresh embedded one (libpq URI)")
    ap.add_argument("--jar", default=DEFAULT_JAR, help="PostgreSQL JDBC driver jar for the Spark JDBC baseline")
    args = ap.parse_args()

    import psycopg
    import pyarrow as pa

    import flinkish_spark
    from flinkish_spark.connectors.postgres import PostgresSink
    from flinkish_spark.connectors.postgres.connection import adbc_connect, parse_url
    from flinkish_spark.sink.protocol import PrepareContext

    work = tempfile.mkdtemp(prefix="flinkish-bench-pg-")
    server = None
    url = args.url
    if url is None:
        from flinkish_spark.embedded.postgres import start_postgres

        server = start_postgres(f"{work}/pgdata")
        url = server.uri
    jar = args.jar if os.path.exists(args.jar) else None
    if jar is None:
        print(f"Spark JDBC row skipped: no PostgreSQL JDBC jar at {args.jar} (pass --jar; see this script's docstring)")
    conf = {"spark.jars": jar} if jar else {}
    spark = flinkish_spark.session(app_name="bench-postgres-sink", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    half = args.rows // 2

    def sql(text: str):  # type: ignore[no-untyped-def]
        with psycopg.connect(url, autocommit=True) as c:
            cur = c.execute(text)
            return cur.fetchall() if cur.description else None

    def fresh_table() -> None:
        sql("DROP TABLE IF EXISTS bench; DROP TABLE IF EXISTS flinkish_commits; "
            "CREATE TABLE bench (split integer, seq bigint, ts timestamptz)")
        for (name,) in sql("SELECT tablename FROM pg_tables WHERE tablename LIKE 'flinkish_staging%'"):
            sql(f'DROP TABLE "{name}"')
        sql("CHECKPOINT")

    warm = {"on": False}  # warm-up runs (JVM classes, Python workers, ADBC) write EPOCHS * 1000 rows

    def total() -> int:
        return EPOCHS * 1000 if warm["on"] else 2 * half

    def sequence_df(tag: str):  # type: ignore[no-untyped-def]
        return (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/{tag}/meta")
                .option("rowsPerSplit", str(total() // 2)).option("maxRowsPerTrigger", str(total() // EPOCHS)).load())

    def timed(writer, tag: str) -> float:  # type: ignore[no-untyped-def]
        fresh_table()
        started = time.perf_counter()
        q = writer.option("checkpointLocation", f"{work}/{tag}/cp").trigger(availableNow=True).start()
        flinkish_spark.await_finished(q)
        took = time.perf_counter() - started
        assert q.exception() is None, q.exception()
        n = sql("SELECT count(*) FROM bench")[0][0]
        assert n == total(), (tag, n)
        shutil.rmtree(f"{work}/{tag}", ignore_errors=True)
        return took

    def flinkish_pg(mode: str):  # type: ignore[no-untyped-def]
        def run(tag: str) -> float:
            return timed(sequence_df(tag).writeStream.format("flinkish.postgres").option("uid", "out").option("url", url)
                         .option("table", "public.bench").option("commitMode", mode), tag)
        return run

    def spark_jdbc(tag: str) -> float:
        jdbc_url = "jdbc:postgresql://" + url.split("@", 1)[1].split("?")[0] + "?reWriteBatchedInserts=true"
        user = url.split("://", 1)[1].split("@", 1)[0].split(":")[0]

        def write(df, batch_id):  # type: ignore[no-untyped-def]
            df.write.jdbc(jdbc_url, "bench", mode="append", properties={"user": user, "driver": "org.postgresql.Driver",
                                                                        "batchsize": "10000"})

        return timed(sequence_df(tag).writeStream.foreachBatch(write), tag)

    def raw_copy(tag: str) -> float:
        fresh_table()
        seq = pa.array(range(half), pa.int64())
        ts = pa.array(range(1_704_067_200_000_000, 1_704_067_200_000_000 + half * 1_000_000, 1_000_000), pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        table = pa.concat_tables([pa.table({"split": pa.array([k] * half, pa.int32()), "seq": seq, "ts": ts}) for k in (0, 1)])
        started = time.perf_counter()
        conn = adbc_connect(parse_url(url))
        with conn.cursor() as cur:
            cur.adbc_ingest("bench", table, mode="append")
        conn.commit()
        conn.close()
        took = time.perf_counter() - started
        assert sql("SELECT count(*) FROM bench")[0][0] == 2 * half
        return took

    pipelines = {
        "flinkish.postgres commitMode=prepared": flinkish_pg("prepared"),
        "flinkish.postgres commitMode=staged": flinkish_pg("staged"),
    }
    if jar:
        pipelines["Spark JDBC writer in foreachBatch (at-least-once)"] = spark_jdbc
    pipelines["raw COPY, one process (ADBC, no Spark)"] = raw_copy
    warm["on"] = True
    for name, fn in pipelines.items():
        if fn is not raw_copy:
            fn(f"warm-{abs(hash(name)) % 1000}")
    warm["on"] = False
    times: dict[str, list[float]] = {name: [] for name in pipelines}
    for i in range(args.repeats):
        for name, fn in pipelines.items():
            times[name].append(fn(f"run{i}-{len(times[name])}-{abs(hash(name)) % 1000}"))
            print(f"{name}: {times[name][-1]:.2f} s", flush=True)

    # The commit alone, per mode: one epoch of rows/EPOCHS rows in two partitions.
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType, TimestampType

    schema = StructType([StructField("split", IntegerType()), StructField("seq", LongType()), StructField("ts", TimestampType())])
    per_epoch = args.rows // EPOCHS
    commit_ms: dict[str, list[float]] = {}
    for mode in ("prepared", "staged"):
        fresh_table()
        commit_ms[mode] = []
        sink = PostgresSink.create(url, "public.bench", uid="commitbench", schema=schema, commit_mode=mode)  # type: ignore[arg-type]
        for epoch in range(3):
            prepared = []
            for part in (0, 1):
                n = per_epoch // 2
                batch = pa.RecordBatch.from_pydict({
                    "split": pa.array([part] * n, pa.int32()), "seq": pa.array(range(n), pa.int64()),
                    "ts": pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC"))})
                c = sink.prepare(iter([batch]), PrepareContext("commitbench", epoch, part, 0))
                assert c is not None
                prepared.append(c)
            started = time.perf_counter()
            assert sink.commit(prepared, epoch) == "COMMITTED"
            commit_ms[mode].append((time.perf_counter() - started) * 1000)
    spark.stop()
    if server is not None:
        server.stop()
    shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.rows / v for k, v in med.items()}
    prepared_rate = rate["flinkish.postgres commitMode=prepared"]
    rows = [[k, f"{med[k]:.2f}", f"{rate[k]:,.0f}", f"{prepared_rate / rate[k]:.2f}x", " ".join(f"{t:.2f}" for t in v)]
            for k, v in times.items()]
    print_table(["pipeline", "median s", "rows/s", "prepared rows/s over this", "runs (s)"], rows)
    print(f"\ncommit of one {per_epoch:,}-row epoch (2 partitions), median of 3: "
          + ", ".join(f"{m} {statistics.median(v):.0f} ms" for m, v in commit_ms.items()))
    ratios = {
        "prepared_vs_jdbc": (prepared_rate / rate["Spark JDBC writer in foreachBatch (at-least-once)"]) if jar else None,
        "raw_copy_vs_prepared": rate["raw COPY, one process (ADBC, no Spark)"] / prepared_rate,
        "prepared_vs_staged": prepared_rate / rate["flinkish.postgres commitMode=staged"],
    }
    print("targets: prepared >= 2x JDBC: " + (f"{ratios['prepared_vs_jdbc']:.2f}x" if jar else "n/a (no jar)")
          + f"; raw COPY <= 1.5x prepared: {ratios['raw_copy_vs_prepared']:.2f}x; staged within 2x of prepared: "
          f"{ratios['prepared_vs_staged']:.2f}x")
    print(f"results: {write_results('postgres_sink', {'rows': args.rows, 'epochs': EPOCHS, 'seconds': times, 'median_seconds': med, 'rows_per_second': rate, 'ratios': ratios, 'commit_ms_per_epoch': commit_ms, 'epoch_rows': per_epoch})}")


if __name__ == "__main__":
    main()
