"""``flinkish mirror``'s configuration: command-line flags or a pipeline file -> one frozen :class:`MirrorConfig`.

Two ways in, one result, for a PostgreSQL or a MySQL/MariaDB source (``--from mysql://...``: the
``flinkish.mysql`` source, ``tables`` as ``database.table`` patterns, ``{schema}`` in a target template the
database):

* flags: ``--from postgresql://...|mysql://... --tables 'public.*' --to PATH_TEMPLATE [--format ...]
  --checkpoint URL [--trigger 10s] [--stop-after-snapshot]`` (:func:`from_args`);
* a pipeline file in Flink CDC 3's YAML shape -- ``source`` (``type: postgres``, ``hostname`` /
  ``port`` / ``username`` / ``password`` / ``database-name`` or ``url``, ``tables``; ``type: mysql`` with
  Flink CDC's MySQL pipeline connector keys, :mod:`flinkish_spark.mirror.mysql_options`), ``sink``
  (``type: delta|iceberg|postgres`` and the sink's options), ``route`` (rules: ``source-table``,
  ``sink-table``, ``replace-symbol``: :mod:`flinkish_spark.mirror.route_rules`; the flag ``--route``) and ``pipeline`` (``name``, ``checkpoint``, ``trigger``, ...)
  (:func:`flinkish_spark.mirror.pipeline_file.from_yaml`).

Where it runs (:mod:`flinkish_spark.mirror.cluster`): ``--master URL`` / ``pipeline.master`` (a local or
cluster Spark driven from the pipeline process) or ``--remote sc://host:port`` / ``pipeline.remote``
(a Spark Connect server runs the query; the pipeline process is its client). Local paths are made
absolute here: executors and a Connect server resolve a relative path against their own folder.

Guarantees: every unknown key and bad value -- also an option that has no meaning for the source's
database, such as a replication slot's for MySQL -- is refused here with one :class:`ConfigError`
naming the key and the fix -- before a Spark session, a connection or a file exists. A
password (in a URL, a ``password`` key) is split off into :attr:`MirrorConfig.source_password`
/ :attr:`MirrorConfig.sink_password`, which no ``repr``, error, JSON form or option carries:
the pipeline hands it to the connectors through an environment variable (``passwordEnv``),
as a Python user would. The options the pipeline passes (:meth:`MirrorConfig.source_options`,
:meth:`MirrorConfig.sink_options`) are the ones of the public API: the command is a thin layer.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Sequence, cast

from flinkish_spark.errors import ConfigError

Format = Literal["delta", "iceberg", "postgres"]
FORMATS: tuple[Format, ...] = ("delta", "iceberg", "postgres")
#: The source's database: ``flinkish.postgres`` or ``flinkish.mysql`` (MySQL and MariaDB).
Source = Literal["postgres", "mysql"]
#: Whether ``flinkish mirror`` can start the source's Spark query (False: configured and preflighted, then refused
#: with one line saying so, :func:`flinkish_spark.mirror.pipeline.supervise`). MySQL: the ``flinkish.mysql`` source
#: on the CDC core (issue 29), tested end to end by tests/mirror/test_mysql_preflight.py.
SOURCE_READY: dict[Source, bool] = {"postgres": True, "mysql": True}
#: Environment variables the pipeline puts the passwords in (named by the connectors' ``passwordEnv``).
SOURCE_PASSWORD_ENV = "FLINKISH_MIRROR_SOURCE_PASSWORD"
SINK_PASSWORD_ENV = "FLINKISH_MIRROR_SINK_PASSWORD"
DEFAULT_UID = "mirror"
DEFAULT_TRIGGER_S = 10.0
#: The mirror's ``maxRowsPerTrigger`` unless given (the source itself has none): an epoch reads at most this many
#: snapshot rows (``maxRowsPerTrigger // splitSize`` chunks: 2 of the default 100,000 rows) or about this many
#: change messages. Without it the whole snapshot is one epoch: nothing committed -- nothing on screen -- until
#: every table is read, and one epoch as large as the database to write, commit and, after a crash, replay.
DEFAULT_MAX_ROWS_PER_TRIGGER = 200_000
#: The mirror's ``snapshotRowsPerTrigger`` unless given (or ``maxRowsPerTrigger`` is): this many snapshot rows per second
#: of the trigger interval, at least :data:`DEFAULT_MAX_ROWS_PER_TRIGGER`. An epoch of 200,000 rows took ~2 s on two
#: cores (benchmarks/mirror_snapshot.py) and a processing-time trigger starts the next one only at the next interval:
#: with the default 10 s a snapshot read 20,000 rows/s, the cores idle 80% of the time.
SNAPSHOT_ROWS_PER_TRIGGER_SECOND = 100_000
#: ... and at most this many: a sink task holds its share of an epoch's rows in memory while it prepares.
SNAPSHOT_ROWS_PER_TRIGGER_MAX = 1_000_000

#: The sink tasks of an epoch (and ``local[N]``) unless given: the cores of a small machine.
DEFAULT_PARALLELISM = 2

_STORAGE = ("endpointUrl", "region", "storageOptions")
#: Options of every routing sink a mirror may set: the storage ones and keepSparkCheckpoint (a copy of Spark's
#: checkpoint with the metadata also for a local --checkpoint, e.g. a shared folder a new machine sees).
#: Also each table's shape (mode/deletes/tableModes: :mod:`flinkish_spark.mirror.shapes`), its columns and rows
#: chosen (transforms: :mod:`flinkish_spark.connectors.lakehouse.transform.rules`) and the route rules.
_COMMON_SINK = (*_STORAGE, "keepSparkCheckpoint", "mode", "deletes", "tableModes", "trackHistoryColumns",
                "trackHistoryColumns.except", "transforms", "routes", "keysUniqueAcrossShards")
#: Options of the flinkish.postgres source a mirror may set besides url/tables (their own names).
SOURCE_OPTIONS = ("splitSize", "maxRowsPerTrigger", "snapshotRowsPerTrigger", "snapshotPartitions", "discoveryInterval", "heartbeatInterval",
                  "rowFormat", "decodeIn", "spreadChanges", "slotName", "publication", "onSlotLost", "passwordEnv", "startup")
#: Flink CDC's names for some of them (a pipeline file may use either).
SOURCE_FLINK_NAMES = {"slot.name": "slotName", "scan.incremental.snapshot.chunk.size": "splitSize",
                      "scan.startup.mode": "startup"}
#: Flink CDC's ``scan.startup.mode`` values -> the source's ``startup``.
STARTUP_MODES = {"initial": "snapshotThenChanges", "snapshot": "snapshot", "latest-offset": "changes"}
#: Options each routing sink accepts from a mirror (the target option and uid/checkpoint are the mirror's).
SINK_OPTIONS: dict[Format, tuple[str, ...]] = {
    "delta": ("createTable", "checkpointInterval", "compactEvery", "commitProcesses", "rowsPerFile", "targetFileSize",
              "mergeMode", *_COMMON_SINK),
    "iceberg": ("catalog", "catalogUri", "catalogName", "warehouse", "createTable", "rowsPerFile", "targetFileSize",
                "retainSnapshots", "compactEvery", "mergeMode", *_COMMON_SINK),
    "postgres": ("createTable", "lockTimeout", "passwordEnv", "keepSparkCheckpoint", "mode", "deletes", "tableModes",
                 "trackHistoryColumns", "trackHistoryColumns.except", "transforms", "routes", "keysUniqueAcrossShards"),
}
#: The sink option that names the targets, with ``{schema}`` / ``{table}``.
TARGET_OPTION: dict[Format, str] = {"delta": "path", "iceberg": "table", "postgres": "table"}
_ROUTE_KIND: dict[Format, str] = {"delta": "path", "iceberg": "iceberg", "postgres": "postgres"}
_UID = re.compile(r"^[a-z0-9_]{1,40}$")
_TRIGGER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "mins": 60,
           "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600}


@dataclass(frozen=True)
class MirrorConfig:
    """Everything ``flinkish mirror`` runs with. Passwords are fields without ``repr`` and never in :meth:`to_json`."""

    uid: str  # the source's uid; the sink's is ``<uid>_sink``; the slot and publication ``flinkish_<uid>``
    name: str  # shown in the progress view
    source_url: str  # postgresql:// (libpq) or mysql:// URL without a password
    tables: str
    format: Format
    target: str  # the sink's target option with {schema}/{table}
    checkpoint: str  # the metadata root (fsspec URL)
    spark_checkpoint: str  # Spark's checkpointLocation (a local folder)
    trigger_s: float = DEFAULT_TRIGGER_S
    stop_after_snapshot: bool = False
    master: str = "local[2]"
    #: a Spark Connect server (``sc://host:port``) that runs the query; None: a Spark driver in the pipeline process
    remote: str | None = None
    #: how long a call waits for a Connect server that does not answer before the mirror exits (--remote only)
    server_timeout_s: float | None = None
    #: Tasks an epoch's per-table work runs in (:mod:`flinkish_spark.mirror.spread`); also the local master's cores.
    parallelism: int = DEFAULT_PARALLELISM
    verbose: bool = False  # Spark's log and the full traces on the terminal instead of in :attr:`log_file`
    metrics_port: int | None = None  # serve Prometheus metrics on this port (mirror.metrics)
    source_extra: tuple[tuple[str, str], ...] = ()
    sink_extra: tuple[tuple[str, str], ...] = ()  # for postgres also ("url", ...) without password
    #: the source's database (``--from postgresql://`` / ``mysql://``, ``source.type``); its Spark source flinkish.<kind>
    source_kind: Source = "postgres"
    source_password: str | None = field(default=None, repr=False)
    sink_password: str | None = field(default=None, repr=False)

    @property
    def source_format(self) -> str:
        return f"flinkish.{self.source_kind}"

    @property
    def log_file(self) -> str:
        """The pipeline's log (Spark's own, the full traces of a failure): beside Spark's checkpoint, on this machine.
        Under ``--remote`` Spark's checkpoint is the server's: beside the default one (``<checkpoint>/spark.log`` for
        a local ``--checkpoint``, else in this machine's state folder)."""
        if self.remote is not None:
            return default_spark_checkpoint(self.checkpoint, self.uid).rstrip("/") + ".log"
        return self.spark_checkpoint.rstrip("/") + ".log"

    @property
    def sink_uid(self) -> str:
        return f"{self.uid}_sink"

    @property
    def sink_format(self) -> str:
        return f"flinkish.{self.format}"

    def source_options(self) -> dict[str, str]:
        """The ``flinkish.postgres`` / ``flinkish.mysql`` source options (what ``spark.readStream.option(...)`` gets)."""
        opts = {"uid": self.uid, "checkpoint": self.checkpoint, "url": self.source_url, "tables": self.tables,
                **dict(self.source_extra)}
        if self.source_password is not None and "passwordEnv" not in opts:
            opts["passwordEnv"] = SOURCE_PASSWORD_ENV
        if self.stop_after_snapshot:
            opts["startup"] = "snapshot"
        if "maxRowsPerTrigger" not in opts:  # a bound the user gives holds for the snapshot too
            opts.setdefault("snapshotRowsPerTrigger", str(
                max(DEFAULT_MAX_ROWS_PER_TRIGGER,
                    min(SNAPSHOT_ROWS_PER_TRIGGER_MAX, int(SNAPSHOT_ROWS_PER_TRIGGER_SECOND * self.trigger_s)))))
        opts.setdefault("maxRowsPerTrigger", str(DEFAULT_MAX_ROWS_PER_TRIGGER))
        rules = dict(self.sink_extra).get("transforms")
        if rules and self.source_kind == "postgres":
            # The rules written once: the columns they leave out are never read either (source.columns).
            opts.setdefault("transforms", rules)
        if self.format in ("delta", "iceberg"):
            # Packed rows (rows.packed): typed Arrow per table, no JSON through Spark; the PostgreSQL routed sink
            # stages JSON and keeps the JSON shape (exact for values Arrow cannot hold, e.g. NaN in a numeric).
            opts.setdefault("rowFormat", "arrow")
            if self.source_kind == "postgres" and opts["rowFormat"] == "arrow":
                # The changes typed by the sink tasks, not all by the one reading the slot: what spreads with
                # --parallelism, and faster with one task too (the read and the typing in two processes).
                opts.setdefault("decodeIn", "sink")
        if self.source_kind == "postgres" and self.parallelism > 1 and opts.get("decodeIn") == "sink":
            # The change range read by the driver (which bounds it: the server decodes it once) and handed to the
            # sink tasks by table, without a shuffle (source.spread_read); the snapshot's chunks in as many tasks.
            opts.setdefault("spreadChanges", str(self.parallelism))
            opts.setdefault("snapshotPartitions", str(self.parallelism))
        return opts

    def spread_in_source(self) -> bool:
        """Whether the source hands the changes to the sink tasks by table itself (no shuffle: :mod:`.spread`)."""
        return int(self.source_options().get("spreadChanges", "1")) > 1

    def sink_options(self) -> dict[str, str]:
        """The routing sink's options (what ``writeStream.option(...)`` gets), without checkpointLocation."""
        opts = {"uid": self.sink_uid, "checkpoint": self.checkpoint, TARGET_OPTION[self.format]: self.target,
                **dict(self.sink_extra)}
        if self.sink_password is not None and "passwordEnv" not in opts:
            opts["passwordEnv"] = SINK_PASSWORD_ENV
        return opts

    def password_env(self) -> dict[str, str]:
        """The environment variables that carry the passwords to the connectors (driver and executors)."""
        out = {}
        if self.source_password is not None:
            out[self.source_options()["passwordEnv"]] = self.source_password
        if self.sink_password is not None:
            out[self.sink_options()["passwordEnv"]] = self.sink_password
        return out

    def to_json(self) -> str:
        """Everything but the passwords (for the pipeline's own process)."""
        d = asdict(self)
        d.pop("source_password")
        d.pop("sink_password")
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str, source_password: str | None = None, sink_password: str | None = None) -> "MirrorConfig":
        d = json.loads(text)
        d["source_extra"] = tuple(tuple(p) for p in d["source_extra"])
        d["sink_extra"] = tuple(tuple(p) for p in d["sink_extra"])
        return cls(**d, source_password=source_password, sink_password=sink_password)


