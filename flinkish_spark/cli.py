"""The ``flinkish`` command: ``mirror`` (a PostgreSQL database into one Delta / Iceberg / PostgreSQL
target per table, see :mod:`flinkish_spark.mirror`; ``mirror resnapshot`` reads tables of a mirror
again), ``demo`` (a real pipeline killed with SIGKILL mid-commit, restarted and checked -- by
default ``flinkish mirror`` of an embedded PostgreSQL into local Delta tables, see
:mod:`flinkish_spark.demo`), ``inspect`` (what a checkpoint metadata root says, as a table or
JSON), ``stop`` (stop a running query at an epoch boundary, with or without drain, from any
process) and ``orphans`` (staged sink output that a crash left behind)."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
import traceback
from typing import TYPE_CHECKING, NoReturn, Sequence

from flinkish_spark.errors import FlinkishError

if TYPE_CHECKING:
    from flinkish_spark.io.fileio import FileIO


#: ``flinkish --help``'s text (the module docstring is reST for the API docs; a terminal gets plain text).
DESCRIPTION = """flinkish_spark's command line: mirror PostgreSQL tables into Delta / Iceberg / PostgreSQL targets
(flinkish mirror; flinkish mirror compare checks them), look into and stop running queries, clean up after crashes.
'flinkish COMMAND --help' describes each command; docs/mirror.md the mirror."""


def _add_checkpoint(p: argparse.ArgumentParser, help: str) -> None:
    """The metadata root as a positional argument (as before) or ``--checkpoint`` (as ``mirror`` and ``orphans``
    spell it): either works, one is required."""
    p.add_argument("checkpoint_pos", nargs="?", metavar="CHECKPOINT", help=help + " (or --checkpoint CHECKPOINT)")
    p.add_argument("--checkpoint", dest="checkpoint_opt", metavar="CHECKPOINT", help="the same as CHECKPOINT")


def _checkpoint_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    pos, opt = args.checkpoint_pos, args.checkpoint_opt
    if pos and opt and pos != opt:
        parser.error(f"two metadata roots: {pos!r} and --checkpoint {opt!r}; give one")
    if not (pos or opt):
        parser.error("the metadata root is missing: give it as CHECKPOINT or --checkpoint CHECKPOINT")
    args.checkpoint = pos or opt


def _root_io(args: argparse.Namespace, url: str, what: str) -> "FileIO":
    from flinkish_spark.io.fileio import FileIO, storage_options_from

    options = {"endpointUrl": args.endpoint_url} if args.endpoint_url else {}
    return FileIO.for_url(url, storage_options_from(options, url), what=what)


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from flinkish_spark.inspect import (
        postgres_not_followed, postgres_slots, postgres_tables, recent_epochs, sink_epochs, sink_targets,
    )

    root = args.checkpoint.rstrip("/")
    io = _root_io(args, args.checkpoint, "CHECKPOINT")
    epochs = recent_epochs(io, root, last=args.last)
    sinks = sink_epochs(io, root, last=args.last)
    slots = postgres_slots(io, root)
    pg_tables = postgres_tables(io, root)
    targets = sink_targets(io, root)
    if args.json:
        print(json.dumps({"checkpoint": args.checkpoint, "sources": [e.to_json() for e in epochs],
                          "sinks": [e.to_json() for e in sinks], "sinkTargets": targets,
                          "postgres_slots": [s.to_json() for s in slots], "postgres_tables": pg_tables,
                          "postgres_not_followed": postgres_not_followed(io, root)}, indent=2))
        return 0
    # Piped output (scripts, logs) is not cut to 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"flinkish checkpoint {args.checkpoint}: sources")
    for col in ("source uid", "kind", "checkpoint", "status", "splits finished", "read in epoch", "position"):
        table.add_column(col)
    for e in epochs:
        table.add_row(e.uid, e.kind, str(e.ckpt_id), e.status, f"{e.splits_finished}/{e.splits_total}", e.read_in_epoch,
                      e.position)
    console.print(table)
    if sinks:
        st = Table(title="sinks (two-phase commit)")
        for col in ("sink uid", "epoch", "commit state", "committables"):
            st.add_column(col)
        for s in sinks:
            st.add_row(s.uid, str(s.epoch), s.state, str(s.committables))
        console.print(st)
    for uid, t in targets.items():
        details = ", ".join(f"{k}={v}" for k, v in t.items() if v not in (None, [], "") and k != "sink")
        console.print(f"sink uid {uid}: {t.get('sink', '?')} {details}")
    if slots:
        pt = Table(title="PostgreSQL replication slots")
        for col in ("source uid", "slot", "confirmed", "WAL held back", "note"):
            pt.add_column(col)
        for p in slots:
            held = "" if p.wal_held_back_bytes is None else f"{p.wal_held_back_bytes / 2**20:.1f} MiB"
            pt.add_row(p.uid, p.slot, p.confirmed_lsn or "", held, p.note)
        console.print(pt)
    for uid, counts in pg_tables.items():
        console.print(f"source uid {uid}: tables " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    for uid, left_out in postgres_not_followed(io, root).items():
        for text in left_out.values():
            console.print(f"source uid {uid}: warning: {text}", markup=False)
    return 0


def _stop(args: argparse.Namespace) -> int:
    import time
    import uuid

    from flinkish_spark.errors import ConfigError
    from flinkish_spark.finish.stop_request import read_request, request_stop
    from flinkish_spark.inspect import running_source_uids

    root = args.checkpoint.rstrip("/")
    io = _root_io(args, args.checkpoint, "CHECKPOINT")
    uids = args.uid or running_source_uids(io, root)
    if not uids:
        raise ConfigError(f"no running flinkish source under {root} (no live lease): nothing to stop")
    request_id = uuid.uuid4().hex[:12]
    for uid in uids:
        request_stop(io, root, uid, args.drain, request_id)
    print(f"stop request {request_id} ({'drain' if args.drain else 'no drain'}) sent to {', '.join(uids)}", flush=True)
    if args.no_wait:
        return 0
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        reqs = [read_request(io, root, uid) for uid in uids]
        if all(r is not None and r.id == request_id and r.state == "done" for r in reqs):
            outcome = next(r.outcome for r in reqs if r is not None)
            print(f"query ended: {outcome}")
            return 0
        time.sleep(0.2)
    print(f"flinkish: the query did not end within {args.timeout}s (is it running with "
          "flinkish_spark.register(spark)?); the request stays in place", file=sys.stderr)
    return 1


def _orphans(args: argparse.Namespace) -> int:
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.orphans import remove, scan

    if args.path.startswith(("postgresql://", "postgres://")):
        return _pg_orphans(args)
    data_io = _root_io(args, args.path, "PATH")
    meta_io = _root_io(args, args.checkpoint, "--checkpoint")
    entries = scan(data_io, args.path, DecisionLog(meta_io, args.checkpoint.rstrip("/"), args.uid))
    removed = remove(data_io, entries, include_pending=args.include_pending) if args.delete else []
    if args.json:
        print(json.dumps({"staged": [e.__dict__ for e in entries], "removed": [e.path for e in removed]}, indent=2))
        return 0
    for e in entries:
        print(f"{e.state:8} epoch {e.epoch:>6}  {e.path}")
    _orphan_summary([e.state for e in entries], len(removed), args.delete, "", "remove")
    return 0


def _orphan_summary(states: list[str], removed: int, deleted: bool, where: str, verb: str) -> None:
    """The closing lines of ``flinkish orphans``: counts per state, and the hint to delete."""
    counts = {s: states.count(s) for s in ("orphan", "pending", "decided")}
    print(f"{where}{counts['orphan']} orphan, {counts['pending']} pending (newest undecided epochs), "
          f"{counts['decided']} awaiting recovery; removed {removed}")
    if not deleted and counts["orphan"]:
        print(f"run again with --delete to {verb} the orphans")


def _pg_orphans(args: argparse.Namespace) -> int:
    """``flinkish orphans postgresql://...``: a flinkish.postgres sink's prepared transactions and staged rows."""
    from flinkish_spark.connectors.postgres.connection import parse_url
    from flinkish_spark.connectors.postgres.orphans import remove, scan
    from flinkish_spark.sink.decisions import DecisionLog

    conn = parse_url(args.path, args.password_env, what="URL")
    meta_io = _root_io(args, args.checkpoint, "--checkpoint")
    entries = scan(conn, DecisionLog(meta_io, args.checkpoint.rstrip("/"), args.uid))
    removed = remove(conn, entries, include_pending=args.include_pending) if args.delete else []
    if args.json:
        print(json.dumps({"database": conn.masked, "leftovers": [e.__dict__ for e in entries],
                          "removed": [e.name for e in removed]}, indent=2))
        return 0
    for e in entries:
        rows = f" ({e.rows} rows)" if e.rows is not None else ""
        print(f"{e.state:8} epoch {e.epoch:>6}  {e.kind:8} {e.name}{rows}")
    _orphan_summary([e.state for e in entries], len(removed), args.delete, f"{conn.masked}: ", "roll back / delete")
    return 0


