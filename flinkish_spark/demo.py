"""The demo behind ``flinkish demo``: a bounded file pipeline on local Spark with metadata on a local S3 server.

1. starts moto's S3 server on 127.0.0.1 and drops five Parquet files into s3://demo/input/;
2. runs ``flinkish.files`` (bounded, two files per epoch, archive after commit) into
   Spark's Parquet sink under ``WORKDIR/output``, checkpoint metadata on s3://demo/meta;
3. restarts the same query from its checkpoints: nothing is read again;
4. prints the epochs from the metadata, the rows in the sink and the archived files.
"""

from __future__ import annotations

import io
import os
import shutil
import time

FILES = 5
ROWS_PER_FILE = 1_000


def run_demo(workdir: str) -> int:
    from rich.console import Console
    from rich.table import Table

    import pyarrow as pa
    import pyarrow.parquet as pq

    from flinkish_spark.inspect import recent_epochs
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.testing.s3 import local_s3, make_bucket

    console = Console()
    workdir = os.path.abspath(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    with local_s3() as endpoint:
        console.print(f"[bold]1.[/] local S3 server at {endpoint}; writing {FILES} Parquet files to s3://demo/input/")
        make_bucket(endpoint, "demo")
        data_io = FileIO.for_url("s3://demo", {"endpoint_url": endpoint})
        for f in range(FILES):
            ids = list(range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE))
            buf = io.BytesIO()
            pq.write_table(pa.table({"order_id": ids, "amount": [i % 97 for i in ids]}), buf)
            data_io.write_bytes(f"s3://demo/input/orders-{f}.parquet", buf.getvalue())

        import flinkish_spark

        console.print("[bold]2.[/] starting local Spark (local[2])")
        spark = flinkish_spark.session(app_name="flinkish-demo")
        spark.sparkContext.setLogLevel("ERROR")
        output, cp = os.path.join(workdir, "output"), os.path.join(workdir, "spark-checkpoint")

        def run_once() -> float:
            df = (
                spark.readStream.format("flinkish.files")
                .option("uid", "orders")
                .option("checkpoint", "s3://demo/meta")
                .option("endpointUrl", endpoint)
                .option("path", "s3://demo/input")
                .option("bounded", "true")
                .option("maxFilesPerTrigger", "2")
                .option("cleanup", "archive")
                .option("archivePath", "s3://demo/archive")
                .load()
            )
            started = time.time()
            query = (
                df.writeStream.format("parquet")
                .option("path", output)
                .option("checkpointLocation", cp)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            return time.time() - started

        took = run_once()
        rows = spark.read.parquet(output).count()
        console.print(f"    first run: {rows} rows in the sink in {took:.1f}s")

        console.print("[bold]3.[/] restarting the same query from its checkpoints")
        run_once()
        again = spark.read.parquet(output).count()
        console.print(f"    after restart: {again} rows (nothing read twice)")

        table = Table(title="epochs recorded in s3://demo/meta (flinkish inspect)")
        for col in ("checkpoint", "status", "files finished", "files read in epoch"):
            table.add_column(col)
        for e in recent_epochs(data_io, "s3://demo/meta", last=10):
            table.add_row(str(e.ckpt_id), e.status, f"{e.splits_finished}/{e.splits_total}", str(e.rows_in_epoch))
        console.print(table)
        archived = sorted(p.rsplit("/", 1)[-1] for p in data_io.find("s3://demo/archive"))
        left = data_io.find("s3://demo/input")
        console.print(f"[bold]4.[/] archived after commit: {', '.join(archived)}; left in input: {len(left)}")
        spark.stop()
        expected = FILES * ROWS_PER_FILE
        if rows != expected or again != expected:
            console.print(f"[red]demo FAILED: expected {expected} rows, got {rows} then {again}[/]")
            return 1
        console.print(f"[green]demo OK[/]: {expected} rows exactly once; output in {output}")
    return 0
