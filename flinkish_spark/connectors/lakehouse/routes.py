"""Several route rules, and many-to-one routes: sharded source tables merged into one target.

Format-independent (``flinkish.delta``, ``flinkish.iceberg``, ``flinkish.postgres`` with ``{table}`` in their target
option; ``flinkish mirror``'s ``--route`` and its pipeline file's ``route`` list):

* ``routes``: a JSON list of rules ``{"source-table": "<patterns>", "sink-table": "<template>"}`` (Flink CDC's
  ``route`` keys; ``replace-symbol`` stands for ``{table}``, ``description`` is ignored). The first rule whose
  patterns (the source's ``tables`` syntax, :class:`~flinkish_spark.connectors.cdc.patterns.TablePatterns`) match a
  source table names its target; a table no rule matches goes through the sink's own template (:class:`Routes`).
* **A rule merges** when its ``sink-table`` leaves out a placeholder for a part of the table name that its
  ``source-table`` leaves open (``shop_*.orders`` -> ``lake/orders`` or ``lake/{table}``; ``shop.orders_2026_*`` ->
  ``lake/{schema}/orders``; two names ``shop.a, shop.b`` -> ``lake/ab``). Every table such a rule matches is a
  **shard** of its target -- decided by the rule alone, so the target's shape is the same before its second shard
  appears and after: the target has a column ``_source_table`` (``schema.table``) and is keyed by the shards' key
  plus ``_source_table`` (:func:`shard_schema`), unless the rule (or the sink's ``keysUniqueAcrossShards``) says the
  keys are unique across shards: then ``_source_table`` is written but not keyed.

The guarantee it serves: a table's target is decided once, by its name, before anything is written (a bad rule is
one :class:`~flinkish_spark.errors.ConfigError` naming it and the fix). Keyed by ``_source_table``, the shards'
rows never share a key in their target, so applying each shard's rows by key in its own stream order -- in one
commit per target per epoch, or one transaction per epoch -- leaves the target equal to the union of the shards,
each row tagged with its shard; a truncate or a re-snapshot of one shard takes only the rows of that shard. The
shards' key columns must be the same (:func:`check_shard_keys`: a clear stop naming them otherwise).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.lakehouse.routing import PLACEHOLDERS, Route
from flinkish_spark.connectors.postgres.rows import TableSchema, make_column
from flinkish_spark.errors import ConfigError, SchemaChangeError

#: The column a merged target tags each row with: its source table, ``schema.table``.
SOURCE_TABLE = "_source_table"
#: The sink options this module reads (each routing sink adds them to its own).
ROUTE_OPTIONS = ("routes", "keysUniqueAcrossShards")
RULE_KEYS = ("source-table", "sink-table", "replace-symbol", "description", "keys-unique-across-shards")
_HINT = ('routes is a JSON list of rules, e.g. [{"source-table": "shop_*.orders", "sink-table": "lake.orders"}, '
         '{"source-table": "shop.*", "sink-table": "lake.shop_{table}"}]')


@dataclass(frozen=True)
class RouteRule:
    """One rule: the tables its patterns match go to its template."""

    source_table: str  # the patterns as given
    patterns: TablePatterns
    route: Route
    merges: bool  # its tables are shards of shared targets (module docstring)
    keys_unique: bool = False  # merged: the shards' keys are unique across them (no _source_table in the key)


@dataclass(frozen=True)
class Routes(Route):
    """The sink's template and its rules, first match wins; a drop-in for :class:`Route` where a sink names targets."""

    rules: tuple[RouteRule, ...] = field(default=())

    def rule(self, source_table: str) -> RouteRule | None:
        return next((r for r in self.rules if r.patterns.matches(source_table)), None)

    def target(self, source_table: str) -> str:
        rule = self.rule(source_table)
        return super().target(source_table) if rule is None else rule.route.target(source_table)

    def matches(self, name: str) -> bool:
        return super().matches(name) or any(r.route.matches(name) for r in self.rules)

    def templates(self) -> tuple[str, ...]:
        """Every template a target can come from (the sink's first)."""
        return (self.template, *(r.route.template for r in self.rules))

    def merged(self, source_table: str) -> RouteRule | None:
        """The merging rule of ``source_table`` (None: it has a target of its own)."""
        rule = self.rule(source_table)
        return rule if rule is not None and rule.merges else None

    @property
    def merging(self) -> bool:
        return any(r.merges for r in self.rules)


def _parts(entry: str) -> tuple[str, str]:
    """``schema.table`` of one pattern entry, split at the dot outside double quotes."""
    quoted = False
    for i, ch in enumerate(entry):
        if ch == '"':
            quoted = not quoted
        elif ch == "." and not quoted:
            return entry[:i], entry[i + 1:]
    return entry, ""


def _open(part: str) -> bool:
    """Whether a pattern part holds a wildcard outside double quotes."""
    return bool(re.search(r"[*?]", re.sub(r'"(?:[^"]|"")*"', "", part)))


