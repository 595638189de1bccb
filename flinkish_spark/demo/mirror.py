"""``flinkish demo`` (``./dev demo``, ``--pipeline mirror``): ``flinkish mirror`` of a database that keeps
changing, into local Delta tables, through a kill -9 mid-commit, a schema change and a new table.

1. starts the embedded PostgreSQL (:mod:`flinkish_spark.embedded.postgres`) and creates the shop's tables
   (:mod:`.shop`: customers, products, orders, a primary key each);
2. starts the writer: small transactions of inserts, updates and deletes on every table;
3. runs ``flinkish mirror --from <url> --tables 'public.*' --to <workdir>/lake/{schema}/{table} --checkpoint
   <workdir>/meta`` as a child process, armed (``FLINKISH_CRASH_AT``, :mod:`flinkish_spark.faults`) to
   SIGKILL its driver between two tables' commits of an epoch: the command exits 137 and says so;
4. runs the same command again: it continues from the checkpoint. While it runs, ``ALTER TABLE customers
   ADD COLUMN tier`` and a new table ``reviews`` -- followed and snapshotted without a restart;
5. stops the writer, then SIGTERM to the command: stop with drain (every change so far committed; slot and
   publication dropped);
6. compares every table with its Delta target (:mod:`flinkish_spark.mirror.compare`) and prints the result;
   exit 0 only if all are equal.

The server runs in a temporary folder and is removed at the end; the Delta tables, the checkpoint and the
logs stay in ``workdir``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

#: The crash point and the hit that kills the driver: the third epoch that changes more than one table,
#: after the first table's commit and before the next one's (:mod:`flinkish_spark.connectors.delta.routed`).
CRASH_AT = "sink.between_tables:3"
TRIGGER = "1s"
SINK_UID = "mirror_sink"  # flinkish mirror's default --uid is 'mirror'; its sink's uid is '<uid>_sink'
WAIT_S = 300.0
_PROGRESS = re.compile(r"^epoch (\d+): tables snapshotted (\d+)/(\d+)")


def flinkish_command() -> list[str]:
    """The ``flinkish`` console script of this interpreter (what a user runs), or ``python -m`` of the CLI."""
    script = os.path.join(os.path.dirname(sys.executable), "flinkish")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "flinkish_spark.cli"]


class MirrorRun:
    """One ``flinkish mirror`` process: its output to a log file, progress lines echoed, and kept to wait on."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: str, echo: Callable[[str], None]) -> None:
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.log_path = log_path
        self._echo = echo
        # A session of its own, as a shell gives a command: the demo's signals reach it only when sent.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        self._pump = threading.Thread(target=self._read, name="mirror-output", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self.lines.append(line.rstrip("\n"))
                if line.startswith(("epoch ", "flinkish mirror:")):
                    self._echo(line.rstrip("\n"))

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def epochs(self) -> list[tuple[int, int, int]]:
        """(epoch, tables snapshotted, tables) of each progress line so far."""
        return [(int(m[1]), int(m[2]), int(m[3])) for m in map(_PROGRESS.match, list(self.lines)) if m]

    def said(self, text: str) -> str | None:
        """The first line holding ``text``."""
        return next((ln for ln in list(self.lines) if text in ln), None)

    def wait_for(self, check: Callable[[], bool], timeout: float = WAIT_S) -> bool:
        """Until ``check()``; False when the command ended or the time ran out first."""
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.3)
        return True

    def wait(self, timeout: float = WAIT_S) -> int | None:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._pump.join(timeout=10)
        return rc

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.lines[-lines:])

    def stop_now(self) -> None:
        """End the command whatever it does: SIGTERM (drain), again (at once), a third time (the command kills
        its pipeline), then SIGKILL."""
        for _ in range(3):
            if self.proc.poll() is not None:
                return
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _target_epochs(lake: str) -> dict[str, int | None]:
    """The epoch each Delta target below ``lake/<schema>/<table>`` holds of the mirror's sink (its txn)."""
    from flinkish_spark.connectors.delta.table import deltalake

    dl = deltalake()
    out: dict[str, int | None] = {}
    for schema in sorted(os.listdir(lake)) if os.path.isdir(lake) else []:
        for table in sorted(os.listdir(os.path.join(lake, schema))):
            with contextlib.suppress(Exception):
                out[f"{schema}.{table}"] = dl.DeltaTable(os.path.join(lake, schema, table)).transaction_version(SINK_UID)
    return out


