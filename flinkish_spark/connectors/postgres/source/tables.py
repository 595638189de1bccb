"""The table a ``flinkish.postgres`` source reads: its columns, their Spark types, its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from flinkish_spark.connectors.primary_key import with_primary_key
from flinkish_spark.errors import ConfigError, PostgresSourceError

METADATA_COLUMNS = ("_op", "_lsn", "_commit_ts")


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    pg_type: str  # pg_type.typname (int4, numeric, timestamptz, ...)
    spark_type: str  # a Spark DDL type
    as_text: bool  # read through ::text (types Spark has no equivalent of, numeric)


@dataclass(frozen=True)
class TableInfo:
    schema: str
    name: str
    columns: tuple[ColumnInfo, ...]
    key: tuple[str, ...]  # primary key columns, in key order (empty: none)
    split_column: str

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> ColumnInfo:
        return next(c for c in self.columns if c.name == name)

    def spark_ddl(self) -> str:
        cols = [f"`{c.name}` {c.spark_type}" for c in self.columns]
        return ", ".join(cols + ["`_op` string", "`_lsn` bigint", "`_commit_ts` timestamp"])

    def spark_schema(self) -> StructType:
        """The stream's schema (as :meth:`spark_ddl`) with the primary key marked for keyed sinks
        (:mod:`flinkish_spark.connectors.primary_key`)."""
        fields = [{"name": c.name, "type": _JSON_TYPE.get(c.spark_type, c.spark_type), "nullable": True}
                  for c in self.columns]
        fields += [{"name": "_op", "type": "string", "nullable": True}, {"name": "_lsn", "type": "long", "nullable": True},
                   {"name": "_commit_ts", "type": "timestamp", "nullable": True}]
        return with_primary_key(fields, self.key)


# Spark DDL type names (spark_type) whose JSON form differs; decimal(p,s) and the rest are the same.
_JSON_TYPE = {"smallint": "short", "int": "integer", "bigint": "long"}


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def spark_type(typname: str, typmod: int) -> tuple[str, bool]:
    """The Spark type of a PostgreSQL column, and whether it is read as text."""
    simple = {
        "int2": "smallint", "int4": "int", "int8": "bigint", "float4": "float", "float8": "double",
        "bool": "boolean", "date": "date", "timestamp": "timestamp_ntz", "timestamptz": "timestamp",
        "bytea": "binary", "text": "string", "varchar": "string", "bpchar": "string", "name": "string",
    }
    if typname in simple:
        return simple[typname], False
    if typname == "numeric" and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        if precision <= 38:
            return f"decimal({precision},{scale})", True
    return "string", True  # uuid, json, jsonb, numeric without precision, arrays, ...: lossless text


def load_table_info(conn: Any, table: str, split_column: str | None, what: str) -> TableInfo:
    """The table's columns (generated ones left out: pgoutput does not send them, see ``catalog``), key and split column."""
    row = conn.execute(
        "SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = to_regclass(%s)",
        (table,),
    ).fetchone()
    if row is None:
        raise PostgresSourceError(f"{what}: table {table!r} does not exist (or is not visible to this role)")
    oid, schema_name, rel_name = row
    cols = conn.execute(
        "SELECT a.attname, t.typname, a.atttypmod FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
        (oid,),
    ).fetchall()
    key = [
        r[0]
        for r in conn.execute(
            # The primary key; under REPLICA IDENTITY USING INDEX that unique index (what changes carry).
            "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END "
            "ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (oid,),
        ).fetchall()
    ]
    columns = []
    for name, typname, typmod in cols:
        if name in METADATA_COLUMNS:
            raise PostgresSourceError(f"{what}: table {schema_name}.{rel_name} has a column named {name!r}, which the source adds itself")
        st, as_text = spark_type(str(typname), int(typmod))
        columns.append(ColumnInfo(str(name), str(typname), st, as_text))
    names = [c.name for c in columns]
    if split_column is not None and split_column not in names:
        raise ConfigError(f"{what}: option 'splitColumn' names {split_column!r}, which is not a column of {schema_name}.{rel_name} ({', '.join(names)})")
    chosen = split_column or (key[0] if key else None)
    if chosen is None:
        raise PostgresSourceError(
            f"{what}: table {schema_name}.{rel_name} has no primary key. The snapshot is split by key ranges "
            "and changes are applied by key: add a primary key (ALTER TABLE ... ADD PRIMARY KEY (...)), or, "
            "for startup=snapshot only, name an orderable column with the option 'splitColumn'"
        )
    return TableInfo(str(schema_name), str(rel_name), tuple(columns), tuple(key), chosen)
