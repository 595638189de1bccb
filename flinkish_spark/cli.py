"""The ``flinkish`` command: ``demo`` (a real pipeline on local Spark and a local S3 server)
and ``inspect`` (what a checkpoint metadata root says, as a table or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from flinkish_spark.errors import FlinkishError


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from flinkish_spark.inspect import recent_epochs
    from flinkish_spark.io.fileio import FileIO, storage_options_from

    options = {"endpointUrl": args.endpoint_url} if args.endpoint_url else {}
    io = FileIO.for_url(args.checkpoint, storage_options_from(options, args.checkpoint), what="CHECKPOINT")
    epochs = recent_epochs(io, args.checkpoint.rstrip("/"), last=args.last)
    if args.json:
        print(json.dumps({"checkpoint": args.checkpoint, "sources": [e.to_json() for e in epochs]}, indent=2))
        return 0
    table = Table(title=f"flinkish checkpoint {args.checkpoint}")
    for col in ("source uid", "kind", "checkpoint", "status", "splits finished", "rows in epoch", "position total"):
        table.add_column(col)
    for e in epochs:
        table.add_row(e.uid, e.kind, str(e.ckpt_id), e.status, f"{e.splits_finished}/{e.splits_total}", str(e.rows_in_epoch), str(e.position_total))
    # Piped output (scripts, logs) is not cut to 80 columns.
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from flinkish_spark.demo import run_demo

    return run_demo(args.workdir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flinkish", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="show the recent epochs of every source under a metadata root")
    p.add_argument("checkpoint", help="the metadata root URL (the sources' 'checkpoint' option)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--last", type=int, default=5, help="epochs per source (default 5)")
    p.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    p.set_defaults(func=_inspect)

    d = sub.add_parser("demo", help="run a real pipeline on local Spark and a local S3 server")
    d.add_argument("--workdir", default="demo-output", help="where the demo writes (default ./demo-output)")
    d.set_defaults(func=_demo)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FlinkishError as exc:
        print(f"flinkish: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
