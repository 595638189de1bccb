"""The ``flinkish mirror`` subcommand's flags (added to the ``flinkish`` parser by :mod:`flinkish_spark.cli`)."""

from __future__ import annotations

import argparse
from typing import Any

from flinkish_spark.errors import ConfigError

USAGE = """flinkish mirror --from postgresql://user@host:5432/db|mysql://user@host:3306/ --tables 'public.*' --to PATH_TEMPLATE
                       --checkpoint URL [--format delta|iceberg|postgres] [--trigger 10s] [--stop-after-snapshot]
                       [--master local[2]|local-cluster[N,C,M]|spark://...|yarn|k8s://... | --remote sc://host:port]
       flinkish mirror pipeline.yaml [--stop-after-snapshot]
       flinkish mirror resnapshot --checkpoint URL [--uid UID] TABLE...
       flinkish mirror compare (the same flags | pipeline.yaml)
       flinkish mirror status --checkpoint URL [--uid UID] [--json]"""
RESNAPSHOT_USAGE = "flinkish mirror resnapshot --checkpoint URL [--uid UID] [--endpoint-url URL] TABLE..."
STATUS_USAGE = "flinkish mirror status --checkpoint URL [--uid UID] [--endpoint-url URL] [--json]"
COMPARE_USAGE = "flinkish mirror compare (--from URL --tables PATTERNS --to TARGETS [--format ...] | pipeline.yaml)"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    m = sub.add_parser(
        "mirror", usage=USAGE,
        help="mirror PostgreSQL (or MySQL/MariaDB) tables into one Delta / Iceberg / PostgreSQL target per table "
             "(flags or a pipeline file)",
        description="Mirror the PostgreSQL tables matching --tables into one target per table, exactly once, with "
                    "live progress. Ctrl-C or SIGTERM stops with drain (a second one: without drain); the same "
                    "command continues from the checkpoint. See docs/mirror.md, 'flinkish mirror'. "
                    "'flinkish mirror resnapshot --help': read tables again while the mirror runs.")
    m.add_argument("pipeline", nargs="?", help="a pipeline file in Flink CDC's YAML shape (instead of the flags)")
    m.add_argument("--from", dest="source", help="the source database, postgresql://user@host:5432/db "
                   "(password: PGPASSWORD, ~/.pgpass or in the URL) or mysql://user@host:3306/ (MYSQL_PWD or in the "
                   "URL; MySQL and MariaDB: docs/mysql-source.md)")
    m.add_argument("--tables", help="names and patterns, e.g. 'public.*, sales.order_*, !public.audit_log' "
                   "(MySQL: database.table, e.g. 'shop.*')")
    m.add_argument("--to", help="the targets: a folder or path template (delta, iceberg: a table template such as "
                   "'mirror.{schema}_{table}'), or postgresql://... (format postgres)")
    m.add_argument("--format", dest="fmt", choices=("delta", "iceberg", "postgres"),
                   help="the target format (default: postgres for a postgresql:// --to, else delta)")
    m.add_argument("--checkpoint", help="the metadata root (local folder or s3://...); keep it for restarts")
    m.add_argument("--trigger", help="how often an epoch is committed, e.g. 10s (default), 1m")
    m.add_argument("--parallelism", type=int, metavar="N", help="tasks an epoch's per-table work runs in, and "
                   "Spark's local[N] (default 2): the changes are spread by table (docs/mirror.md)")
    m.add_argument("--stop-after-snapshot", action="store_true", help="copy the tables as they are and end")
    m.add_argument("--uid", help="names the pipeline's state: slot and publication flinkish_<uid> (default mirror)")
    m.add_argument("--spark-checkpoint", help="Spark's own checkpoint folder (local; default <checkpoint>/spark "
                   "for a local --checkpoint, else a folder under ~/.local/state/flinkish_spark/mirror)")
    m.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a flinkish.postgres / flinkish.mysql source option, e.g. splitSize=50000, serverId=5400 "
                        "(repeatable)")
    m.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a sink option, e.g. catalogUri=... warehouse=... for iceberg (repeatable)")
    m.add_argument("--route", action="append", default=[], metavar="PATTERNS=TARGET",
                   help="a route rule, first match wins: 'shop_*.orders=lake/orders' merges the shards into one "
                        "target (with _source_table); 'sales.*=raw/{table}' gives some tables another template; "
                        "';keys-unique' after it: the shards' keys are unique across them (repeatable; docs/mirror.md, "
                        "'Routes and merged shards')")
    m.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port, e.g. "
                   "9187 (docs/mirror.md, 'Metrics and status'; 'flinkish mirror status': the same figures)")
    m.add_argument("--master", help="the Spark master the pipeline process drives (default local[2]): "
                   "local[N], local-cluster[N,cores,memoryMB], spark://host:7077, yarn, k8s://https://host:443")
    m.add_argument("--remote", metavar="sc://HOST:PORT", help="run the query in this Spark Connect server instead; "
                   "this process is its client (docs/mirror.md, 'On a cluster')")
    m.add_argument("--server-timeout", metavar="SECONDS", help="with --remote: how long a call waits for a server "
                   "that does not answer before the mirror exits 75 to be restarted, e.g. 30s (default 60s)")
    m.add_argument("--verbose", action="store_true", help="Spark's log and the full traces of a failure on the "
                   "terminal (default: in the log file the command names)")
    return m


