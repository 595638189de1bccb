"""``flinkish_spark.session(remote="local[N]")``: a Connect server of the client's own, in a child
process on a free port, gone when the client exits."""

from __future__ import annotations

import socket
from pathlib import Path

import pyarrow.dataset as ds
import pytest

pytestmark = pytest.mark.slow

CLIENT = r"""
import sys
import flinkish_spark

work = sys.argv[1]
spark = flinkish_spark.session(remote="local[2]")
print("PORT", spark.conf.get("spark.connect.grpc.binding.port"), flush=True)
df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/meta")
      .option("rowsPerSplit", "30,20").load())
q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/out")
     .option("checkpointLocation", f"{work}/cp").trigger(availableNow=True).start())
print("END", flinkish_spark.await_finished(q, timeout=240), flush=True)
"""


def test_a_local_remote_session_runs_its_own_server_until_the_client_exits(run_script, tmp_path: Path) -> None:
    done = run_script(CLIENT, str(tmp_path), timeout=400)

    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "END finished" in done.stdout, done.stdout
    assert ds.dataset(str(tmp_path / "out"), format="parquet").count_rows() == 50
    port = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("PORT")))
    with pytest.raises(OSError):  # the client's exit stopped its server
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