# ---------------------------------------------------------------- helpers


def unknown_key(key: str, known: Sequence[str], where: str, hint: str = "") -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    did = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{where}: unknown key {key!r}.{did} Known keys: {', '.join(sorted(known))}.{hint}")


def parse_trigger(value: Any, what: str, noun: str = "a trigger interval") -> float:
    """``10s``, ``500ms``, ``1m``, ``10 seconds`` or a number of seconds -> seconds (> 0)."""
    m = _TRIGGER.match(str(value))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{what}: {str(value)!r} is not {noun}; write e.g. 10s, 500ms, 1m")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def split_password(url: str, what: str) -> tuple[str, str | None]:
    """A PostgreSQL URI (a sink's, a source's) without its password, and the password."""
    from flinkish_spark.connectors.postgres.connection import parse_url

    info = parse_url(url, None, what)
    return info.url, info.url_password


MYSQL_SCHEMES = ("mysql", "mariadb")


def split_source_url(url: str, what: str) -> tuple[Source, str, str | None]:
    """``--from``: the source's database (by the URL's scheme), its URL without the password, and the password."""
    from flinkish_spark.connectors.urls import split_password as split

    parts, _ = split(url, ("postgresql", "postgres", *MYSQL_SCHEMES), what,
                     "postgresql://user@host:5432/db or mysql://user@host:3306/db", noun="a database URL")
    if parts.scheme in MYSQL_SCHEMES:
        from flinkish_spark.connectors.mysql.connection import parse_url

        info = parse_url(url, None, what)
        return "mysql", info.url, info.url_password
    return ("postgres", *split_password(url, what))


