"""``flinkish demo --pipeline files``: a file pipeline on local Spark and a local S3 server,
killed with SIGKILL in the middle of a commit, restarted, and checked for exactly-once output.

1. starts moto's S3 server on 127.0.0.1 and drops five Parquet files into s3://demo/input/;
2. runs ``flinkish.files`` (bounded, two files per epoch, archive after commit) into the
   two-phase-commit sink ``flinkish.parquet`` at s3://demo/output, metadata on s3://demo/meta,
   in a child driver process that is killed (kill -9 of its whole process group) while the
   second epoch's files are being made visible;
3. restarts the same pipeline from its checkpoints, now under a 10-second processing-time
   trigger: it recovers the decided epoch, reads the last file, and ends by itself right
   after the final commit (Spark alone would keep triggering forever);
4. reads s3://demo/output with pyarrow, checks every row is there exactly once, and prints
   the epochs recorded in the metadata and the archived input.

With ``--remote`` the pipeline runs through Spark Connect: a Connect server in a process of its
own (:mod:`flinkish_spark.embedded.connect`) runs the query, the pipeline process is only its
client, and the kill -9 in step 2 is the *server's* (its JVM and Python workers): the client gives up
on it after ``server_timeout`` (15 s here) with one ``ConnectServerUnavailableError``; step 3
restarts the server and the client.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

FILES = 5
SERVER_TIMEOUT_S = 15.0  # --remote: how long the client waits for its killed server (the default is 60 s)
ROWS_PER_FILE = 1_000


def run(workdir: str, remote: bool = False) -> int:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from rich.console import Console
    from rich.table import Table

    from flinkish_spark.embedded.connect import ConnectServer
    from flinkish_spark.inspect import recent_epochs
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.session import check_java
    from flinkish_spark.faults import ENV_DIR, ENV_POINT
    from flinkish_spark.embedded.s3 import local_s3, make_bucket

    console = Console()
    check_java()
    workdir = os.path.abspath(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    with local_s3() as endpoint, contextlib.ExitStack() as cleanup:
        console.print(f"[bold]1.[/] local S3 server at {endpoint}; {FILES} Parquet files -> s3://demo/input/")
        make_bucket(endpoint, "demo")
        data = FileIO.for_url("s3://demo", {"endpoint_url": endpoint})
        for f in range(FILES):
            ids = list(range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE))
            buf = io.BytesIO()
            pq.write_table(pa.table({"order_id": ids, "amount": [i % 97 for i in ids]}), buf)
            data.write_bytes(f"s3://demo/input/orders-{f}.parquet", buf.getvalue())

        spec = {
            "source": {"format": "flinkish.files", "options": {
                "uid": "orders", "checkpoint": "s3://demo/meta", "endpointUrl": endpoint,
                "path": "s3://demo/input", "bounded": "true", "maxFilesPerTrigger": 2,
                "cleanup": "archive", "archivePath": "s3://demo/archive"}},
            "sink": {"format": "flinkish.parquet", "checkpointLocation": os.path.join(workdir, "spark-checkpoint"),
                     "options": {"uid": "orders-out", "path": "s3://demo/output", "checkpoint": "s3://demo/meta",
                                 "endpointUrl": endpoint, "rowsPerFile": 400}},
        }
        spec_path = os.path.join(workdir, "pipeline.json")
        with open(spec_path, "w") as spec_file:
            json.dump(spec, spec_file, indent=2)

        server = ConnectServer("local[2]") if remote else None
        if server is not None:
            cleanup.callback(server.stop)
        driver = "Connect server" if remote else "driver"

        def pipeline(crash_at: str | None) -> tuple[int, float]:
            run_spec: dict[str, Any] = dict(spec)
            if crash_at is None:
                # The restart: a processing-time trigger, ended by flinkish's finish controller.
                run_spec.update(trigger="3 seconds", end="finish", runSeconds=300)
            crash_env = {ENV_POINT: crash_at, ENV_DIR: workdir} if crash_at else {}
            env = dict(os.environ)
            if server is not None:
                # The crash point fires in one of the server's Python workers; it kills the whole server.
                server.stop()
                server.start(env=crash_env)
                run_spec.update(remote=server.url, serverTimeout=SERVER_TIMEOUT_S)
            else:
                env.update(crash_env)
            with open(spec_path, "w") as spec_file:
                json.dump(run_spec, spec_file, indent=2)
            started = time.time()
            with tempfile.TemporaryFile("w+") as log:
                proc = subprocess.Popen([sys.executable, "-m", "flinkish_spark.runner", spec_path], env=env, stdout=log,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
                died = None
                while proc.poll() is None:
                    if server is not None and not server.running():
                        # The server died under its client, which gives up after SERVER_TIMEOUT_S by itself.
                        died = died or time.time()
                        if time.time() - died > SERVER_TIMEOUT_S + 60:  # never hang the demo
                            os.killpg(proc.pid, signal.SIGKILL)
                    time.sleep(0.2)
                log.seek(0)
                output = log.read()
            if died is not None:
                gave_up.extend(f"{time.time() - died:.1f}s later: {line.strip()}" for line in output.splitlines()
                               if "ConnectServerUnavailableError: " in line)
            rc = proc.returncode
            if server is not None and not server.running():
                rc = server.wait_exit(10) or 0  # the server's end is the "driver" exit the demo reports
            if rc not in (0, -signal.SIGKILL):
                console.print(output[-4000:])
            ended.extend(line.split("=", 1)[1] for line in output.splitlines() if line.startswith("QUERY_END="))
            return rc, time.time() - started

        ended: list[str] = []
        gave_up: list[str] = []

        where = "through a Spark Connect server (its own process)" if remote else "on local Spark"
        console.print(f"[bold]2.[/] running files -> flinkish.parquet {where}; the {driver} is killed "
                      "(SIGKILL) halfway through making epoch 1's files visible")
        rc, took = pipeline("sink.mid_commit:2")
        visible = len([p for p in data.find("s3://demo/output") if p.endswith(".parquet")])
        console.print(f"    {driver} exit: {'killed by SIGKILL' if rc == -signal.SIGKILL else rc} after {took:.1f}s; "
                      f"{visible} output files visible, the rest still staged")
        if rc != -signal.SIGKILL:
            console.print("[red]demo FAILED: the crash did not happen[/]")
            return 1
        if server is not None:
            if not gave_up:
                console.print("[red]demo FAILED: the Connect client did not report its server's death[/]")
                return 1
            console.print(f"    the Connect client gave up on its dead server {gave_up[0]}")

        console.print("[bold]3.[/] restarting the same pipeline from its checkpoints (trigger: every 3 s)")
        rc, took = pipeline(None)
        how = ended[-1] if ended else "?"
        console.print(f"    the query ended by itself ({how}) after its final commit; exit code {rc} in {took:.1f}s")
        if rc != 0 or how != "finished":
            return 1

        table = ds.dataset("demo/output", filesystem=data.fs, format="parquet").to_table()
        ids = table.column("order_id").to_pylist()
        expected = FILES * ROWS_PER_FILE
        exact = len(ids) == expected and len(set(ids)) == expected
        epochs = Table(title="epochs recorded in s3://demo/meta (flinkish inspect)")
        for col in ("checkpoint", "status", "files finished", "files read in epoch"):
            epochs.add_column(col)
        for e in recent_epochs(data, "s3://demo/meta", last=10):
            epochs.add_row(str(e.ckpt_id), e.status, f"{e.splits_finished}/{e.splits_total}", str(e.rows_in_epoch))
        console.print(epochs)
        archived = sorted(p.rsplit("/", 1)[-1] for p in data.find("s3://demo/archive"))
        console.print(f"[bold]4.[/] s3://demo/output holds {len(ids)} rows, {len(set(ids))} distinct "
                      f"(pyarrow); archived after commit: {', '.join(archived)}")
        if not exact:
            console.print(f"[red]demo FAILED: expected {expected} distinct rows exactly once[/]")
            return 1
        if len(archived) != FILES:
            console.print(f"[red]demo FAILED: expected all {FILES} input files archived (final checkpoint notification)[/]")
            return 1
        console.print(f"[green]demo OK[/]: {expected} rows exactly once despite kill -9 mid-commit "
                      f"(pipeline spec: {spec_path})")
    return 0