def _mirror(args: argparse.Namespace) -> int:
    from flinkish_spark.mirror.cli import run_mirror

    return run_mirror(args)


def _resnapshot(args: argparse.Namespace) -> int:
    from flinkish_spark.mirror.cli import run_resnapshot

    return run_resnapshot(args, _root_io(args, args.checkpoint, "--checkpoint"))


def _demo(args: argparse.Namespace) -> int:
    from flinkish_spark.demo import run_demo

    return run_demo(args.workdir, remote=args.remote, pipeline=args.pipeline)


def _jvm_archive(args: argparse.Namespace) -> int:
    from flinkish_spark.jvm_archive import build
    from flinkish_spark.session import java_executable

    path = build(java_executable())
    if path is None:
        print("flinkish: no JVM class archive was built (see the warning above); Spark starts without one",
              file=sys.stderr)
        return 1
    print(path)
    return 0


def _mirror_status_args(argv: list[str]) -> argparse.Namespace:
    """``flinkish mirror status ...`` (a word before mirror's positional pipeline file, as resnapshot)."""
    from flinkish_spark.mirror.cli import run_status, status_parser

    args = status_parser().parse_args(argv)
    args.func = run_status
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Words before mirror's positional pipeline file: `flinkish mirror resnapshot|compare|status ...`.
    if argv[:2] == ["mirror", "resnapshot"]:
        from flinkish_spark.mirror.cli import resnapshot_parser

        args = resnapshot_parser().parse_args(argv[2:])
        args.func = _resnapshot
    elif argv[:2] == ["mirror", "compare"]:
        from flinkish_spark.mirror.cli import compare_parser, run_compare

        args = compare_parser().parse_args(argv[2:])
        args.func = run_compare
    elif argv[:2] == ["mirror", "status"]:
        args = _mirror_status_args(argv[2:])
    else:
        args = _parser().parse_args(argv)
        if getattr(args, "checkpoint_parser", None) is not None:
            _checkpoint_of(args, args.checkpoint_parser)
    try:
        return int(args.func(args))
    except FlinkishError as exc:
        print(f"flinkish: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    from flinkish_spark import __version__

    parser = argparse.ArgumentParser(prog="flinkish", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flinkish {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="show the recent epochs of every source under a metadata root",
                       description="Show what a checkpoint metadata root says: the newest epochs of every source "
                                   "(status, splits finished; for flinkish.postgres the snapshot chunks, the WAL "
                                   "read and the LSN reached), the sinks' two-phase commits, the targets they "
                                   "recorded and the replication slots with the WAL they hold back. Read only.")
    _add_checkpoint(p, "the metadata root URL (the sources' and sinks' 'checkpoint' option, flinkish mirror's "
                       "--checkpoint)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--last", type=int, default=5, help="epochs per source (default 5)")
    p.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    p.set_defaults(func=_inspect, checkpoint_parser=p)

    s = sub.add_parser("stop", help="stop the query running on a metadata root at an epoch boundary",
                       description="Ask the query running on a metadata root to stop at its next epoch boundary, "
                                   "from any process (a file under the root; the query polls it). Without --drain "
                                   "the query stops resumable (flinkish mirror: the same command continues); with "
                                   "--drain the sources end their input and the query finishes for good. Waits "
                                   "for the query to end unless --no-wait.")
    _add_checkpoint(s, "the metadata root URL of the query's sources")
    s.add_argument("--drain", action="store_true", help="end the input (sources become FINISHED), flush event-time windows, then stop")
    s.add_argument("--uid", action="append", help="only these source uids (default: every running source under CHECKPOINT)")
    s.add_argument("--no-wait", action="store_true", help="return after sending the request")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the query to end (default 300)")
    s.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    s.set_defaults(func=_stop, checkpoint_parser=s)

    o = sub.add_parser("orphans", help="list (and --delete) staged files of a flinkish.parquet sink, or prepared transactions and staged rows of a flinkish.postgres sink, that no commit will use")
    o.add_argument("path", help="the sink's 'path', or a flinkish.postgres sink's 'url' (postgresql://...)")
    o.add_argument("--uid", required=True, help="the sink's uid")
    o.add_argument("--checkpoint", required=True, help="the sink's metadata root (default of the sink: <checkpointLocation>/flinkish)")
    o.add_argument("--delete", action="store_true", help="remove the orphans")
    o.add_argument("--include-pending", action="store_true", help="with --delete: also remove staged files of the newest undecided epochs (only when the query is stopped for good)")
    o.add_argument("--json", action="store_true")
    o.add_argument("--password-env", help="flinkish.postgres: a variable holding the password (default: the URL's, or PGPASSWORD)")
    o.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    o.set_defaults(func=_orphans)

    from flinkish_spark.mirror.cli import add_parser as add_mirror_parser

    add_mirror_parser(sub).set_defaults(func=_mirror)

    d = sub.add_parser("demo", help="run a real pipeline, kill -9 it mid-commit, restart it and check the result "
                       "(default: flinkish mirror of an embedded PostgreSQL into local Delta tables)")
    d.add_argument("--pipeline", choices=("mirror", "files"),
                   help="mirror (default): flinkish mirror of a changing PostgreSQL database into local Delta tables; "
                        "files: files on a local S3 server into the two-phase-commit Parquet sink")
    d.add_argument("--workdir", default="demo-output", help="where the demo writes (default ./demo-output)")
    d.add_argument("--remote", action="store_true",
                   help="the files demo through Spark Connect: a local Connect server in its own process, killed in "
                        "step 2 (implies --pipeline files)")
    d.set_defaults(func=_demo)

    j = sub.add_parser("jvm-archive", help="build the class archive that makes local Spark drivers of this interpreter start faster (once per Java and Spark; ~1 min)",
                       description="Build a JVM class-data-sharing archive of Spark's classes for this Java and "
                                   "pyspark (~1 min, once); local Spark drivers started by flinkish_spark then "
                                   "start faster. Prints the archive's path; exit 1 if none could be built.")
    j.set_defaults(func=_jvm_archive)
    return parser


def entry() -> NoReturn:
    """The ``flinkish`` command: :func:`main`, then an exit that skips native teardown.

    Why: pyarrow's (and delta-rs') native thread pools can still be alive while CPython finalizes
    the interpreter; their destructors then call ``std::terminate`` and a command that did all its
    work dies with SIGABRT (exit -6; apache/arrow#34314; seen once in CI on ``mirror resnapshot``).
    So the command waits for its own threads (as Python's exit does: after its threading hooks, which end
    idle thread-pool workers), runs the ``atexit`` handlers (logging, pyspark's gateway), flushes its output
    and leaves with ``os._exit``: nothing native is torn down.
    """
    code: int
    try:
        code = main()
    except SystemExit as exc:  # argparse's usage errors and --help
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 -- printed as Python would, then the same clean exit
        traceback.print_exc()
        code = 1
    # What CPython's own exit does first, in its order: the threading atexit hooks -- concurrent.futures' ends
    # the idle workers of every executor nobody shut down (pyiceberg's shared one), after their queued work --
    # then it waits for the non-daemon threads. Joining the threads without the hooks waits for ever.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:  # not in any CPython this package supports (3.10-3.13 have it)
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`flinkish ... | head`): nothing left to say
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