def check_tables(tables: str, what: str) -> str:
    from flinkish_spark.connectors.cdc.patterns import TablePatterns

    if "\\" in tables:
        raise ConfigError(
            f"{what}: {tables!r} holds a backslash. Table patterns are shell-style here, not Flink CDC's regular "
            r"expressions: write public.* for public.\.*, sales.order_* for sales.order_\.*")
    TablePatterns.parse(tables, what)
    return tables


def check_source_tables(tables: str, what: str, kind: Source) -> str:
    """``tables`` of a source of this database (MySQL: ``database.table``, the backslash hint in its terms)."""
    if kind == "mysql" and "\\" in tables:
        raise ConfigError(
            f"{what}: {tables!r} holds a backslash. Table patterns are shell-style here, not Flink CDC's regular "
            r"expressions: write shop.* for shop.\.*, sales.order_* for sales.order_\.*")
    return check_tables(tables, what)


def check_uid(uid: str, what: str) -> str:
    if not _UID.match(uid):
        raise ConfigError(f"{what}: {uid!r} must be 1-40 lower-case letters, digits or '_' (it names the "
                          f"replication slot flinkish_<uid>)")
    return uid


def check_target(fmt: Format, target: str, what: str) -> str:
    from flinkish_spark.connectors.lakehouse.routing import parse_route

    if "{table}" not in target:
        raise ConfigError(f"{what}: {target!r} needs the placeholder {{table}} (and usually {{schema}}): every "
                          f"source table gets its own target, e.g. {_example_target(fmt)}")
    parse_route(target, _ROUTE_KIND[fmt], TARGET_OPTION[fmt], what)
    return target


