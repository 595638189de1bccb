"""Random kill -9 of the driver, restarted until the query ends by itself: exactly once?

A black-box check as a user would run it: the pipeline below uses the public API only
(``flinkish_spark.session``, ``readStream.format``, ``writeStream.format("flinkish.parquet")``,
``await_finished``), with data and metadata on moto's S3 server (``AWS_ENDPOINT_URL``) and
Spark's checkpointLocation on local disk. The harness starts it, kills the driver with
SIGKILL at a random moment (``--kill process``: only the Python driver, whose JVM then
dies on its own; ``--kill group``: driver, JVM and workers at once), restarts it, and
repeats until a run exits by itself. Then it reads the output with pyarrow and counts
duplicates, missing rows and staged leftovers.

    python benchmarks/random_kill.py [--rounds 2] [--kills 6] [--master local[2]]
           [--kinds sequence,files] [--kill process,group] [--seed 7]

Pipelines: ``sequence`` = a bounded ``flinkish.sequence`` (3 splits, 8,700 rows, 400 rows per
epoch); ``files`` = ``flinkish.files`` over 9 Parquet files (2 per epoch, archived after
commit). Both under a 1-second processing-time trigger into ``flinkish.parquet``.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

LENGTHS = [3000, 5000, 700]
FILES, ROWS_PER_FILE = 9, 500


def child(work: str, master: str, kind: str) -> int:
    """The user's pipeline: public API only; S3 endpoint and credentials from the environment."""
    import flinkish_spark

    spark = flinkish_spark.session(master=master, app_name="random-kill")
    spark.sparkContext.setLogLevel("ERROR")
    reader = spark.readStream.format(f"flinkish.{kind}").option("uid", kind).option("checkpoint", "s3://chaos/meta")
    if kind == "sequence":
        reader = reader.option("rowsPerSplit", ",".join(map(str, LENGTHS))).option("maxRowsPerTrigger", "400")
    else:
        reader = (reader.option("path", "s3://chaos/in").option("bounded", "true").option("maxFilesPerTrigger", "2")
                  .option("cleanup", "archive").option("archivePath", "s3://chaos/archive"))
    query = (reader.load().writeStream.format("flinkish.parquet").option("uid", "out")
             .option("path", "s3://chaos/out").option("rowsPerFile", "170")
             .option("checkpoint", "s3://chaos/sinkmeta").option("checkpointLocation", os.path.join(work, "cp"))
             .trigger(processingTime="1 second").start())
    end = flinkish_spark.await_finished(query)
    print(f"QUERY_END={end}", flush=True)
    return 0 if end == "finished" else 3


def one_round(master: str, kind: str, kill: str, kills: int, rng: random.Random) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    import s3fs

    from flinkish_spark.embedded.s3 import local_s3, make_bucket, reset

    work = tempfile.mkdtemp(prefix="flinkish-random-kill-")
    started = time.time()
    with local_s3() as endpoint:
        reset(endpoint)  # moto keeps its buckets per process, not per server: start empty
        make_bucket(endpoint, "chaos")
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        if kind == "files":
            for f in range(FILES):
                with fs.open(f"chaos/in/f{f}.parquet", "wb") as fh:
                    pq.write_table(pa.table({"id": list(range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE))}), fh)
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint)
        attempts, outcome = 0, "gave up"
        while attempts < kills + 5:
            attempts += 1
            with open(os.path.join(work, f"run-{attempts}.log"), "w") as log:
                proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", work, master, kind],
                                        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                kill_at = rng.uniform(3, 40) if attempts <= kills else None
                t0 = time.time()
                while proc.poll() is None:
                    if kill_at is not None and time.time() - t0 > kill_at:
                        if kill == "group":
                            os.killpg(proc.pid, signal.SIGKILL)
                        else:
                            os.kill(proc.pid, signal.SIGKILL)
                        break
                    if time.time() - t0 > 600:
                        os.killpg(proc.pid, signal.SIGKILL)
                        break
                    time.sleep(0.05)
                rc = proc.wait()
            if rc == 0:
                outcome = "finished"
                break
        table = ds.dataset("chaos/out", filesystem=fs, format="parquet").to_table()
        if kind == "sequence":
            got = collections.Counter(zip(table["split"].to_pylist(), table["seq"].to_pylist()))
            want = collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))
            archived = None
        else:
            got = collections.Counter(table["id"].to_pylist())
            want = collections.Counter(range(FILES * ROWS_PER_FILE))
            archived = len(fs.find("chaos/archive"))
        staged = [p for p in fs.find("chaos/out") if p.endswith(".staged")]
    if outcome == "finished":
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"round did not finish; logs kept in {work}", flush=True)
    return {
        "kind": kind, "master": master, "kill": kill, "kills": min(kills, attempts - 1), "attempts": attempts,
        "outcome": outcome, "seconds": round(time.time() - started, 1), "rows": sum(got.values()),
        "expected": sum(want.values()), "duplicates": sum(v - 1 for v in got.values() if v > 1),
        "missing": sum((want - got).values()), "staged_left": len(staged), "archived": archived,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(*sys.argv[2:5]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2, help="rounds per (kind, kill mode)")
    ap.add_argument("--kills", type=int, default=6, help="random kills per round before a run may finish")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--kinds", default="sequence,files")
    ap.add_argument("--kill", default="process,group")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    rng = random.Random(args.seed)
    results = []
    for kind in args.kinds.split(","):
        for kill in args.kill.split(","):
            for _ in range(args.rounds):
                r = one_round(args.master, kind, kill, args.kills, rng)
                print(r, flush=True)
                results.append(r)
    headers = ["pipeline", "master", "kill -9 of", "kills", "outcome", "s until done", "rows", "duplicates", "missing", "staged left", "archived"]
    rows = [[r["kind"], r["master"], r["kill"], r["kills"], r["outcome"], r["seconds"], f"{r['rows']}/{r['expected']}",
             r["duplicates"], r["missing"], r["staged_left"], "-" if r["archived"] is None else f"{r['archived']}/{FILES}"]
            for r in results]
    print_table(headers, rows)
    bad = [r for r in results if r["outcome"] != "finished" or r["duplicates"] or r["missing"] or r["staged_left"]]
    print(f"\n{len(results) - len(bad)}/{len(results)} rounds exactly once; median {statistics.median(r['seconds'] for r in results):.0f} s per round")
    name = "random_kill" if args.master == "local[2]" else "random_kill_" + "".join(c if c.isalnum() else "_" for c in args.master).strip("_")
    print(f"results: {write_results(name, {'master': args.master, 'seed': args.seed, 'rounds': results})}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
