"""A second live run of the same writeStream query is fenced, whatever the source, with batches
longer than the lease timeout (child driver processes; a Spark-native ``rate`` source).

The sink lease is renewed on the driver before each batch and at each commit, from short-lived
Python workers: a run must be recognised as alive by its own pace, and a run that lost its lease
must not take it back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.runner import child_spec
from flinkish_spark.sink.decisions import DecisionLog

pytestmark = pytest.mark.slow

SPARK_CONCURRENT_RUN = "Multiple streaming queries are concurrently using"


def test_a_second_live_run_with_long_batches_is_fenced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = {
        "source": {"format": "rate", "options": {"rowsPerSecond": 20, "numPartitions": 2}},
        "map": ["flinkish_spark.testing.transforms:slow_tasks"],
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(out), "leaseTimeout": 1}},
        "trigger": "0 seconds",
    }
    env = {**os.environ, "FLINKISH_TASK_SECONDS": "4"}  # each batch lasts > 2 lease timeouts
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    stop = tmp_path / "stop-first"
    (tmp_path / "first.json").write_text(json.dumps(child_spec({**spec, "runSeconds": 400, "stopWhenExists": str(stop)})))
    (tmp_path / "second.json").write_text(json.dumps(child_spec({**spec, "runSeconds": 90})))
    cmd = [sys.executable, "-m", "flinkish_spark.runner"]
    first = subprocess.Popen([*cmd, str(tmp_path / "first.json")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True, env=env)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and len(log.epochs()[1]) < 2 and first.poll() is None:
            time.sleep(0.5)
        assert len(log.epochs()[1]) >= 2, "the first run did not commit"
        second = subprocess.run([*cmd, str(tmp_path / "second.json")], capture_output=True, text=True, timeout=300, env=env)
        text = second.stdout + second.stderr
        assert first.poll() is None, "the first run ended before the second was checked"
        assert second.returncode != 0, text[-3000:]
        # Spark writes offsets/<n> of the second run's first batch before any sink code runs. Started just as
        # the first run committed batch n-1, the second finds offsets/<n> taken by the first (written a moment
        # after commits/<n-1>) and Spark stops it with its own error; otherwise the lease fences it.
        fenced = "FencedError" in text and "is in use by another live run of this query" in text
        assert fenced or SPARK_CONCURRENT_RUN in text, text[-3000:]
        committed = len(log.epochs()[1])
        deadline = time.time() + 120
        while time.time() < deadline and len(log.epochs()[1]) < committed + 2 and first.poll() is None:
            time.sleep(0.5)  # the first run goes on committing
        stop.touch()
        out1, _ = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
    assert first.returncode == 0 and "FencedError" not in out1, out1[-3000:]
    values = sorted(ds.dataset(str(out)).to_table()["value"].to_pylist())
    assert values and values == list(range(len(values)))  # every generated row once: none lost, none twice
