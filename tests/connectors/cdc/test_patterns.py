"""Table names and patterns of the option ``tables`` (no server): what matches, what is refused, what is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns, read_not_followed, split_followable
from flinkish_spark.connectors.postgres.source.discovery import _found
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO


def test_patterns_select_names_with_wildcards_quotes_and_exclusions() -> None:
    p = TablePatterns.parse('public.*, sales.order_?, "Mixed Case".*, !public.audit_*', "test")
    assert p.matches("public.orders") and p.matches("sales.order_1") and p.matches("Mixed Case.x")
    assert not p.matches("sales.order_12") and not p.matches("public.audit_log") and not p.matches("mixed case.x")
    assert TablePatterns.parse("Public.Orders", "t").matches("public.orders")  # unquoted names fold to lower case
    assert TablePatterns.parse('public."a*b"', "t").matches("public.a*b") and not TablePatterns.parse('public."a*b"', "t").matches("public.axb")
    with pytest.raises(ConfigError, match="'orders' is not 'schema.table'"):
        TablePatterns.parse("orders", "option 'tables'")
    with pytest.raises(ConfigError, match="no table named"):
        TablePatterns.parse("!public.x", "option 'tables'")


def test_a_table_without_a_usable_key_is_left_out_with_the_fix_in_its_warning() -> None:
    keyed = _found(1, "public", "a", True, "d", True)
    keyless = _found(2, "public", "b", False, "f", True)
    by_index = _found(3, "public", "c", False, "i", True)
    assert split_followable([keyed, keyless, by_index]) == ([keyed, by_index], [keyless])
    assert keyless.not_followed() == (
        "public.b is not followed: it has no primary key (REPLICA IDENTITY FULL alone does not tell equal rows "
        "apart). ALTER TABLE public.b ADD PRIMARY KEY (...) or ALTER TABLE public.b REPLICA IDENTITY USING INDEX "
        "<a unique index on NOT NULL columns>, and it is picked up (snapshot, then its changes) at the next catalog "
        "poll, without a restart")
    other = FoundTable(4, "shop.orders", "shop", "orders", True, "it has no primary key", "ALTER TABLE shop.orders ADD PRIMARY KEY (id)")
    assert other.not_followed().startswith("shop.orders is not followed: it has no primary key. ALTER TABLE shop.orders")


def test_the_not_followed_file_reads_empty_when_absent(tmp_path: Path) -> None:
    io = FileIO.for_url(str(tmp_path))
    assert read_not_followed(io, str(tmp_path)) == {}
