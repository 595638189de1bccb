"""``flinkish mirror``'s route rules: ``--route`` and the pipeline file's ``route`` list become the routing sinks'
``routes`` option, checked before anything starts (flinkish_spark.mirror.route_rules); no server, no Spark."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flinkish_spark.errors import ConfigError
from flinkish_spark.mirror.config import from_args
from flinkish_spark.mirror.pipeline_file import from_document


def args(**kw: Any) -> dict[str, Any]:
    return {"source": "postgresql://u@h/db", "tables": "shop_*.*", "to": "/lake", "fmt": None, "checkpoint": "/ck", **kw}


def doc(route: Any, sink: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"source": {"type": "postgres", "url": "postgresql://u@h/db", "tables": "shop_*.*"},
            "sink": sink or {"type": "delta", "path": "/lake"}, "route": route, "pipeline": {"checkpoint": "/ck"}}


def test_route_flags_become_the_sinks_rules_over_its_template() -> None:
    c = from_args(**args(route=["shop_*.orders=orders", "shop_a.*=raw/{table};keys-unique"]))
    assert c.target == "/lake/{schema}/{table}"
    assert json.loads(dict(c.sink_extra)["routes"]) == [
        {"source-table": "shop_*.orders", "sink-table": "orders"},
        {"source-table": "shop_a.*", "sink-table": "raw/{table}", "keys-unique-across-shards": True}]
    assert c.sink_options()["routes"] == dict(c.sink_extra)["routes"]  # what the sink gets
    with pytest.raises(ConfigError, match=r"--route and --sink-option routes=\.\.\. both"):
        from_args(**args(route=["a.*=x"], sink_option=["routes=[]"]))
    with pytest.raises(ConfigError, match=r"--route: route sink-table '/elsewhere/o' is not below '/lake'"):
        from_args(**args(route=["shop_*.orders=/elsewhere/o"]))
    with pytest.raises(ConfigError, match=r"--route: route rule 1: sink-table 'orders' is not namespace.table"):
        from_args(**args(to="mirror.{schema}_{table}", fmt="iceberg", route=["shop_*.orders=orders"]))


def test_a_pipeline_files_route_list_is_the_sinks_rules_and_its_one_template_rule_stays_the_template() -> None:
    rules = [{"source-table": "shop_*.orders", "sink-table": "orders", "description": "the shards"},
             {"source-table": "shop_a.*", "sink-table": "raw/<>", "replace-symbol": "<>"},
             {"source-table": "shop.o_*", "sink-table": "{schema}/o", "keys-unique-across-shards": True}]
    c = from_document(doc(rules))
    assert c.target == "/lake/{schema}/{table}" and json.loads(dict(c.sink_extra)["routes"])[2]["keys-unique-across-shards"]
    one = from_document(doc([{"source-table": "shop_*.*", "sink-table": "raw/<>", "replace-symbol": "<>"}]))
    assert one.target == "/lake/raw/{table}" and "routes" not in dict(one.sink_extra)  # as before: the template
    pg = from_document(doc([{"source-table": "shop_*.orders", "sink-table": "public.orders"}],
                           {"type": "postgres", "url": "postgresql://w@replica/db"}))
    assert pg.target == "{schema}.{table}" and "routes" in dict(pg.sink_extra)


@pytest.mark.parametrize("route, message", [
    ({"source-table": "a.b"}, r"'route' must be a list"),
    ([{"source-table": "a.b", "sink-table": "o", "sinks": 1}], r"route\[0\]: unknown key 'sinks'"),
    ([{"source-table": "shop_*.orders", "sink-table": "o"}, {"sink-table": "x"}], r"route rule 2 has no 'source-table'"),
    ([{"source-table": "orders", "sink-table": "o"}], r"'orders' is not 'schema.table'"),
    ([{"source-table": "a.*", "sink-table": "{db}/x"}], r"placeholder other than"),
])
def test_each_bad_rule_of_a_pipeline_file_is_one_error_before_anything_starts(route: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_document(doc(route))


def test_the_preflight_names_merged_shards_of_different_modes_and_takes_history_on_every_target() -> None:
    from flinkish_spark.mirror.route_rules import shard_problems

    routes = json.dumps([{"source-table": "shop_*.orders", "sink-table": "orders"}])
    tables = ["shop_a.orders", "shop_b.orders", "shop_a.items"]
    assert shard_problems("delta", "/lake/{schema}/{table}", {"routes": routes}, tables) == []
    modes = json.dumps([{"tables": "shop_b.*", "deletes": "soft"}])
    found = shard_problems("delta", "/lake/{schema}/{table}", {"routes": routes, "tableModes": modes}, tables)
    assert len(found) == 1 and "/lake/orders are shop_a.orders (upsert), shop_b.orders (upsert, deletes soft)" in found[0]
    history = {"routes": routes, "mode": "history"}
    for fmt, target in (("delta", "/lake/{schema}/{table}"), ("iceberg", "m.{schema}_{table}"),
                        ("postgres", "{schema}.{table}")):  # every merged target keeps history by shard
        assert shard_problems(fmt, target, {**history, "routes": routes.replace('"orders"', '"m.orders"')}, tables) == []