def merges(source_table: str, template: str) -> bool:
    """Whether a rule routes several tables to one target: its template leaves out ``{schema}`` while the patterns
    leave the schema open (a wildcard, or two different schemas), or ``{table}`` while they leave the table open."""
    entries = [_parts(e.strip()) for e in source_table.split(",") if e.strip() and not e.strip().startswith("!")]
    for i, placeholder in enumerate(PLACEHOLDERS):
        values = {e[i].strip() for e in entries}
        if placeholder not in template and (len(values) > 1 or any(_open(v) for v in values)):
            return True
    return False


def _flag(value: object, where: str, component: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{component}: {where}: keys-unique-across-shards must be true or false, got {value!r}")


def parse_rule(rule: object, i: int, default: Route, resolve: Callable[[str], str], keys_unique: bool,
               component: str) -> RouteRule:
    """Rule ``i`` (from 1) of a ``routes`` list; ``resolve`` makes a template whole (a Delta path relative to the
    sink's folder)."""
    where = f"route rule {i}"
    if not isinstance(rule, dict):
        raise ConfigError(f"{component}: {where} is {rule!r}, not an object; {_HINT}")
    unknown = sorted(str(k) for k in set(rule) - set(RULE_KEYS))
    if unknown:
        raise ConfigError(f"{component}: {where} has unknown key(s) {', '.join(map(repr, unknown))}; a rule has "
                          f"{', '.join(map(repr, RULE_KEYS))}")
    source, sink = rule.get("source-table"), rule.get("sink-table")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{component}: {where} has no 'source-table' (the table patterns it routes, e.g. "
                          "'shop_*.orders')")
    if not isinstance(sink, str) or not sink.strip():
        raise ConfigError(f"{component}: {where} ({source!r}) has no 'sink-table' (its target, e.g. 'lake.orders' "
                          "or 'lake.shop_{table}')")
    symbol = rule.get("replace-symbol")
    if symbol is not None:
        if not isinstance(symbol, str) or not symbol:
            raise ConfigError(f"{component}: {where}: replace-symbol must be a non-empty text, got {symbol!r}")
        sink = sink.replace(symbol, "{table}")
    rest = sink.replace("{schema}", "").replace("{table}", "")
    if "{" in rest or "}" in rest:
        raise ConfigError(f"{component}: {where}: sink-table {sink!r} has a placeholder other than {{schema}} and "
                          "{table}")
    patterns = TablePatterns.parse(source, f"{component}: {where}")
    template = resolve(sink)
    if default.kind == "iceberg" and len([p for p in template.split(".") if p]) < 2:
        raise ConfigError(f"{component}: {where}: sink-table {sink!r} is not namespace.table")
    if default.kind == "postgres" and "." not in template:
        raise ConfigError(f"{component}: {where}: sink-table {sink!r} is not schema.table")
    unique = _flag(rule.get("keys-unique-across-shards", keys_unique), where, component)
    return RouteRule(source, patterns, Route(template, default.kind), merges(source, sink), unique)


def parse_routes(default: Route, get: Callable[[str], str | None], component: str,
                 resolve: Callable[[str], str] = lambda t: t) -> Routes:
    """The sink's ``routes`` and ``keysUniqueAcrossShards`` options over its own template ``default`` (``get``
    returns None for an option not given)."""
    raw_unique = get("keysUniqueAcrossShards")
    unique = _flag(raw_unique, "option keysUniqueAcrossShards", component) if raw_unique is not None else False
    raw = get("routes")
    if raw is None or not raw.strip():
        return Routes(default.template, default.kind)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{component}: option 'routes' is not JSON ({e.msg} at character {e.pos}); {_HINT}") from None
    if not isinstance(parsed, list):
        raise ConfigError(f"{component}: option 'routes' is a JSON {type(parsed).__name__}; {_HINT}")
    rules = tuple(parse_rule(r, i, default, resolve, unique, component) for i, r in enumerate(parsed, start=1))
    for i, rule in enumerate(rules):
        same = next((j for j in range(i) if rules[j].source_table.replace(" ", "") == rule.source_table.replace(" ", "")),
                    None)
        if same is not None:  # the first match wins: this one would never route a table
            raise ConfigError(f"{component}: route rule {i + 1} has the source-table of rule {same + 1} "
                              f"({rule.source_table!r}) and would never match; drop one of them")
    return Routes(default.template, default.kind, rules)


def routes_option(rules: list[dict[str, object]]) -> str:
    """The ``routes`` option of ``rules`` (what ``flinkish mirror`` passes from ``--route`` / its pipeline file)."""
    return json.dumps(rules, separators=(",", ":"))


def cli_rule(text: str, component: str = "--route") -> dict[str, object]:
    """``--route 'shop_*.orders=lake.orders'``: one rule, ``<source-table>=<sink-table>`` (a trailing
    ``;keys-unique`` says the shards' keys are unique across them)."""
    body, _, flag = text.partition(";")
    source, eq, sink = body.partition("=")
    if not eq or not source.strip() or not sink.strip():
        raise ConfigError(f"{component} {text!r}: give '<source-table patterns>=<sink-table>', e.g. "
                          "--route 'shop_*.orders=lake/orders'")
    rule: dict[str, object] = {"source-table": source.strip(), "sink-table": sink.strip()}
    if flag.strip():
        if flag.strip() != "keys-unique":
            raise ConfigError(f"{component} {text!r}: after ';' only 'keys-unique' is known (the shards' keys are "
                              "unique across them)")
        rule["keys-unique-across-shards"] = True
    return rule


def shard_schema(schema: TableSchema, rule: RouteRule) -> TableSchema:
    """A shard's schema as its merged target takes it: its columns and ``_source_table`` (text), keyed by its key and
    ``_source_table`` (only its key when the rule says keys are unique across shards). A source column of that name
    is refused, naming the table."""
    if SOURCE_TABLE in schema.names:
        raise SchemaChangeError(
            f"source table {schema.table}: its column {SOURCE_TABLE} has the name of the column its merged target "
            f"({rule.route.template}) tags each shard's rows with; rename it in the source, or route the table to a "
            "target of its own")
    column = make_column(SOURCE_TABLE, "text", "text", -1, None)
    key = schema.key if rule.keys_unique else (*schema.key, SOURCE_TABLE)
    return TableSchema(schema.table, (*schema.columns, column), key)


def check_shard_keys(target: str, keys: Iterable[tuple[str, tuple[str, ...]]]) -> None:
    """Refuse shards of one target whose key columns differ (``keys``: source table, its key): their rows cannot
    be applied by one key."""
    by_key: dict[tuple[str, ...], list[str]] = {}
    for table, key in keys:
        by_key.setdefault(tuple(k for k in key if k != SOURCE_TABLE), []).append(table)
    if len(by_key) > 1:
        shown = "; ".join(f"{', '.join(sorted(set(t)))} keyed by ({', '.join(k)})" for k, t in sorted(by_key.items()))
        raise SchemaChangeError(
            f"the shards merged into {target} have different primary keys: {shown}. Give them the same primary key "
            "in the source, or route them to targets of their own (a rule with {table} in its sink-table)")


def sink_routes(route: Route | None, has: Callable[[str], bool], get: Callable[[str], str | None], component: str,
                option: str, resolve: Callable[[str], str] = lambda t: t) -> Routes | None:
    """A routing sink's :class:`Routes` (None: the sink writes one target, and ``routes`` is refused there)."""
    if route is None:
        given = [o for o in ROUTE_OPTIONS if has(o)]
        if given:
            raise ConfigError(f"{component}: option {', '.join(map(repr, given))} routes the tables of a routing sink "
                              f"('{{table}}' in {option!r}); a sink of one target has none. Drop it, or put "
                              f"{{schema}}/{{table}} in {option!r}")
        return None
    return parse_routes(route, get, component, resolve)


def path_resolver(template: str, component: str) -> Callable[[str], str]:
    """How a Delta sink makes a rule's ``sink-table`` whole: relative to the folder before the first placeholder of
    its ``path`` (``s3://lake/{schema}/{table}`` -> ``s3://lake``); an absolute one must lie below that folder (one
    storage, and the folder the sink looks for its targets in)."""
    root = template[:template.index("{")].rstrip("/") if "{" in template else template.rstrip("/")

    def resolve(sink_table: str) -> str:
        if "://" not in sink_table and not sink_table.startswith("/"):
            return f"{root}/{sink_table.lstrip('./')}"
        if not sink_table.startswith(root + "/"):
            raise ConfigError(f"{component}: route sink-table {sink_table!r} is not below {root!r}, the folder of the "
                              "sink's path: give it relative to that folder (e.g. 'orders' or 'raw/{table}')")
        return sink_table

    return resolve


def shard_rows(route: Route, table: str, rows: Any) -> Any:
    """What a reader of ``table``'s target sees of the table (``rows``: the target's Arrow table, or None): a merged
    target's rows of that shard, without ``_source_table`` -- how ``flinkish mirror compare`` compares a shard."""
    if rows is None or route.merged(table) is None or SOURCE_TABLE not in rows.column_names:
        return rows
    # delta-rs reads text as string_view, which filter/take do not take (pyarrow 18): as plain string first
    views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    rows = rows.cast(pa.schema([f.with_type(views.get(f.type, f.type)) for f in rows.schema]))
    return rows.filter(pc.equal(rows.column(SOURCE_TABLE), table)).drop_columns([SOURCE_TABLE])


def compare_routes(route: Route, options: Any, resolve: Callable[[str], str] = lambda t: t) -> Routes:
    """The routes of a sink's ``options`` (a mapping, or None) over ``route``, for a reader of its targets."""
    return parse_routes(route, (options or {}).get, "compare", resolve)
