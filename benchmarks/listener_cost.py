"""What the finish controller's progress events cost the driver JVM: built from JSON
(flinkish_spark/finish/listener_events.py) or copied field by field (PySpark's own listener).

    .venv/bin/python benchmarks/listener_cost.py [--runs 3] [--events 60]

Each run is a fresh process (a fresh driver JVM): ``flinkish.sequence`` -> ``noop`` under
AvailableNow with ``--events`` micro-batches, the controller registered by ``register()``.
Variants alternate (pyspark, json, pyspark, json, ...). Reported: the driver JVM's CPU seconds
from ``/proc/<pid>/stat`` over the query (CPU hardly depends on what else the machine runs,
wall time does) and the wall time; writes ``benchmarks/results/listener_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import print_table, write_results

CHILD = r"""
import json, os, sys, tempfile, time
variant, events = sys.argv[1], int(sys.argv[2])
import flinkish_spark
from flinkish_spark.finish.controller import FinishController
if variant == "pyspark":
    from pyspark.sql.streaming import StreamingQueryListener
    FinishController._jlistener = StreamingQueryListener._jlistener  # PySpark's field-by-field copy
spark = flinkish_spark.session(app_name="listener-cost")
spark.sparkContext.setLogLevel("ERROR")
pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
d = tempfile.mkdtemp()
c0, t0 = cpu(), time.monotonic()
df = (spark.readStream.format("flinkish.sequence").option("uid", "s").option("checkpoint", d + "/meta")
      .option("rowsPerSplit", f"{events * 10},{events * 10}").option("maxRowsPerTrigger", "20").load())
q = df.writeStream.format("noop").option("checkpointLocation", d + "/cp").trigger(availableNow=True).start()
q.awaitTermination()
time.sleep(2)  # the listener thread handles the last events
print(json.dumps({"variant": variant, "jvm_cpu_s": round(cpu() - c0, 2), "wall_s": round(time.monotonic() - t0, 1),
                  "progress_events": len(q.recentProgress)}))
spark.stop()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--events", type=int, default=60)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        for _ in range(args.runs):
            for variant in ("pyspark", "json"):
                out = subprocess.run([sys.executable, script, variant, str(args.events)], capture_output=True,
                                     text=True, timeout=900)
                if out.returncode != 0:
                    raise SystemExit(out.stderr[-3000:])
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(runs[-1], flush=True)
    print_table(["variant", "driver JVM CPU s", "wall s", "progress events"],
                [[r["variant"], r["jvm_cpu_s"], r["wall_s"], r["progress_events"]] for r in runs])
    med = {v: statistics.median(r["jvm_cpu_s"] for r in runs if r["variant"] == v) for v in ("pyspark", "json")}
    print(f"median driver JVM CPU s: pyspark copy {med['pyspark']}, json {med['json']}")
    print("wrote", write_results("listener_cost", {"events": args.events, "runs": runs, "median_jvm_cpu_s": med}))


if __name__ == "__main__":
    main()
