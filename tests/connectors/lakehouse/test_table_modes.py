"""The routing sinks' per-table modes: the first matching rule wins, every bad rule one clear error."""

from __future__ import annotations

import pytest

from flinkish_spark.connectors.lakehouse.table_modes import TableMode, parse_table_modes
from flinkish_spark.errors import ConfigError


def modes(**options: str):
    return parse_table_modes(options.get, "flinkish.delta sink")


def test_without_options_every_table_is_upserted_with_deletes_applied():
    m = modes()
    assert m.of("public.orders") == TableMode("upsert", "true")
    assert m.of("public.orders").extra_columns == ()


def test_the_first_matching_rule_wins_and_a_rule_takes_the_sinks_defaults_for_what_it_leaves_out():
    m = modes(deletes="soft", tableModes='[{"tables": "public.orders, public.audit_*", "mode": "history", '
                                         '"deletes": "true"}, {"tables": "public.*, !public.keep", "deletes": "false"}]')
    assert m.of("public.orders") == TableMode("history", "true")
    assert m.of("public.orders").extra_columns == ("_valid_from", "_valid_to", "_current")
    assert m.of("public.audit_2026") == TableMode("history", "true")
    assert m.of("public.items") == TableMode("upsert", "false")
    assert m.of("public.keep") == TableMode("upsert", "soft")  # excluded by the second rule: the default
    assert m.of("public.keep").extra_columns == ("_deleted",)
    assert modes(deletes="soft", tableModes='[{"tables": "public.h", "mode": "history"}]').of("public.h") == \
        TableMode("history", "true")  # history's own deletes, not the sink's soft ones


@pytest.mark.parametrize("options, message", [
    ({"mode": "append"}, "mode 'append' is not one of upsert, history"),
    ({"deletes": "maybe"}, "deletes 'maybe' is not one of true, soft, false"),
    ({"mode": "history", "deletes": "soft"}, "deletes 'soft' is for mode 'upsert'"),
    ({"tableModes": "[{tables: x}]"}, "option 'tableModes' is not JSON"),
    ({"tableModes": '{"tables": "public.x"}'}, "option 'tableModes' is a JSON dict"),
    ({"tableModes": '["public.x"]'}, "tableModes rule 1 is 'public.x', not an object"),
    ({"tableModes": '[{"tables": "public.x", "mode": "history", "history": 1}]'}, "unknown key(s) 'history'"),
    ({"tableModes": '[{"mode": "history"}]'}, "tableModes rule 1 has no 'tables'"),
    ({"tableModes": '[{"tables": "orders", "mode": "history"}]'}, "'orders' is not 'schema.table'"),
    ({"tableModes": '[{"tables": "public.a"}, {"tables": "public.b", "mode": "history", "deletes": "soft"}]'},
     "tableModes rule 2 ('public.b'): deletes 'soft' is for mode 'upsert'"),
])
def test_a_bad_mode_or_rule_is_one_error_naming_it(options, message):
    with pytest.raises(ConfigError) as e:
        modes(**options)
    assert message in str(e.value) and str(e.value).startswith("flinkish.delta sink: ")


def test_tracked_columns_per_rule_and_sink_wide_for_history_tables_only():
    m = modes(mode="history", **{"trackHistoryColumns.except": "updated_at",
                                 "tableModes": '[{"tables": "public.p", "trackHistoryColumns": ["price", "status"]}, '
                                               '{"tables": "public.u", "mode": "upsert"}]'})
    assert m.of("public.p").tracked(["id", "name", "price", "status"], ("id",), "public.p") == ("price", "status")
    assert m.of("public.o").tracked(["id", "v", "updated_at"], ("id",), "public.o") == ("v",)  # the sink's except
    assert m.of("public.u") == TableMode("upsert", "true")  # not history: the sink's tracking does not apply
    assert modes(mode="history").of("public.x").tracked(["id", "v"], ("id",), "public.x") is None  # every column
    assert "tracking price, status" in m.of("public.p").describe()


@pytest.mark.parametrize("options, message", [
    ({"trackHistoryColumns": "v"}, "option trackHistoryColumns is for mode 'history'"),
    ({"tableModes": '[{"tables": "public.x", "trackHistoryColumns": ["v"]}]'},
     "tableModes rule 1 ('public.x'): trackHistoryColumns is for mode 'history' (which changes make a new version); "
     "the mode here is 'upsert'"),
    ({"tableModes": '[{"tables": "public.x", "mode": "history", "trackHistoryColumns": "v", '
                    '"trackHistoryColumns.except": "w"}]'}, "give trackHistoryColumns (the columns tracked) or"),
    ({"tableModes": '[{"tables": "public.x", "mode": "history", "trackHistoryColumns": 5}]'},
     "trackHistoryColumns is 5; give a list of column names"),
    ({"mode": "history", "trackHistoryColumns": " , "}, "trackHistoryColumns names no column"),
])
def test_a_bad_tracked_columns_option_is_one_error_naming_the_fix(options, message):
    with pytest.raises(ConfigError) as e:
        modes(**options)
    assert message in str(e.value)


def test_tracked_columns_the_table_does_not_have_or_its_key_are_refused_when_its_schema_arrives():
    m = modes(mode="history", trackHistoryColumns="price, colour")
    with pytest.raises(ConfigError, match=r"source table public.p: trackHistoryColumns lists 'colour', which the table "
                                          r"does not have \(its columns: id, price\)"):
        m.of("public.p").tracked(["id", "price"], ("id",), "public.p")
    with pytest.raises(ConfigError, match=r"trackHistoryColumns.except lists the key column\(s\) id; a key does not "
                                          r"change"):
        modes(mode="history", **{"trackHistoryColumns.except": "id"}).of("public.p").tracked(["id"], ("id",), "public.p")
