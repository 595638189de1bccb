"""The workload whose classes go into the driver JVM's class archive (see :mod:`flinkish_spark.jvm_archive`).

Run only in the child process that :func:`flinkish_spark.jvm_archive.build` starts: a
session with the flinkish sources, one small streaming query, one batch read. Its JVM
writes the classes it loaded when it exits; :func:`dump` returns only after that exit.
"""

from __future__ import annotations

import tempfile

import flinkish_spark


def dump(target: str) -> None:
    """Run what a flinkish driver runs -- a session, the sources, a streaming query -- and let the JVM write its classes."""
    spark = flinkish_spark.session(app_name="flinkish-jvm-archive",
                                   conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={target}"})
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="flinkish-jvm-archive-") as work:
        df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/meta")
              .option("rowsPerSplit", "200,200").option("maxRowsPerTrigger", "100").load())
        query = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/out")
                 .option("checkpointLocation", f"{work}/cp").trigger(availableNow=True).start())
        flinkish_spark.await_finished(query, timeout=300)
        spark.read.parquet(f"{work}/out").count()
    gateway = spark.sparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    # The JVM writes the archive when it exits, which it does once its stdin closes: wait for
    # it here, so that the caller never takes a half-written file for a finished one.
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=300)
