"""The query's Spark schema as an Iceberg schema: field ids 1..n in column order, all columns optional.

The mapping is fixed so that a restarted query, another flinkish query and the table agree
on every column's field id (readers resolve columns by id, not by name).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T
from pyspark.sql.types import StructType

from flinkish_spark.errors import ConfigError


def _primitive(dtype: T.DataType, name: str) -> Any:
    from pyiceberg import types as it

    mapping: list[tuple[type, Any]] = [
        (T.BooleanType, it.BooleanType()), (T.ByteType, it.IntegerType()), (T.ShortType, it.IntegerType()),
        (T.IntegerType, it.IntegerType()), (T.LongType, it.LongType()), (T.FloatType, it.FloatType()),
        (T.DoubleType, it.DoubleType()), (T.StringType, it.StringType()), (T.BinaryType, it.BinaryType()),
        (T.DateType, it.DateType()), (T.TimestampType, it.TimestamptzType()),
        (T.TimestampNTZType, it.TimestampType()),
    ]
    for spark_type, iceberg_type in mapping:
        if isinstance(dtype, spark_type):
            return iceberg_type
    if isinstance(dtype, T.DecimalType):
        return it.DecimalType(dtype.precision, dtype.scale)
    raise ConfigError(
        f"flinkish.iceberg sink: column {name!r} has the Spark type {dtype.simpleString()}, which this sink "
        "does not map to Iceberg (supported: boolean, tinyint..bigint, float, double, decimal, string, binary, "
        "date, timestamp, timestamp_ntz). Cast or drop the column."
    )


def iceberg_schema(schema: StructType) -> Any:
    """The Spark schema as an Iceberg schema, field ids 1..n in column order (all columns optional)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    fields = [NestedField(i, f.name, _primitive(f.dataType, f.name), required=False)
              for i, f in enumerate(schema.fields, start=1)]
    return Schema(*fields)


def shape(schema: Any) -> list[tuple[str, str]]:
    """(name, type) per top-level column: what two schemas must share to be written alike."""
    return [(f.name, str(f.field_type)) for f in schema.fields]


def keyed_table_schema(schema: StructType, table_columns: list[str]) -> StructType:
    """The Spark schema of a keyed table: the query's columns that the table holds (not the change
    columns), then the columns the keyed mode adds (``_deleted``; ``_valid_from``, ``_valid_to``, ``_current``)."""
    added = {"_deleted": T.BooleanType(), "_valid_from": T.TimestampType(), "_valid_to": T.TimestampType(),
             "_current": T.BooleanType()}
    have = {f.name: f for f in schema.fields}
    return T.StructType([have[n] if n in have else T.StructField(n, added[n]) for n in table_columns])
