"""``flinkish mirror pipeline.yaml``: a pipeline file in Flink CDC 3's YAML shape -> :class:`MirrorConfig`.

Sections ``source`` (``type: postgres``, ``hostname`` / ``port`` / ``username`` / ``password`` /
``database-name`` or ``url``, ``tables``, ``tables.exclude``, Flink CDC's ``slot.name``,
``scan.startup.mode``, ``scan.incremental.snapshot.chunk.size`` and the source's own options; or
``type: mysql`` with the keys of Flink CDC's MySQL pipeline connector: :mod:`flinkish_spark.mirror.mysql_options`),
``sink`` (``type: delta|iceberg|postgres``, the sink's options, each table's shape: ``mode``, ``deletes`` and the rule list
``table-modes``, :mod:`flinkish_spark.mirror.shapes`), ``route`` (rules:
``source-table``, ``sink-table``, ``replace-symbol``, first match wins; :mod:`flinkish_spark.mirror.route_rules`),
``transform`` (Flink CDC's rules: ``source-table``, ``projection``, ``filter``;
:func:`flinkish_spark.mirror.shapes.yaml_transforms`) and ``pipeline`` (``name``, ``uid``,
``checkpoint``, ``spark-checkpoint``, ``trigger``, ``parallelism``, ``schema.change.behavior``, and where
it runs: ``master`` or ``remote`` with ``server-timeout``, as the flags --master, --remote, --server-timeout;
:mod:`flinkish_spark.mirror.cluster`).
The same guarantees as :mod:`flinkish_spark.mirror.config`: every unknown key and bad value is
one :class:`ConfigError` naming it and the fix, no value of a key is ever quoted where it could be
a password, and a YAML syntax error names its line and column, not the line's text.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Mapping, cast

from flinkish_spark.errors import ConfigError
from flinkish_spark.connectors.lakehouse.table_modes import TABLE_MODE_OPTIONS
from flinkish_spark.mirror import mysql_options, shapes
from flinkish_spark.mirror.cluster import placement
from flinkish_spark.mirror.config import (
    absolute,
    bounded,
    check_source_tables,
    check_spark_checkpoint,
    check_target,
    check_uid,
    default_spark_checkpoint,
    DEFAULT_PARALLELISM,
    DEFAULT_TRIGGER_S,
    DEFAULT_UID,
    delta_target,
    Format,
    FORMATS,
    MirrorConfig,
    parse_trigger,
    SINK_OPTIONS,
    SOURCE_FLINK_NAMES,
    SOURCE_OPTIONS,
    Source,
    split_password,
    startup_mode,
    TARGET_OPTION,
    unknown_key,
)

_TOP = ("source", "sink", "route", "pipeline", "transform")
_CONNECTION = ("hostname", "port", "username", "password", "database-name", "url")
_SOURCE_KEYS = ("type", "name", "tables", "tables.exclude", *_CONNECTION, *SOURCE_OPTIONS, *SOURCE_FLINK_NAMES)
_PIPELINE_KEYS = ("name", "uid", "checkpoint", "spark-checkpoint", "trigger", "parallelism", "schema.change.behavior",
                  "stop-after-snapshot", "metrics-port", "master", "remote", "server-timeout")
#: How a pipeline file names the settings :func:`~flinkish_spark.mirror.cluster.placement` checks.
_NAMES = {k: f"pipeline.{k.replace('_', '-')}" for k in
          ("master", "remote", "server_timeout", "checkpoint", "spark_checkpoint")}
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
        uri, password = split_password(url, f"pipeline file: {where}.url")
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


def _source_tables(src: Mapping[str, Any], kind: Source) -> str:
    tables = _text(src, "tables", "source", required=True)
    assert tables is not None
    exclude = _text(src, "tables.exclude", "source")
    if exclude:
        tables += ", " + ", ".join("!" + e.strip() for e in exclude.split(",") if e.strip())
    return check_source_tables(tables, "pipeline file: source.tables", kind)


def _route_target(rules: Any, tables: tuple[str, ...], fmt: Format, sink_target: str | None) -> str | None:
    """The target template a ``route`` section gives (None without one)."""
    if rules is None:
        return None
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ConfigError("pipeline file: 'route' must be a list of rules (- source-table: ..., sink-table: ...)")
    from flinkish_spark.mirror import route_rules

    if not route_rules.is_one_template(rules, tables):
        return None  # route rules over the sink's own template: the sink's 'routes' option (yaml_routes)
    rule = rules[0]
    for key in rule:
        if key not in _ROUTE_KEYS:
            raise unknown_key(str(key), _ROUTE_KEYS, "pipeline file: route[0]")
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
        if key not in _TOP:
            raise unknown_key(str(key), _TOP, "pipeline file")
    src, sink, pipe = _section(doc, "source", True), _section(doc, "sink", True), _section(doc, "pipeline", True)

    source_type = _text(src, "type", "source", required=True)
    if source_type in ("postgres", "postgresql"):
        kind: Source = "postgres"
        source_keys: tuple[str, ...] = _SOURCE_KEYS
        flink_names: dict[str, str] = SOURCE_FLINK_NAMES
        options: tuple[str, ...] = SOURCE_OPTIONS
    elif source_type in ("mysql", "mariadb"):
        kind = "mysql"
        source_keys, flink_names, options = (mysql_options.source_keys(_CONNECTION), mysql_options.MYSQL_FLINK_NAMES,
                                             mysql_options.MYSQL_SOURCE_OPTIONS)
    else:
        raise ConfigError(f"pipeline file: source.type {source_type!r} is not supported; use 'postgres' or 'mysql'")
    for key in src:
        if kind == "mysql" and key in mysql_options.NOT_FOR_MYSQL:
            raise mysql_options.not_for_mysql(str(key), f"pipeline file: source.{key}")
        if key not in source_keys:
            raise unknown_key(str(key), source_keys, "pipeline file: source")
    source_url, source_password = (_connection_url(src, "source") if kind == "postgres"
                                   else mysql_options.connection_url(src, _text))
    tables = _source_tables(src, kind)
    src_extra: dict[str, str] = {}
    for key, value in src.items():
        name = flink_names.get(key, key)
        if name in options:
            if name in src_extra:
                raise ConfigError(f"pipeline file: source sets {name!r} twice (also by its Flink CDC name)")
            src_extra[name] = _text(src, key, "source") or ""
    if "serverId" in src_extra:
        src_extra["serverId"] = mysql_options.server_id(
            src_extra["serverId"], f"pipeline file: source.{'server-id' if 'server-id' in src else 'serverId'}")
    if "startup" in src_extra:
        src_extra["startup"] = startup_mode(src_extra["startup"], f"pipeline file: source.{'scan.startup.mode' if 'scan.startup.mode' in src else 'startup'}")
    stop_after_snapshot = bounded(src_extra, stop_after_snapshot, "pipeline file: source.scan.startup.mode")

    fmt_raw = _text(sink, "type", "sink", required=True)
    if fmt_raw not in FORMATS:
        raise ConfigError(f"pipeline file: sink.type {fmt_raw!r} is not one of {', '.join(FORMATS)}")
    fmt = cast(Format, fmt_raw)
    target_key = TARGET_OPTION[fmt]
    sink_keys = ("type", "name", target_key, *(k for k in SINK_OPTIONS[fmt] if k != "routes"), shapes.YAML_RULES,
                 *(_CONNECTION if fmt == "postgres" else ()))
    for key in sink:
        if key not in sink_keys:
            raise unknown_key(str(key), sink_keys, f"pipeline file: sink (type {fmt})",
                           " The target is named by the sink's "
                           f"{target_key!r} or by route[0].sink-table; uid and checkpoint are the pipeline's.")
    sink_extra = {k: _text(sink, k, "sink") or "" for k in SINK_OPTIONS[fmt] if k in sink and k not in TABLE_MODE_OPTIONS}
    sink_extra.update(shapes.yaml_modes(sink))
    if doc.get("transform") is not None:  # Flink CDC's transform block: the routing sinks' option 'transforms'
        if "transforms" in sink_extra:
            raise ConfigError("pipeline file: give the transforms in 'transform' or in sink.transforms, not both")
        sink_extra["transforms"] = shapes.yaml_transforms(doc["transform"])
    shapes.check_modes(sink_extra, "pipeline file: sink", fmt)
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
        target = absolute(delta_target(target))
    from flinkish_spark.mirror import route_rules

    sink_extra.update(route_rules.yaml_routes(doc.get("route"), (str(src["tables"]), tables)))
    route_rules.check_routes({"delta": "path", "iceberg": "iceberg", "postgres": "postgres"}[fmt], target, target_key,
                             sink_extra, "pipeline file: route")

    for key in pipe:
        if key not in _PIPELINE_KEYS:
            raise unknown_key(str(key), _PIPELINE_KEYS, "pipeline file: pipeline")
    checkpoint = _text(pipe, "checkpoint", "pipeline", required=True)
    assert checkpoint is not None
    uid = check_uid(_text(pipe, "uid", "pipeline") or DEFAULT_UID, "pipeline file: pipeline.uid")
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
    port = _text(pipe, "metrics-port", "pipeline")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"pipeline file: pipeline.metrics-port must be a port number (1-65535), got {port!r}")
    spark_checkpoint = _text(pipe, "spark-checkpoint", "pipeline")
    timeout = _text(pipe, "server-timeout", "pipeline")
    place = placement(_text(pipe, "master", "pipeline"), _text(pipe, "remote", "pipeline"),
                      parse_trigger(timeout, "pipeline file: pipeline.server-timeout", "a duration") if timeout else None,
                      checkpoint=checkpoint,
                      spark_checkpoint=spark_checkpoint, parallelism=parallelism, names=_NAMES, where="pipeline file: ",
                      passwords=(("source", source_password, src_extra.get("passwordEnv")),
                                 ("sink", sink_password, sink_extra.get("passwordEnv"))))
    checkpoint = absolute(checkpoint)
    return MirrorConfig(
        uid=uid, name=_text(pipe, "name", "pipeline") or uid, source_url=source_url, tables=tables, format=fmt,
        target=check_target(fmt, target, f"pipeline file: sink.{target_key} / route[0].sink-table"),
        checkpoint=checkpoint,
        spark_checkpoint=absolute(check_spark_checkpoint(spark_checkpoint or default_spark_checkpoint(checkpoint, uid),
                                                          "pipeline file: pipeline.spark-checkpoint")),
        trigger_s=parse_trigger(trigger, "pipeline file: pipeline.trigger") if trigger else DEFAULT_TRIGGER_S,
        stop_after_snapshot=stop_after_snapshot or stop_raw, metrics_port=int(port) if port else None,
        parallelism=int(parallelism or DEFAULT_PARALLELISM), **place,
        source_extra=tuple(sorted(src_extra.items())), sink_extra=tuple(sorted(sink_extra.items())),
        source_kind=kind, source_password=source_password, sink_password=sink_password,
    )
