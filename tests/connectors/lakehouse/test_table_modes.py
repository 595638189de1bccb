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
