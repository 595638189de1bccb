"""The demo's shop database on its own (``python -m flinkish_spark.demo.shop``, the README's way to try
``flinkish mirror`` by hand): it prints its URL and the command, its writer changes every table, SIGUSR1 (or
Enter in its terminal) pauses and resumes the writer, and Ctrl-C ends writer and server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psycopg

from flinkish_spark.demo import shop


def digest(conn: psycopg.Connection) -> str:
    """Every row of the shop's tables, hashed: equal while nothing writes."""
    return "".join(conn.execute(f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} t")
                   .fetchone()[0] for table in shop.TABLES)


def read_until(proc: subprocess.Popen[str], text: str) -> str:
    assert proc.stdout is not None
    seen = ""
    while text not in seen:
        line = proc.stdout.readline()
        assert line, f"the shop ended before printing {text!r}: {seen}"
        seen += line
    return seen


def test_serve_prints_the_mirror_command_writes_pauses_and_ends_on_ctrl_c() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "flinkish_spark.demo.shop", "--pause", "0.002"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        m = re.search(r"(postgresql://\S+/shop)", first)
        assert m, first + proc.stdout.read()
        url = m[1]
        text = first + read_until(proc, "flinkish mirror --from")
        assert f"kill -USR1 {proc.pid}" in text, text  # how to pause the writer, said where it starts
        assert f"flinkish mirror --from {url} --tables 'public.*' --to ./lake --checkpoint ./mirror-meta" in text
        with psycopg.connect(url, autocommit=True) as conn:
            before = shop.row_counts(conn, shop.TABLES)
            assert before["public.orders"] >= 5000 and before["public.products"] == 300
            shop.add_column(conn)
            shop.create_table(conn)
            deadline = time.time() + 60
            while True:  # the writer goes on, and writes the new column and table too
                tier = conn.execute("SELECT count(tier) FROM customers").fetchone()
                reviews = conn.execute("SELECT count(*) FROM reviews").fetchone()
                if tier and tier[0] > 0 and reviews and reviews[0] > 400:
                    break
                assert time.time() < deadline, "the writer did not write the new column and table"
                time.sleep(0.5)
            os.kill(proc.pid, signal.SIGUSR1)
            read_until(proc, "writer paused")
            still = digest(conn)
            time.sleep(1.0)  # a window in which the running writer makes dozens of transactions
            assert digest(conn) == still
            os.kill(proc.pid, signal.SIGUSR1)
            read_until(proc, "writer resumed")
            deadline = time.time() + 30
            while digest(conn) == still:
                assert time.time() < deadline, "the writer did not resume"
                time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
        assert proc.wait(timeout=60) == 0
        assert "server stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.OperationalError:
        return  # the server is stopped
    raise AssertionError("the server still runs after Ctrl-C")