def _example_target(fmt: Format) -> str:
    return {"delta": "s3://lake/{schema}/{table}", "iceberg": "mirror.{schema}_{table}",
            "postgres": "{schema}.{table}"}[fmt]


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def default_spark_checkpoint(checkpoint: str, uid: str) -> str:
    """Spark's checkpointLocation when not given: ``<checkpoint>/spark`` for a local metadata root, else a
    folder of this machine's state (``$XDG_STATE_HOME/flinkish_spark/mirror/<uid>-<hash of the root>``)."""
    if _is_local(checkpoint):
        root = checkpoint[len("file://"):] if checkpoint.startswith("file://") else checkpoint
        return os.path.join(os.path.abspath(root), "spark")
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    tag = hashlib.sha256(checkpoint.rstrip("/").encode()).hexdigest()[:12]
    return os.path.join(base, "flinkish_spark", "mirror", f"{uid}-{tag}")


def absolute(path: str) -> str:
    """A local path (or ``file://`` URL) made absolute; any other URL as is. A relative path would be resolved
    by Spark's executors and a Connect server against their own working folders, not this one."""
    if "://" in path and not path.startswith("file://"):
        return path
    if path.startswith("file://"):
        return "file://" + os.path.abspath(path[len("file://"):])
    return os.path.abspath(os.path.expanduser(path))


