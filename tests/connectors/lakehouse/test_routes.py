"""Route rules (flinkish_spark.connectors.lakehouse.routes): parsing, first match, merging rules, one error per bad rule."""

from __future__ import annotations

import json

import pytest

from flinkish_spark.connectors.lakehouse.routes import (
    SOURCE_TABLE, check_shard_keys, cli_rule, merges, parse_routes, shard_schema, sink_routes,
)
from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import ConfigError, SchemaChangeError
from flinkish_spark.testing.stream_rows import table_schema

PG = Route("mirror.{schema}_{table}", "postgres")


def routes(rules: list[dict[str, object]], default: Route = PG, **options: str):
    return parse_routes(default, {"routes": json.dumps(rules), **options}.get, "test")


def test_the_first_matching_rule_names_the_target_and_other_tables_keep_the_sinks_template() -> None:
    r = routes([{"source-table": "shop_*.orders", "sink-table": "lake.orders"},
                {"source-table": "shop_a.*, !shop_a.tmp", "sink-table": "lake.a_{table}"},
                {"source-table": "sales.*", "sink-table": "lake.s_<>", "replace-symbol": "<>", "description": "x"}])
    assert r.target("shop_a.orders") == "lake.orders" and r.target("shop_b.orders") == "lake.orders"
    assert r.target("shop_a.items") == "lake.a_items"
    assert r.target("shop_a.tmp") == "mirror.shop_a_tmp"  # excluded from the rule: the sink's template
    assert r.target("sales.x") == "lake.s_x"
    assert r.target("public.t") == "mirror.public_t"
    assert r.merged("shop_b.orders") is not None and r.merged("shop_a.items") is None and r.merged("public.t") is None
    assert r.matches("lake.orders") and r.matches("lake.a_zz") and r.matches("mirror.x_y") and not r.matches("other.t")
    assert r.templates() == ("mirror.{schema}_{table}", "lake.orders", "lake.a_{table}", "lake.s_{table}")


@pytest.mark.parametrize("source, sink, merged", [
    ("shop_*.orders", "lake.orders", True), ("shop_*.orders", "lake.{table}", True),
    ("shop_*.orders", "lake.{schema}_orders", False), ("shop.orders_2026_*", "lake/{schema}/orders", True),
    ("shop.orders_2026_*", "lake/{schema}/{table}", False), ("shop.a, shop.b", "lake.ab", True),
    ("shop.a", "lake.a", False), ("sales.*", "lake.s_{table}", False), ('shop."a*".t', "lake.t", False),
])
def test_a_rule_merges_when_its_target_leaves_out_a_part_its_patterns_leave_open(source: str, sink: str, merged: bool) -> None:
    assert merges(source, sink) is merged


def test_a_merged_shard_is_keyed_by_its_key_and_source_table_unless_keys_are_unique() -> None:
    s = table_schema("shop_a.orders", [("id", "int"), ("v", "text")], ("id",))
    rule = routes([{"source-table": "shop_*.orders", "sink-table": "lake.orders"}]).merged("shop_a.orders")
    merged = shard_schema(s, rule)
    assert merged.names == ("id", "v", SOURCE_TABLE) and merged.key == ("id", SOURCE_TABLE)
    unique = routes([{"source-table": "shop_*.orders", "sink-table": "lake.orders"}], keysUniqueAcrossShards="true")
    assert shard_schema(s, unique.merged("shop_a.orders")).key == ("id",)
    per_rule = routes([{"source-table": "shop_*.orders", "sink-table": "lake.orders", "keys-unique-across-shards": True}])
    assert shard_schema(s, per_rule.merged("shop_a.orders")).key == ("id",)
    clash = table_schema("shop_a.orders", [("id", "int"), (SOURCE_TABLE, "text")], ("id",))
    with pytest.raises(SchemaChangeError, match=r"shop_a.orders: its column _source_table .* rename it"):
        shard_schema(clash, rule)


def test_shards_with_different_keys_are_one_stop_naming_them() -> None:
    check_shard_keys("lake.orders", [("a.o", ("id", SOURCE_TABLE)), ("b.o", ("id",))])  # the same key columns
    with pytest.raises(SchemaChangeError, match=r"lake.orders have different primary keys: a.o keyed by \(id\); "
                                                r"b.o keyed by \(id, n\).*same primary key"):
        check_shard_keys("lake.orders", [("a.o", ("id",)), ("b.o", ("id", "n"))])


@pytest.mark.parametrize("raw, message", [
    ("{", r"'routes' is not JSON"),
    ('{"source-table": "a.b"}', r"'routes' is a JSON dict"),
    ('["a.b"]', r"route rule 1 is 'a.b', not an object"),
    ('[{"source-table": "a.*", "sink-table": "l.x", "sink": 1}]', r"route rule 1 has unknown key\(s\) 'sink'"),
    ('[{"sink-table": "l.x"}]', r"route rule 1 has no 'source-table'"),
    ('[{"source-table": "a.*", "sink-table": "l.x"}, {"source-table": "b.*"}]', r"route rule 2 \('b.\*'\) has no 'sink-table'"),
    ('[{"source-table": "a", "sink-table": "l.x"}]', r"route rule 1: 'a' is not 'schema.table'"),
    ('[{"source-table": "a.*", "sink-table": "l.{name}"}]', r"route rule 1: sink-table 'l.\{name\}' has a placeholder"),
    ('[{"source-table": "a.*", "sink-table": "x_{table}"}]', r"route rule 1: sink-table 'x_\{table\}' is not schema.table"),
    ('[{"source-table": "a.*", "sink-table": "l.x", "keys-unique-across-shards": "maybe"}]', r"must be true or false"),
    ('[{"source-table": "a.*", "sink-table": "l.x"}, {"source-table": "a.*", "sink-table": "l.y"}]',
     r"route rule 2 has the source-table of rule 1 \('a.\*'\) and would never match"),
])
def test_each_bad_rule_is_one_config_error_naming_it(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_routes(PG, {"routes": raw}.get, "test")


def test_routes_on_a_sink_of_one_target_are_refused_and_the_cli_form_makes_a_rule() -> None:
    with pytest.raises(ConfigError, match=r"option 'routes' routes the tables of a routing sink"):
        sink_routes(None, lambda o: o == "routes", lambda o: "[]", "test", "table")
    assert cli_rule("shop_*.orders = lake.orders") == {"source-table": "shop_*.orders", "sink-table": "lake.orders"}
    assert cli_rule("shop_*.orders=lake.orders;keys-unique")["keys-unique-across-shards"] is True
    for bad in ("shop_*.orders", "=lake.x", "a.*=l.x;other"):
        with pytest.raises(ConfigError, match="--route"):
            cli_rule(bad)
