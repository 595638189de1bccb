"""The few lines ``flinkish mirror`` prints at its end: how to read the tables it wrote (docs/mirror.md, "Read your
tables"), for its format, with its own targets -- found through the sink's options, as the sink finds them."""

from __future__ import annotations

from flinkish_spark.mirror.config import MirrorConfig


def read_hint(config: MirrorConfig) -> str:
    """Readers that see the targets as they are (deletes applied), and ``flinkish mirror compare``."""
    sink = config.sink_options()
    if config.format == "delta":
        path = sink["path"]
        lines = [f"deltalake: pyarrow.table(DeltaTable('{path}').scan())   polars: pl.read_delta('{path}')"]
        if sink.get("mergeMode") != "copyOnWrite":  # copyOnWrite targets have no deletion vectors
            lines.append("  (not to_pyarrow_table() / to_pandas(): they refuse deletion vectors; count() counts deleted "
                         "rows)")
    elif config.format == "iceberg":
        lines = [f"pyiceberg: {_iceberg_catalog(config)}.load_table('{sink['table']}').scan().to_arrow()"]
    else:
        from flinkish_spark.connectors.postgres.connection import parse_url

        lines = [f"psql '{parse_url(sink['url']).masked}' -c 'TABLE {sink['table']}'"]
    return "\n".join(["flinkish mirror: read your tables (one per source table: fill in {schema} and {table}):", *(f"  {ln}" for ln in lines),
                      "  check them against the source: flinkish mirror compare + the same flags; more: "
                      "docs/mirror.md, 'Read your tables'"])


def _iceberg_catalog(config: MirrorConfig) -> str:
    """The pyiceberg call that opens the sink's catalog (the catalog properties the sink itself uses)."""
    from flinkish_spark.connectors.iceberg.catalog import catalog_properties

    sink = config.sink_options()
    props = catalog_properties(sink.get("catalog"), sink.get("catalogUri"), sink.get("warehouse"), sink["checkpoint"],
                               sink, "flinkish mirror", sink.get("catalogName"))
    if "uri" not in props:
        return f"load_catalog('{props['name']}')"
    return f"SqlCatalog('{props['name']}', uri='{props['uri']}', warehouse='{props['warehouse']}')"
