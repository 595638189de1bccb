"""``flinkish_spark.session(remote="local[N]")``: a Connect server of the client's own, in a child
process on a free port, gone when the client exits; its streaming queries share its Python daemons."""

from __future__ import annotations

import socket
from pathlib import Path

import pyarrow.dataset as ds
import pytest

pytestmark = pytest.mark.slow

CLIENT = r"""
import os
import sys
import flinkish_spark

def python_daemons():
    # pyspark.daemon processes below this process (its server's JVM starts them)
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(pid))
        except OSError:
            pass
    found, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if b"pyspark.daemon" in f.read():
                        found.add(child)
            except OSError:
                pass
    return found

work = sys.argv[1]
spark = flinkish_spark.session(remote="local[2]")
print("PORT", spark.conf.get("spark.connect.grpc.binding.port"), flush=True)
print("ISOLATION", spark.conf.get("spark.sql.artifact.isolation.enabled"), flush=True)
daemons = []
for run in ("a", "b"):
    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/meta-{run}")
          .option("rowsPerSplit", "30,20").load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/out-{run}")
         .option("checkpointLocation", f"{work}/cp-{run}").trigger(availableNow=True).start())
    print("END", flinkish_spark.await_finished(q, timeout=240), flush=True)
    daemons.append(python_daemons())
print("NEW DAEMONS", len(daemons[1] - daemons[0]), "OF", len(daemons[0]), flush=True)
"""


def test_a_local_remote_session_runs_its_own_server_until_the_client_exits(run_script, tmp_path: Path) -> None:
    done = run_script(CLIENT, str(tmp_path), timeout=400)

    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.count("END finished") == 2, done.stdout
    for run in ("a", "b"):
        assert ds.dataset(str(tmp_path / f"out-{run}"), format="parquet").count_rows() == 50
    # The second query runs on the Python daemons of the first (Spark's per-query artifact
    # isolation off), instead of starting its own four.
    assert "ISOLATION false" in done.stdout, done.stdout
    new, known = (int(n) for n in done.stdout.split("NEW DAEMONS")[1].split()[::2])
    assert known >= 4 and new == 0, done.stdout
    port = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("PORT")))
    with pytest.raises(OSError):  # the client's exit stopped its server
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
