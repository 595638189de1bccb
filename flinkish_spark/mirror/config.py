"""``flinkish mirror``'s configuration: command-line flags or a pipeline file -> one frozen :class:`MirrorConfig`.

Two ways in, one result:

* flags: ``--from postgresql://... --tables 'public.*' --to PATH_TEMPLATE [--format ...]
  --checkpoint URL [--trigger 10s] [--stop-after-snapshot]`` (:func:`from_args`);
* a pipeline file in Flink CDC 3's YAML shape -- ``source`` (``type: postgres``, ``hostname`` /
  ``port`` / ``username`` / ``password`` / ``database-name`` or ``url``, ``tables``), ``sink``
  (``type: delta|iceberg|postgres`` and the sink's options), ``route`` (one rule: ``source-table``,
  ``sink-table``, ``replace-symbol``) and ``pipeline`` (``name``, ``checkpoint``, ``trigger``, ...)
  (:func:`from_yaml`).

Guarantees: every unknown key and bad value is refused here with one :class:`ConfigError`
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
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Sequence, cast

from flinkish_spark.errors import ConfigError

Format = Literal["delta", "iceberg", "postgres"]
FORMATS: tuple[Format, ...] = ("delta", "iceberg", "postgres")
#: Environment variables the pipeline puts the passwords in (named by the connectors' ``passwordEnv``).
SOURCE_PASSWORD_ENV = "FLINKISH_MIRROR_SOURCE_PASSWORD"
SINK_PASSWORD_ENV = "FLINKISH_MIRROR_SINK_PASSWORD"
DEFAULT_UID = "mirror"
DEFAULT_TRIGGER_S = 10.0

_STORAGE = ("endpointUrl", "region", "storageOptions")
#: Options of the flinkish.postgres source a mirror may set besides url/tables (their own names).
SOURCE_OPTIONS = ("splitSize", "maxRowsPerTrigger", "snapshotPartitions", "discoveryInterval", "slotName",
                  "publication", "onSlotLost", "passwordEnv", "startup")
#: Flink CDC's names for some of them (a pipeline file may use either).
SOURCE_FLINK_NAMES = {"slot.name": "slotName", "scan.incremental.snapshot.chunk.size": "splitSize",
                      "scan.startup.mode": "startup"}
#: Flink CDC's ``scan.startup.mode`` values -> the source's ``startup``.
STARTUP_MODES = {"initial": "snapshotThenChanges", "snapshot": "snapshot", "latest-offset": "changes"}
#: Options each routing sink accepts from a mirror (the target option and uid/checkpoint are the mirror's).
SINK_OPTIONS: dict[Format, tuple[str, ...]] = {
    "delta": ("createTable", "checkpointInterval", "rowsPerFile", "targetFileSize", "mergeMode", *_STORAGE),
    "iceberg": ("catalog", "catalogUri", "catalogName", "warehouse", "createTable", "rowsPerFile", "targetFileSize",
                "retainSnapshots", "mergeMode", *_STORAGE),
    "postgres": ("createTable", "lockTimeout", "passwordEnv"),
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
    source_url: str  # libpq URI without a password
    tables: str
    format: Format
    target: str  # the sink's target option with {schema}/{table}
    checkpoint: str  # the metadata root (fsspec URL)
    spark_checkpoint: str  # Spark's checkpointLocation (a local folder)
    trigger_s: float = DEFAULT_TRIGGER_S
    stop_after_snapshot: bool = False
    master: str = "local[2]"
    source_extra: tuple[tuple[str, str], ...] = ()
    sink_extra: tuple[tuple[str, str], ...] = ()  # for postgres also ("url", ...) without password
    source_password: str | None = field(default=None, repr=False)
    sink_password: str | None = field(default=None, repr=False)

    @property
    def sink_uid(self) -> str:
        return f"{self.uid}_sink"

    @property
    def sink_format(self) -> str:
        return f"flinkish.{self.format}"

    def source_options(self) -> dict[str, str]:
        """The ``flinkish.postgres`` source options (what ``spark.readStream.option(...)`` gets)."""
        opts = {"uid": self.uid, "checkpoint": self.checkpoint, "url": self.source_url, "tables": self.tables,
                **dict(self.source_extra)}
        if self.source_password is not None and "passwordEnv" not in opts:
            opts["passwordEnv"] = SOURCE_PASSWORD_ENV
        if self.stop_after_snapshot:
            opts["startup"] = "snapshot"
        return opts

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


def _unknown(key: str, known: Sequence[str], where: str, hint: str = "") -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    did = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{where}: unknown key {key!r}.{did} Known keys: {', '.join(sorted(known))}.{hint}")


def parse_trigger(value: Any, what: str) -> float:
    """``10s``, ``500ms``, ``1m``, ``10 seconds`` or a number of seconds -> seconds (> 0)."""
    m = _TRIGGER.match(str(value))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{what}: {str(value)!r} is not a trigger interval; write e.g. 10s, 500ms, 1m")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def _split_password(url: str, what: str) -> tuple[str, str | None]:
    from flinkish_spark.connectors.postgres.connection import parse_url

    info = parse_url(url, None, what)
    return info.url, info.url_password


def _check_tables(tables: str, what: str) -> str:
    from flinkish_spark.connectors.postgres.source.patterns import TablePatterns

    if "\\" in tables:
        raise ConfigError(
            f"{what}: {tables!r} holds a backslash. Table patterns are shell-style here, not Flink CDC's regular "
            r"expressions: write public.* for public.\.*, sales.order_* for sales.order_\.*")
    TablePatterns.parse(tables, what)
    return tables


def _check_uid(uid: str, what: str) -> str:
    if not _UID.match(uid):
        raise ConfigError(f"{what}: {uid!r} must be 1-40 lower-case letters, digits or '_' (it names the "
                          f"replication slot flinkish_<uid>)")
    return uid


def _check_target(fmt: Format, target: str, what: str) -> str:
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


def _check_spark_checkpoint(path: str, what: str) -> str:
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
            raise _unknown(key, allowed, what, hint)
    return tuple(sorted((k, str(v)) for k, v in given.items()))


def _startup(value: str, what: str) -> str:
    if value in STARTUP_MODES:
        return STARTUP_MODES[value]
    if value in STARTUP_MODES.values():
        return value
    raise ConfigError(f"{what}: {value!r} is not a startup mode; use one of {', '.join(STARTUP_MODES)} "
                      f"(or {', '.join(STARTUP_MODES.values())})")


def _bounded(extra: dict[str, str], stop_after_snapshot: bool, what: str) -> bool:
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
    return "postgres" if to.startswith(("postgresql://", "postgres://")) else "delta"


def _delta_target(to: str) -> str:
    """A Delta ``--to``/``path``: a folder without placeholders gets ``/{schema}/{table}`` appended."""
    return to if "{table}" in to else to.rstrip("/") + "/{schema}/{table}"


# ---------------------------------------------------------------- flags


def from_args(*, source: str | None, tables: str | None, to: str | None, fmt: str | None, checkpoint: str | None,
              trigger: str | None = None, stop_after_snapshot: bool = False, uid: str | None = None,
              spark_checkpoint: str | None = None, source_option: Sequence[str] = (),
              sink_option: Sequence[str] = ()) -> MirrorConfig:
    """The configuration of ``flinkish mirror --from ... --tables ... --to ... --checkpoint ...``."""
    missing = [flag for flag, v in (("--from", source), ("--tables", tables), ("--to", to), ("--checkpoint", checkpoint))
               if not v]
    if missing:
        raise ConfigError(f"flinkish mirror: {', '.join(missing)} missing. Either give --from, --tables, --to and "
                          "--checkpoint, or a pipeline file: flinkish mirror pipeline.yaml")
    assert source and tables and to and checkpoint
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    form: Format = cast(Format, fmt) if fmt else infer_format(to)
    source_url, source_password = _split_password(source, "--from")
    uid = _check_uid(uid or DEFAULT_UID, "--uid")
    src_given = _key_values(source_option, "--source-option")
    if "startup" in src_given:
        src_given["startup"] = _startup(src_given["startup"], "--source-option startup")
    stop_after_snapshot = _bounded(src_given, stop_after_snapshot, "--source-option startup")
    sink_given = _key_values(sink_option, "--sink-option")
    sink_password = None
    target_key = TARGET_OPTION[form]
    if form == "postgres":
        url, sink_password = _split_password(to, "--to")
        sink_given["url"] = url
        target = sink_given.pop(target_key, "{schema}.{table}")
    elif form == "delta":
        target = _delta_target(to)
    else:
        target = to
    allowed = (*SINK_OPTIONS[form], *(("url", target_key) if form == "postgres" else ()))
    return MirrorConfig(
        uid=uid, name=uid, source_url=source_url, tables=_check_tables(tables, "--tables"), format=form,
        target=_check_target(form, target, "--to" if form != "postgres" else "--sink-option table"),
        checkpoint=checkpoint,
        spark_checkpoint=_check_spark_checkpoint(spark_checkpoint or default_spark_checkpoint(checkpoint, uid),
                                                 "--spark-checkpoint"),
        trigger_s=parse_trigger(trigger, "--trigger") if trigger else DEFAULT_TRIGGER_S,
        stop_after_snapshot=stop_after_snapshot,
        source_extra=_extra(src_given, SOURCE_OPTIONS, "--source-option"),
        sink_extra=_extra(sink_given, allowed, f"--sink-option (format {form})"),
        source_password=source_password, sink_password=sink_password,
    )


# ---------------------------------------------------------------- pipeline file

_TOP = ("source", "sink", "route", "pipeline")
_CONNECTION = ("hostname", "port", "username", "password", "database-name", "url")
_SOURCE_KEYS = ("type", "name", "tables", "tables.exclude", *_CONNECTION, *SOURCE_OPTIONS, *SOURCE_FLINK_NAMES)
_PIPELINE_KEYS = ("name", "uid", "checkpoint", "spark-checkpoint", "trigger", "parallelism", "schema.change.behavior",
                  "stop-after-snapshot")
_ROUTE_KEYS = ("source-table", "sink-table", "replace-symbol", "description")


def _section(doc: Mapping[str, Any], key: str, required: bool) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        if required:
            raise ConfigError(f"pipeline file: section {key!r} missing (a pipeline has source, sink and pipeline; "
                              "route is optional)")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"pipeline file: {key!r} must be a mapping of keys to values, got {type(value).__name__}")
    return value


def _text(section: Mapping[str, Any], key: str, where: str, required: bool = False) -> str | None:
    value = section.get(key)
    if value is None:
        if required:
            raise ConfigError(f"pipeline file: {where}.{key} missing")
        return None
    if isinstance(value, (dict, list)):
        # Never print the value: it may be a password.
        raise ConfigError(f"pipeline file: {where}.{key} must be a single value, not a {type(value).__name__}")
    return str(value)


def _connection_url(section: Mapping[str, Any], where: str) -> tuple[str, str | None]:
    """``url`` or ``hostname``/``port``/``username``/``password``/``database-name`` -> (URI without password, password)."""
    url = _text(section, "url", where)
    parts = [k for k in ("hostname", "port", "username", "database-name") if k in section]
    if url is not None:
        if parts:
            raise ConfigError(f"pipeline file: {where} has 'url' and {', '.join(parts)}: give one of the two")
        uri, password = _split_password(url, f"pipeline file: {where}.url")
        given = _text(section, "password", where)
        if given is not None and password is not None:
            raise ConfigError(f"pipeline file: {where} has a password in 'url' and in 'password': give it once")
        return uri, given if given is not None else password
    host = _text(section, "hostname", where)
    if host is None:
        raise ConfigError(f"pipeline file: {where} needs 'hostname' (with port, username, database-name) or 'url' "
                          "(postgresql://user@host:5432/db)")
    port = _text(section, "port", where) or "5432"
    if not port.isdigit():
        raise ConfigError(f"pipeline file: {where}.port must be a number, got {port!r}")
    user = _text(section, "username", where)
    db = _text(section, "database-name", where)
    if user is None or db is None:
        raise ConfigError(f"pipeline file: {where} needs 'username' and 'database-name' with 'hostname'")
    q = urllib.parse.quote
    return f"postgresql://{q(user, safe='')}@{host}:{port}/{q(db, safe='')}", _text(section, "password", where)


def _source_tables(src: Mapping[str, Any]) -> str:
    tables = _text(src, "tables", "source", required=True)
    assert tables is not None
    exclude = _text(src, "tables.exclude", "source")
    if exclude:
        tables += ", " + ", ".join("!" + e.strip() for e in exclude.split(",") if e.strip())
    return _check_tables(tables, "pipeline file: source.tables")


def _route_target(rules: Any, tables: tuple[str, ...], fmt: Format, sink_target: str | None) -> str | None:
    """The target template a ``route`` section gives (None without one)."""
    if rules is None:
        return None
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ConfigError("pipeline file: 'route' must be a list of rules (- source-table: ..., sink-table: ...)")
    if len(rules) != 1:
        raise ConfigError(
            f"pipeline file: route has {len(rules)} rules; a mirror routes every table of source.tables through one "
            "rule (one target template with {schema}/{table}). Merge the rules, or run one mirror per rule")
    rule = rules[0]
    for key in rule:
        if key not in _ROUTE_KEYS:
            raise _unknown(str(key), _ROUTE_KEYS, "pipeline file: route[0]")
    source_table = _text(rule, "source-table", "route[0]", required=True)
    if source_table is not None and source_table.replace(" ", "") not in {t.replace(" ", "") for t in tables}:
        raise ConfigError(
            f"pipeline file: route[0].source-table {source_table!r} differs from source.tables {tables[0]!r}; the one "
            "rule routes every mirrored table: give it the same value")
    sink_table = _text(rule, "sink-table", "route[0]", required=True)
    assert sink_table is not None
    symbol = _text(rule, "replace-symbol", "route[0]")
    if symbol:
        sink_table = sink_table.replace(symbol, "{table}")
    if fmt == "delta":
        if sink_target is not None and "{table}" in sink_target:
            raise ConfigError("pipeline file: sink.path has placeholders and route[0].sink-table names the target "
                              "too: give the template once")
        if sink_target is not None and "://" not in sink_table and not sink_table.startswith("/"):
            return sink_target.rstrip("/") + "/" + sink_table  # relative to the sink's folder
        return sink_table
    if sink_target is not None:
        raise ConfigError(f"pipeline file: sink.{TARGET_OPTION[fmt]} and route[0].sink-table both name the target: "
                          "give it once")
    return sink_table


def from_yaml(path: str, stop_after_snapshot: bool = False) -> MirrorConfig:
    """The configuration of ``flinkish mirror pipeline.yaml``."""
    try:
        import yaml
    except ImportError:
        from flinkish_spark.errors import EnvironmentSetupError

        raise EnvironmentSetupError("a pipeline file needs PyYAML: pip install 'flinkish_spark[mirror]'") from None
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"pipeline file {path!r} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        # Only the position and the problem: the offending line may hold a password.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"pipeline file {path!r} is not valid YAML{where}: {getattr(exc, 'problem', None) or 'syntax error'}") from None
    return from_document(doc, stop_after_snapshot)


def from_document(doc: Any, stop_after_snapshot: bool = False) -> MirrorConfig:
    """The configuration a parsed pipeline file describes."""
    if not isinstance(doc, dict):
        raise ConfigError("pipeline file: the top level must be a mapping with source, sink, route and pipeline")
    for key in doc:
        if key == "transform":
            raise ConfigError("pipeline file: 'transform' is not supported: a mirror copies tables as they are "
                              "(project and filter the mirrored tables with Spark SQL, or write the pipeline in Python)")
        if key not in _TOP:
            raise _unknown(str(key), _TOP, "pipeline file")
    src, sink, pipe = _section(doc, "source", True), _section(doc, "sink", True), _section(doc, "pipeline", True)

    for key in src:
        if key not in _SOURCE_KEYS:
            raise _unknown(str(key), _SOURCE_KEYS, "pipeline file: source")
    if _text(src, "type", "source", required=True) not in ("postgres", "postgresql"):
        raise ConfigError(f"pipeline file: source.type {src['type']!r} is not supported; use 'postgres'")
    source_url, source_password = _connection_url(src, "source")
    tables = _source_tables(src)
    src_extra: dict[str, str] = {}
    for key, value in src.items():
        name = SOURCE_FLINK_NAMES.get(key, key)
        if name in SOURCE_OPTIONS:
            if name in src_extra:
                raise ConfigError(f"pipeline file: source sets {name!r} twice (also by its Flink CDC name)")
            src_extra[name] = _text(src, key, "source") or ""
    if "startup" in src_extra:
        src_extra["startup"] = _startup(src_extra["startup"], f"pipeline file: source.{'scan.startup.mode' if 'scan.startup.mode' in src else 'startup'}")
    stop_after_snapshot = _bounded(src_extra, stop_after_snapshot, "pipeline file: source.scan.startup.mode")

    fmt_raw = _text(sink, "type", "sink", required=True)
    if fmt_raw not in FORMATS:
        raise ConfigError(f"pipeline file: sink.type {fmt_raw!r} is not one of {', '.join(FORMATS)}")
    fmt = cast(Format, fmt_raw)
    target_key = TARGET_OPTION[fmt]
    sink_keys = ("type", "name", target_key, *SINK_OPTIONS[fmt], *(_CONNECTION if fmt == "postgres" else ()))
    for key in sink:
        if key not in sink_keys:
            raise _unknown(str(key), sink_keys, f"pipeline file: sink (type {fmt})",
                           " The target is named by the sink's "
                           f"{target_key!r} or by route[0].sink-table; uid and checkpoint are the pipeline's.")
    sink_extra = {k: _text(sink, k, "sink") or "" for k in SINK_OPTIONS[fmt] if k in sink}
    sink_password = None
    if fmt == "postgres":
        sink_extra["url"], sink_password = _connection_url(sink, "sink")
    sink_target = _text(sink, target_key, "sink")
    target = _route_target(doc.get("route"), (str(src["tables"]), tables), fmt, sink_target) or sink_target
    if target is None:
        if fmt == "delta":
            raise ConfigError("pipeline file: sink.path missing: the folder the Delta tables go to, e.g. "
                              "s3://lake/{schema}/{table} (or s3://lake: {schema}/{table} is appended)")
        target = "{schema}.{table}"
    if fmt == "delta":
        target = _delta_target(target)

    for key in pipe:
        if key not in _PIPELINE_KEYS:
            raise _unknown(str(key), _PIPELINE_KEYS, "pipeline file: pipeline")
    checkpoint = _text(pipe, "checkpoint", "pipeline", required=True)
    assert checkpoint is not None
    uid = _check_uid(_text(pipe, "uid", "pipeline") or DEFAULT_UID, "pipeline file: pipeline.uid")
    behavior = _text(pipe, "schema.change.behavior", "pipeline")
    if behavior is not None and behavior != "lenient":
        raise ConfigError(
            f"pipeline file: pipeline.schema.change.behavior {behavior!r} is not available: a mirror follows schema "
            "changes as Flink CDC's 'lenient' does (added columns added, dropped ones kept and null, widened types "
            "widened; a change a target cannot follow stops at an epoch boundary). Drop the key or set 'lenient'")
    parallelism = _text(pipe, "parallelism", "pipeline")
    if parallelism is not None and (not parallelism.isdigit() or int(parallelism) < 1):
        raise ConfigError(f"pipeline file: pipeline.parallelism must be a whole number >= 1, got {parallelism!r}")
    stop_raw = pipe.get("stop-after-snapshot", False)
    if not isinstance(stop_raw, bool):
        raise ConfigError(f"pipeline file: pipeline.stop-after-snapshot must be true or false, got {stop_raw!r}")
    trigger = _text(pipe, "trigger", "pipeline")
    return MirrorConfig(
        uid=uid, name=_text(pipe, "name", "pipeline") or uid, source_url=source_url, tables=tables, format=fmt,
        target=_check_target(fmt, target, f"pipeline file: sink.{target_key} / route[0].sink-table"),
        checkpoint=checkpoint,
        spark_checkpoint=_check_spark_checkpoint(
            _text(pipe, "spark-checkpoint", "pipeline") or default_spark_checkpoint(checkpoint, uid),
            "pipeline file: pipeline.spark-checkpoint"),
        trigger_s=parse_trigger(trigger, "pipeline file: pipeline.trigger") if trigger else DEFAULT_TRIGGER_S,
        stop_after_snapshot=stop_after_snapshot or stop_raw,
        master=f"local[{parallelism}]" if parallelism else "local[2]",
        source_extra=tuple(sorted(src_extra.items())), sink_extra=tuple(sorted(sink_extra.items())),
        source_password=source_password, sink_password=sink_password,
    )