def run(workdir: str) -> int:
    import shutil

    import psycopg
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from flinkish_spark.demo import shop
    from flinkish_spark.embedded.postgres import temporary_postgres
    from flinkish_spark.faults import ENV_DIR, ENV_PGID, ENV_POINT
    from flinkish_spark.mirror.compare import compare_delta
    from flinkish_spark.session import check_java

    console = Console()
    began = time.monotonic()
    check_java()
    workdir = os.path.abspath(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    lake, meta, crash_dir = (os.path.join(workdir, d) for d in ("lake", "meta", "crash"))
    os.makedirs(crash_dir)

    def echo(line: str) -> None:
        console.print(f"    [dim]| {escape(line)}[/]", highlight=False)

    def failed(text: str, run: MirrorRun | None = None) -> int:
        if run is not None:
            console.print(f"[dim]{escape(run.tail())}[/]  (the whole log: {run.log_path})", highlight=False)
        console.print(f"[red]demo FAILED[/]: {text}")
        return 1

    with temporary_postgres("flinkish-demo-postgres-") as pg, contextlib.ExitStack() as cleanup:
        url, counts = shop.create_database(pg)
        console.print(f"[bold]1.[/] embedded PostgreSQL {pg.version} at {url}: "
                      + ", ".join(f"{t} ({n} rows)" for t, n in counts.items()) + ", a primary key each")

        stop_writer = os.path.join(workdir, "stop-writer")
        writer = subprocess.Popen([sys.executable, "-m", "flinkish_spark.demo.shop", "writer", url, stop_writer],
                                  stdout=subprocess.PIPE, text=True)

        def end_writer() -> None:
            open(stop_writer, "w").close()
            try:
                writer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                writer.kill()
                writer.wait()

        cleanup.callback(end_writer)
        console.print("[bold]2.[/] a writer changes every table: small transactions of inserts, updates and deletes")

        target = os.path.join(lake, "{schema}", "{table}")  # the mirror's --to, and what compare reads
        args = ["mirror", "--from", url, "--tables", "public.*", "--to", target,
                "--checkpoint", meta, "--trigger", TRIGGER, "--source-option", "discoveryInterval=1"]
        cmd = [*flinkish_command(), *args]
        shown = shlex.join(["flinkish", *args])
        env = {k: v for k, v in os.environ.items() if k not in (ENV_POINT, ENV_DIR, ENV_PGID)}

        def start(n: int, extra: dict[str, str]) -> MirrorRun:
            run = MirrorRun(cmd, {**env, **extra}, os.path.join(workdir, f"mirror-{n}.log"), echo)
            cleanup.callback(run.stop_now)
            return run

        # soft_wrap: the command stays on one line (to copy it), also in a pipe, where rich cuts at 80 columns
        console.print(f"[bold]3.[/] {escape(shown)}", highlight=False, soft_wrap=True)
        console.print(f"    its driver armed to die by SIGKILL between two tables' commits of an epoch "
                      f"({ENV_POINT}={CRASH_AT})", highlight=False)
        run1 = start(1, {ENV_POINT: CRASH_AT, ENV_DIR: crash_dir})
        rc = run1.wait()
        if rc != 128 + signal.SIGKILL:
            return failed(f"expected the command to exit 137 (driver killed), got {rc}", run1)
        if run1.said("the pipeline's driver was killed") is None:
            return failed("the command did not say that its driver was killed", run1)
        console.print(f"    flinkish mirror exit {rc} after {run1.seconds:.1f}s: its driver was killed by SIGKILL "
                      "mid-commit", highlight=False)
        held = _target_epochs(lake)
        newest = max((v for v in held.values() if v is not None), default=None)
        console.print("    the epoch each Delta table holds: "
                      + ", ".join(f"{t} {'-' if v is None else v}" for t, v in held.items())
                      + f" -- killed after the first table's commit of epoch {newest}", highlight=False)

        console.print("[bold]4.[/] the same command again: it continues from the checkpoint")
        run2 = start(2, {})
        if not run2.wait_for(lambda: len(run2.epochs()) >= 1):
            return failed("the restarted mirror committed no epoch", run2)
        with psycopg.connect(url, autocommit=True) as conn:
            done = [shop.add_column(conn), shop.create_table(conn)]
        console.print(f"    while it runs: {escape('; '.join(done))}", highlight=False)
        mark = len(run2.epochs())
        if not run2.wait_for(lambda: any(s == t == 4 for _, s, t in run2.epochs()[mark:])):
            return failed("the new table was not snapshotted", run2)
        mark = len(run2.epochs())
        if not run2.wait_for(lambda: len(run2.epochs()) >= mark + 3):
            return failed("the mirror stopped committing epochs", run2)

        end_writer()
        out = writer.stdout.read() if writer.stdout else ""
        made = next((json.loads(ln[len(shop.COUNTS_PREFIX):]) for ln in out.splitlines()
                     if ln.startswith(shop.COUNTS_PREFIX)), None)
        if made:
            console.print(f"[bold]5.[/] writer stopped after {made['transactions']} transactions ({made['inserts']} "
                          f"rows inserted, {made['updates']} updated, {made['deletes']} deleted); SIGTERM to "
                          "flinkish mirror: stop with drain")
        else:
            console.print("[bold]5.[/] writer stopped; SIGTERM to flinkish mirror: stop with drain")
        run2.proc.send_signal(signal.SIGTERM)
        rc = run2.wait()
        if rc != 0 or run2.said("flinkish mirror: drained") is None:
            return failed(f"expected a drain (exit 0), got {rc}", run2)
        console.print(f"    exit 0 after {run2.seconds:.1f}s in all")

        results = compare_delta(url, "public.*", target)
        table = Table(title="public.* of the shop database against the Delta tables")
        for col, justify in (("table", "left"), ("source rows", "right"), ("target rows", "right"),
                             ("result", "left")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in results:
            table.add_row(r.table, str(r.source_rows), "-" if r.target_rows is None else str(r.target_rows),
                          "[green]OK[/]" if r.equal else f"[red]DIFF[/] {escape(r.summary())}")
        console.print("[bold]6.[/] compared row by row (flinkish_spark.mirror.compare):")
        console.print(table)
        if len(results) != len(shop.TABLES) + 1 or not all(r.equal for r in results):
            return failed("a table differs from its source")
        console.print(f"[green]demo OK[/]: {len(results)} tables equal to their source after a kill -9 mid-commit, "
                      f"a new column and a new table, in {time.monotonic() - began:.0f}s (Delta tables: {lake})")
    return 0
