"""What ``flinkish mirror`` prints at its end about reading its tables, per format (fast: no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flinkish_spark.mirror.config import from_args


@pytest.mark.parametrize("fmt, to, extra, wanted", [
    ("delta", "/lake", [], ["pl.read_delta('/lake/{schema}/{table}')", "DeltaTable('/lake/{schema}/{table}').scan()",
                            "not to_pyarrow_table()"]),
    ("delta", "/lake", ["mergeMode=copyOnWrite"], ["pl.read_delta('/lake/{schema}/{table}')"]),
    ("iceberg", "mirror.{schema}_{table}", [], ["SqlCatalog('flinkish', uri='sqlite:///", "/meta/iceberg/catalog.db'",
                                                ".load_table('mirror.{schema}_{table}').scan().to_arrow()"]),
    ("postgres", "postgresql://w:secret@replica/shop", [], ["psql 'postgresql://w@replica/shop' -c 'TABLE {schema}.{table}'"]),
])
def test_the_read_hint_names_the_formats_readers_and_the_targets(fmt: str, to: str, extra: list[str], wanted: list[str],
                                                                 tmp_path: Path) -> None:
    from flinkish_spark.mirror.reading import read_hint

    hint = read_hint(from_args(source="postgresql://u@h/db", tables="public.*", to=to, fmt=fmt,
                               checkpoint=str(tmp_path / "meta"), sink_option=extra))
    assert hint.startswith("flinkish mirror: read your tables") and "flinkish mirror compare" in hint
    assert all(w in hint for w in wanted), hint
    assert ("not to_pyarrow_table()" in hint) == (fmt == "delta" and not extra) and "secret" not in hint
