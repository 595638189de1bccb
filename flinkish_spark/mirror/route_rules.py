"""``flinkish mirror``'s route rules: ``--route`` (repeatable) and the pipeline file's ``route`` list -> the routing
sinks' ``routes`` option (:mod:`flinkish_spark.connectors.lakehouse.routes`), checked before anything starts.

A pipeline file's ``route`` of one rule whose ``source-table`` is ``source.tables`` and whose ``sink-table`` names every
table (``{table}`` or ``replace-symbol``) stays what it was: the sink's target template. Any other list -- several rules,
a rule for some of the tables, a rule merging shards -- becomes the ``routes`` option over the sink's own template
(``sink.path`` / ``sink.table``, ``{schema}/{table}`` by default): the first matching rule names a table's target, a
table no rule matches keeps the sink's template.
"""

from __future__ import annotations

from typing import Any, Sequence

from flinkish_spark.connectors.lakehouse.routes import (
    RULE_KEYS, cli_rule, parse_routes, path_resolver, routes_option,
)
from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import ConfigError


def is_one_template(rules: list[dict[str, Any]], tables: tuple[str, ...]) -> bool:
    """Whether a pipeline file's ``route`` is the one rule for all of ``source.tables`` naming each table's target."""
    if len(rules) != 1:
        return False
    rule = rules[0]
    source, sink = str(rule.get("source-table", "")), str(rule.get("sink-table", ""))
    symbol = rule.get("replace-symbol")
    if symbol:
        sink = sink.replace(str(symbol), "{table}")
    return (source.replace(" ", "") in {t.replace(" ", "") for t in tables} and "{table}" in sink
            and not set(rule) - {"source-table", "sink-table", "replace-symbol", "description"})


def yaml_routes(rules: Any, tables: tuple[str, ...]) -> dict[str, str]:
    """The sink options of a pipeline file's ``route`` list when it is not the one template (else none)."""
    if rules is None:
        return {}
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ConfigError("pipeline file: 'route' must be a list of rules (- source-table: ..., sink-table: ...)")
    if is_one_template(rules, tables):
        return {}
    for i, rule in enumerate(rules, start=1):
        for key in rule:
            if key not in RULE_KEYS:
                from flinkish_spark.mirror.config import unknown_key

                raise unknown_key(str(key), RULE_KEYS, f"pipeline file: route[{i - 1}]")
    return {"routes": routes_option([{k: (str(v) if k != "keys-unique-across-shards" else v) for k, v in r.items()}
                                     for r in rules])}


def cli_routes(given: Sequence[str], sink: dict[str, str]) -> None:
    """``--route`` flags into the sink options (``sink``, changed in place)."""
    if not given:
        return
    if "routes" in sink:
        raise ConfigError("--route and --sink-option routes=... both give route rules: give them once")
    sink["routes"] = routes_option([cli_rule(g) for g in given])


def check_routes(kind: str, target: str, option: str, sink: dict[str, str], what: str) -> None:
    """The rules as the sink will read them: every bad rule is one error before anything starts."""
    resolve = path_resolver(target, what) if kind == "path" else (lambda t: t)
    parse_routes(Route(target, kind), sink.get, what, resolve)
    del option


def shard_problems(fmt: str, target: str, sink: dict[str, str], tables: list[str]) -> list[str]:
    """What the preflight finds of the merged shards among the source's ``tables`` (names): shards of one target in
    different modes -- each one error before anything starts (the sinks refuse them at their first commit too)."""
    from flinkish_spark.connectors.lakehouse.shards import check_shard_modes
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes
    from flinkish_spark.errors import FlinkishError

    kind = {"delta": "path", "iceberg": "iceberg", "postgres": "postgres"}[fmt]
    try:
        routes = parse_routes(Route(target, kind), sink.get, "--route",
                              path_resolver(target, "--route") if kind == "path" else (lambda t: t))
        modes = parse_table_modes(sink.get, "--sink-option")
        groups: dict[str, list[str]] = {}
        for t in tables:
            if routes.merged(t) is not None:
                groups.setdefault(routes.target(t), []).append(t)
    except FlinkishError as e:
        return [str(e)]
    out = []
    for name, shards in sorted(groups.items()):
        try:
            check_shard_modes(name, {t: modes.of(t) for t in shards}, {"postgres": "PostgreSQL"}.get(fmt, fmt.title()))
        except FlinkishError as e:
            out.append(str(e))
    return out