def check_spark_checkpoint(path: str, what: str) -> str:
    if not _is_local(path):
        raise ConfigError(f"{what}: Spark's own checkpoint must be a local folder here (the pyspark wheel has no "
                          f"S3A connector), got {path!r}")
    return path


def _key_values(pairs: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{what}: {p!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def _extra(given: Mapping[str, str], allowed: Sequence[str], what: str, hint: str = "") -> tuple[tuple[str, str], ...]:
    for key in given:
        if key not in allowed:
            raise unknown_key(key, allowed, what, hint)
    return tuple(sorted((k, str(v)) for k, v in given.items()))


def source_options_of(kind: Source) -> tuple[str, ...]:
    """The source options a mirror may set for a source of this database (besides url/tables)."""
    if kind == "mysql":
        from flinkish_spark.mirror.mysql_options import MYSQL_SOURCE_OPTIONS

        return MYSQL_SOURCE_OPTIONS
    return SOURCE_OPTIONS


def startup_mode(value: str, what: str) -> str:
    if value in STARTUP_MODES:
        return STARTUP_MODES[value]
    if value in STARTUP_MODES.values():
        return value
    raise ConfigError(f"{what}: {value!r} is not a startup mode; use one of {', '.join(STARTUP_MODES)} "
                      f"(or {', '.join(STARTUP_MODES.values())})")


def bounded(extra: dict[str, str], stop_after_snapshot: bool, what: str) -> bool:
    """Whether the mirror is a bounded copy: ``--stop-after-snapshot`` is the source's ``startup=snapshot``."""
    startup = extra.pop("startup", None)
    if startup == "snapshot":
        return True
    if startup is not None and stop_after_snapshot:
        raise ConfigError(f"{what}: {startup!r} contradicts --stop-after-snapshot (a bounded copy reads the "
                          "snapshot only); drop one of the two")
    if startup is not None:
        extra["startup"] = startup
    return stop_after_snapshot


def infer_format(to: str) -> Format:
    if to.startswith(tuple(f"{s}://" for s in MYSQL_SCHEMES)):
        raise ConfigError(f"--to: there is no MySQL target; a mirror writes Delta, Iceberg or PostgreSQL tables "
                          f"(--to s3://lake/{{schema}}/{{table}}, --to postgresql://user@host:5432/db)")
    return "postgres" if to.startswith(("postgresql://", "postgres://")) else "delta"


def delta_target(to: str) -> str:
    """A Delta ``--to``/``path``: a folder without placeholders gets ``/{schema}/{table}`` appended."""
    return to if "{table}" in to else to.rstrip("/") + "/{schema}/{table}"


# ---------------------------------------------------------------- flags

#: How the flags name the settings :func:`flinkish_spark.mirror.cluster.placement` checks.
FLAG_NAMES = {"master": "--master", "remote": "--remote", "server_timeout": "--server-timeout",
              "checkpoint": "--checkpoint", "spark_checkpoint": "--spark-checkpoint"}


def from_args(*, source: str | None, tables: str | None, to: str | None, fmt: str | None, checkpoint: str | None,
              trigger: str | None = None, stop_after_snapshot: bool = False, uid: str | None = None,
              spark_checkpoint: str | None = None, source_option: Sequence[str] = (),
              sink_option: Sequence[str] = (), master: str | None = None, remote: str | None = None,
              server_timeout: str | None = None, parallelism: int | None = None, route: Sequence[str] = ()) -> MirrorConfig:
    """The configuration of ``flinkish mirror --from ... --tables ... --to ... --checkpoint ...``."""
    missing = [flag for flag, v in (("--from", source), ("--tables", tables), ("--to", to), ("--checkpoint", checkpoint))
               if not v]
    if missing:
        raise ConfigError(f"flinkish mirror: {', '.join(missing)} missing. Either give --from, --tables, --to and "
                          "--checkpoint, or a pipeline file: flinkish mirror pipeline.yaml")
    assert source and tables and to and checkpoint
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if parallelism is not None and parallelism < 1:
        raise ConfigError(f"--parallelism must be a whole number >= 1, got {parallelism}")
    tasks = parallelism or DEFAULT_PARALLELISM
    form: Format = cast(Format, fmt) if fmt else infer_format(to)
    kind, source_url, source_password = split_source_url(source, "--from")
    uid = check_uid(uid or DEFAULT_UID, "--uid")
    src_given = _key_values(source_option, "--source-option")
    if kind == "mysql":
        from flinkish_spark.mirror.mysql_options import check_source_options

        check_source_options(src_given, "--source-option")
    if "startup" in src_given:
        src_given["startup"] = startup_mode(src_given["startup"], "--source-option startup")
    stop_after_snapshot = bounded(src_given, stop_after_snapshot, "--source-option startup")
    sink_given = _key_values(sink_option, "--sink-option")
    from flinkish_spark.mirror import route_rules

    route_rules.cli_routes(route, sink_given)  # --route: the routing sinks' 'routes' (mirror.route_rules)
    sink_password = None
    target_key = TARGET_OPTION[form]
    if form == "postgres":
        url, sink_password = split_password(to, "--to")
        sink_given["url"] = url
        target = sink_given.pop(target_key, "{schema}.{table}")
    elif form == "delta":
        target = absolute(delta_target(to))
    else:
        target = to
    allowed = (*SINK_OPTIONS[form], *(("url", target_key) if form == "postgres" else ()))
    from flinkish_spark.mirror.shapes import check_modes

    sink_extra = _extra(sink_given, allowed, f"--sink-option (format {form})")
    check_modes(dict(sink_extra), "--sink-option", form)
    route_rules.check_routes(_ROUTE_KIND[form], target, TARGET_OPTION[form], dict(sink_extra), "--route")
    from flinkish_spark.mirror.cluster import placement

    timeout = parse_trigger(server_timeout, "--server-timeout", "a duration") if server_timeout else None
    place = placement(master, remote, timeout, checkpoint=checkpoint, spark_checkpoint=spark_checkpoint,
                      passwords=(("--from", source_password, src_given.get("passwordEnv")),
                                 ("--to", sink_password, sink_given.get("passwordEnv"))), names=FLAG_NAMES,
                      parallelism=str(tasks))
    checkpoint = absolute(checkpoint)
    return MirrorConfig(
        uid=uid, name=uid, source_url=source_url, tables=check_source_tables(tables, "--tables", kind), format=form,
        target=check_target(form, target, "--to" if form != "postgres" else "--sink-option table"),
        checkpoint=checkpoint,
        spark_checkpoint=absolute(check_spark_checkpoint(spark_checkpoint or default_spark_checkpoint(checkpoint, uid),
                                                          "--spark-checkpoint")),
        trigger_s=parse_trigger(trigger, "--trigger") if trigger else DEFAULT_TRIGGER_S,
        stop_after_snapshot=stop_after_snapshot, parallelism=tasks, **place,
        source_extra=_extra(src_given, source_options_of(kind), "--source-option"),
        sink_extra=sink_extra, source_kind=kind, source_password=source_password, sink_password=sink_password,
    )