def resnapshot_parser() -> argparse.ArgumentParser:
    """``flinkish mirror resnapshot``: its own parser (``flinkish mirror`` takes a positional pipeline file,
    so the word is recognised before ``mirror``'s flags are parsed; a pipeline file of that name is
    ``./resnapshot``)."""
    r = argparse.ArgumentParser(
        prog="flinkish mirror resnapshot", usage=RESNAPSHOT_USAGE,
        description="Read tables of a running (or stopped) mirror again, exactly once: the request is recorded "
                    "under --checkpoint and taken by the mirror's next epoch; each target keeps its rows until the "
                    "epoch that ends its table's re-snapshot. See docs/mirror.md, 'Re-snapshot a table on demand'.")
    r.add_argument("tables", nargs="+", metavar="TABLE",
                   help="schema.table names or patterns the mirror follows, e.g. public.orders 'sales.*'")
    r.add_argument("--checkpoint", required=True, help="the mirror's metadata root (its --checkpoint)")
    r.add_argument("--uid", help="the mirror's --uid (default: the one mirror under --checkpoint)")
    r.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    return r


def run_resnapshot(args: argparse.Namespace, io: Any) -> int:
    """Record the request (nothing when a check fails) and say in one line what will happen."""
    from flinkish_spark.connectors.cdc.resnapshot_request import request_resnapshot

    done = request_resnapshot(io, args.checkpoint, args.tables, args.uid, reason="flinkish mirror resnapshot")
    tables = list(done.request.tables)
    named = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    when = "the next epoch" if done.running else "the mirror is not running: when it runs again, its first epoch"
    print(f"resnapshot request {done.request.id} for source uid {done.uid}: {when} starts re-reading {named}; "
          "the target keeps its rows until the epoch that ends the re-snapshot", flush=True)
    return 0


def compare_parser() -> argparse.ArgumentParser:
    """``flinkish mirror compare``: the mirror's own flags (``flinkish mirror`` takes a positional pipeline file,
    so the word is recognised before ``mirror``'s flags are parsed, as ``resnapshot``)."""
    holder = argparse.ArgumentParser(prog="flinkish")
    m = add_parser(holder.add_subparsers())
    m.prog, m.usage = "flinkish mirror compare", COMPARE_USAGE
    m.description = ("Compare every table of a mirror with its target, row by row by primary key: the same flags "
                     "as flinkish mirror, or its pipeline file (--checkpoint only for an Iceberg mirror on the "
                     "embedded catalog). Prints source rows, target rows, missing, extra and different keys per "
                     "table; exit 0 only if every table is equal. Run it on a caught-up mirror. See docs/mirror.md, "
                     "'Read your tables'.")
    return m


def status_parser() -> argparse.ArgumentParser:
    """``flinkish mirror status``: its own parser (recognised before ``mirror``'s flags, as ``resnapshot``)."""
    s = argparse.ArgumentParser(
        prog="flinkish mirror status", usage=STATUS_USAGE,
        description="The status of a running or stopped mirror, from its metadata (no Spark): per table its state, "
                    "rows snapshotted and changes applied; the last committed epoch, the lag, the replication "
                    "slot's WAL, runs and errors -- the figures --metrics-port serves. See docs/mirror.md, "
                    "'Metrics and status'.")
    s.add_argument("--checkpoint", required=True, help="the mirror's metadata root (its --checkpoint)")
    s.add_argument("--uid", help="the mirror's --uid (default: the one mirror under --checkpoint)")
    s.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return s


def run_status(args: argparse.Namespace) -> int:
    from flinkish_spark.mirror.status import mirror_status, render, to_json_text

    options = {"endpointUrl": args.endpoint_url} if args.endpoint_url else {}
    status = mirror_status(args.checkpoint, args.uid, storage_options=options)
    if args.json:
        print(to_json_text(status), flush=True)
    else:
        render(status)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from flinkish_spark.mirror.compare_cli import run_compare as run

    return run(args, config_of)


def config_of(args: argparse.Namespace) -> Any:
    """The :class:`~flinkish_spark.mirror.config.MirrorConfig` the flags describe (nothing started yet)."""
    from flinkish_spark.mirror import config

    if args.pipeline:
        given = [f for f, v in (("--from", args.source), ("--tables", args.tables), ("--to", args.to),
                                ("--format", args.fmt), ("--checkpoint", args.checkpoint), ("--trigger", args.trigger),
                                ("--uid", args.uid), ("--spark-checkpoint", args.spark_checkpoint),
                                ("--source-option", args.source_option), ("--sink-option", args.sink_option),
                                ("--route", getattr(args, "route", None)),
                                ("--master", getattr(args, "master", None)), ("--remote", getattr(args, "remote", None)),
                                ("--server-timeout", getattr(args, "server_timeout", None)),
                                ("--parallelism", args.parallelism)) if v]
        if given:
            raise ConfigError(f"flinkish mirror: {', '.join(given)} cannot be combined with a pipeline file; set "
                              "them in the file (only --stop-after-snapshot may be added)")
        from flinkish_spark.mirror.pipeline_file import from_yaml

        return from_yaml(args.pipeline, stop_after_snapshot=args.stop_after_snapshot)
    return config.from_args(source=args.source, tables=args.tables, to=args.to, fmt=args.fmt,
                            checkpoint=args.checkpoint, trigger=args.trigger,
                            stop_after_snapshot=args.stop_after_snapshot, uid=args.uid,
                            spark_checkpoint=args.spark_checkpoint, source_option=args.source_option,
                            sink_option=args.sink_option, master=getattr(args, "master", None),
                            remote=getattr(args, "remote", None), server_timeout=getattr(args, "server_timeout", None),
                            parallelism=args.parallelism, route=getattr(args, "route", None) or ())


def run_mirror(args: argparse.Namespace) -> int:
    import dataclasses

    from flinkish_spark.mirror.pipeline import supervise

    config = config_of(args)
    port = getattr(args, "metrics_port", None) or config.metrics_port
    return supervise(dataclasses.replace(config, verbose=bool(getattr(args, "verbose", False)), metrics_port=port))
