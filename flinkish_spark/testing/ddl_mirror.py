"""A mirror workload of statements that change rows without WAL row changes (issue 25), for every target kind.

:data:`SETUP` makes the tables ``d_*`` (a partitioned one among them); :data:`WRITER` changes rows of
every table and, once every table's first snapshot is committed, applies
:data:`STATEMENTS` one by one: ``ADD COLUMN ... DEFAULT``, ``ALTER COLUMN ... TYPE ... USING v * 1000``,
``RENAME COLUMN``, a table dropped and created again under the same name, a partition detached and
one dropped, and a nullable ``ADD COLUMN`` (followed, no re-snapshot); then writes a few seconds more
and ends. :func:`run_ddl_workload` runs it against a mirror and drains the mirror as soon as the writer
has ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

#: The source tables (``public.d_*``); ``p_parts_*`` are partitions, read through ``d_parts``.
TABLES = ["public.d_default", "public.d_type", "public.d_rename", "public.d_swap", "public.d_parts", "public.d_plain"]

SETUP = """
CREATE TABLE d_default (id int PRIMARY KEY, v int);
CREATE TABLE d_type (id int PRIMARY KEY, v int);
CREATE TABLE d_rename (id int PRIMARY KEY, v int, w text);
CREATE TABLE d_swap (id int PRIMARY KEY, v int);
CREATE TABLE d_plain (id int PRIMARY KEY, v int);
CREATE TABLE d_parts (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE p_parts_1 PARTITION OF d_parts FOR VALUES FROM (0) TO (700);
CREATE TABLE p_parts_2 PARTITION OF d_parts FOR VALUES FROM (700) TO (1400);
CREATE TABLE p_parts_3 PARTITION OF d_parts FOR VALUES FROM (1400) TO (MAXVALUE);
INSERT INTO d_default SELECT g, g FROM generate_series(1, 2000) g;
INSERT INTO d_type SELECT g, g FROM generate_series(1, 2000) g;
INSERT INTO d_rename SELECT g, g, 'w' || g FROM generate_series(1, 2000) g;
INSERT INTO d_swap SELECT g, g FROM generate_series(1, 2000) g;
INSERT INTO d_plain SELECT g, g FROM generate_series(1, 2000) g;
INSERT INTO d_parts SELECT g, g FROM generate_series(1, 2000) g;
"""

STATEMENTS = [
    "ALTER TABLE d_default ADD COLUMN c int NOT NULL DEFAULT 5",
    "ALTER TABLE d_type ALTER COLUMN v TYPE bigint USING v * 1000",
    "ALTER TABLE d_rename RENAME COLUMN w TO w2",
    "DROP TABLE d_swap; CREATE TABLE d_swap (id int PRIMARY KEY, v int); "
    "INSERT INTO d_swap SELECT g, -g FROM generate_series(1500, 2600) g",
    "ALTER TABLE d_parts DETACH PARTITION p_parts_1; DROP TABLE p_parts_2",
    "ALTER TABLE d_plain ADD COLUMN n int",
]

#: argv: url, done file, go file. Starts the statements once the go file exists; ends by itself (creating the
#: done file) a few seconds after the last one.
WRITER = r'''
import os, random, sys, time, psycopg
url, done_file, go_file = sys.argv[1], sys.argv[2], sys.argv[3]
STATEMENTS = %r
TABLES = ["d_default", "d_type", "d_rename", "d_swap", "d_parts", "d_plain"]
rnd = random.Random(25)
next_id = 100_000
start, done, end_at = None, 0, None
with psycopg.connect(url, autocommit=True) as conn:
    while end_at is None or time.time() < end_at:
        if start is None and os.path.exists(go_file):
            start = time.time()  # every table's snapshot is committed
        if start is not None and done < len(STATEMENTS) and time.time() - start > 1.5 * done:
            conn.execute(STATEMENTS[done])
            done += 1
            if done == len(STATEMENTS):
                end_at = time.time() + 5
        table, k, op = rnd.choice(TABLES), rnd.randint(1, 2000), rnd.random()
        with conn.transaction():
            if op < 0.6:
                conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %%s", (k,))
            elif op < 0.8:
                conn.execute(f"INSERT INTO {table} (id, v) VALUES (%%s, 1)", (next_id,))
                next_id += 1
            else:
                conn.execute(f"DELETE FROM {table} WHERE id = %%s", (k,))
        time.sleep(0.004)
open(done_file, "w").close()
''' % (STATEMENTS,)


def run_ddl_workload(run_pipeline: Any, spec: Callable[..., dict], url: str, meta: str, uid: str, work_dir: str,
                     timeout: float = 240) -> None:
    """:data:`SETUP`, then :data:`WRITER` while ``spec(end="external")`` runs; as soon as the writer has ended the
    mirror is drained (``request_stop``: a drain waits for the re-snapshots still joining)."""
    import psycopg

    from flinkish_spark.finish.stop_request import request_stop
    from flinkish_spark.io.fileio import FileIO

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
    done_file, go_file = os.path.join(work_dir, "writer-done"), os.path.join(work_dir, "writer-go")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url, done_file, go_file])
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.setdefault("run", run_pipeline(
        spec(end="external", runSeconds=timeout), timeout=timeout + 60)))
    runner.start()
    io = FileIO.for_url(meta)
    try:
        deadline = time.time() + timeout
        # The statements once every table's first snapshot is read and committed (all streaming in the newest
        # registry: a checkpoint names it only at the next epoch).
        while runner.is_alive() and _states(io, meta, uid) != {"streaming": len(TABLES)}:
            assert time.time() < deadline, f"the first snapshot did not end: {_states(io, meta, uid)}"
            time.sleep(0.5)
        open(go_file, "w").close()
        while not os.path.exists(done_file) and runner.is_alive():
            assert time.time() < deadline, "the writer did not end"
            time.sleep(0.5)
        # At once: the drain waits for the re-snapshots still joining (their catalog poll included).
        if runner.is_alive():
            request_stop(io, meta, uid, drain=True)
        runner.join(timeout=timeout)
    finally:
        writer.kill()
        writer.wait(timeout=30)
    run = result.get("run")
    assert run is not None and run.returncode == 0 and "QUERY_END=drained" in run.output, \
        (run.output[-4000:] if run is not None else "no run")


def _states(io: Any, meta: str, uid: str) -> dict[str, int]:
    """How many tables of the newest registry file of source ``uid`` are in each state."""
    from flinkish_spark.checkpoint.layout import join, source_dir
    from flinkish_spark.connectors.cdc import registry

    directory = source_dir(meta, uid)
    names = sorted(n for n in io.list_names(join(directory, registry.FOLDER)) if n.startswith("v"))
    counts: dict[str, int] = {}
    for e in registry.read(io, directory, names[-1]).entries if names else ():
        counts[e.state] = counts.get(e.state, 0) + 1
    return counts
