"""How a multi-table stream carries a row: JSON text (the chosen encoding) vs Spark's VARIANT, measured.

The multi-table ``flinkish.postgres`` source has one Spark schema for rows of any table, so
a row travels as one value. Candidates on PySpark 4.3:

* **JSON text** in a string column (:mod:`flinkish_spark.connectors.postgres.rows`): the
  snapshot builds it on the server (``row_sql``, C code), changes are encoded in Python from
  pgoutput's text values (``RowEncoder``); sinks decode it with pyarrow's C++ JSON reader
  (``decode_rows``), Spark SQL with ``from_json(row, schema)``.
* **VARIANT** (a Python data source may yield it as ``struct<value, metadata>``): pyspark's
  ``VariantBuilder`` only parses JSON text, so a typed value (date, timestamp, binary,
  decimal) needs an encoder of the binary format in Python -- written here as fast as we could
  (one metadata per table, values packed with ``struct``); decoding to typed Arrow per table
  is Python per value (an own decoder, and pyspark's ``VariantUtils.to_python``); Spark SQL
  reads it with ``variant_get``.

For a realistic table (10 columns: bigint, int, numeric(12,2), numeric(40,10), timestamptz,
date, bytea, text[], jsonb, text) of ``--rows`` rows on the embedded PostgreSQL, this
measures rows/s of: the snapshot read (typed ADBC Arrow = today's single-table source, the
server-built JSON, typed Arrow + Python VARIANT encode), the change encode from text (JSON,
VARIANT), the decode to typed Arrow (pyarrow JSON reader, Python VARIANT decoders), and
Spark's decode of a cached DataFrame (``from_json`` vs ``variant_get``, all 10 columns, noop
sink). Then exactness per type on edge values (numeric of 50 digits, NaN, infinity, BC,
bytea, arrays, json text, interval, uuid): each decode path against psycopg's typed values.

    python benchmarks/row_encoding.py [--rows 200000] [--repeats 3] [--no-spark]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.connectors.postgres.rows import RowEncoder, TableSchema, decode_rows, row_sql  # noqa: E402
from flinkish_spark.connectors.postgres.rows.encode import SESSION_SETTINGS  # noqa: E402

TABLE_DDL = """CREATE TABLE bench (id bigint PRIMARY KEY, qty int, price numeric(12,2), total numeric(40,10),
  created timestamptz, day date, blob bytea, tags text[], attrs jsonb, note text)"""
FILL = """INSERT INTO bench SELECT g, g % 1000, (g % 100000) / 100.0, g * 1234567.0123456789 + 1e25,
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1.5 second', date '2020-01-01' + g % 2000,
  decode(md5(g::text), 'hex'), ARRAY['tag' || g % 10, 'x'], jsonb_build_object('k', g, 'color', 'red'),
  'note ' || md5(g::text) FROM generate_series(1, %s) g"""
EDGE_DDL = """CREATE TABLE edge (id int PRIMARY KEY, n numeric(12,2), n40 numeric(40,10), nn numeric, f8 float8,
  tstz timestamptz, ts timestamp, d date, ba bytea, ai int[], at text[], j json, jb jsonb, iv interval, u uuid)"""
EDGE_ROWS = [
    "(1, 12.30, 123456789012345678901234567890.0123456789, 12345678901234567890123456789012345678901234567890.5, "
    "0.1, '2024-01-02 03:04:05.123456+05:30', '2024-01-02 03:04:05.000001', '2024-02-29', '\\x00ff10', "
    "'{1,NULL,3}', '{\"a b\",NULL,\"q\\\"x\"}', '{\"a\":  [1, 2.50]}', '{\"b\": 1.000000000000000000000000000000000000001}', "
    "'1 year 2 mons 3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')",
    "(2, 'NaN', NULL, 'NaN', 'NaN', 'infinity', '-infinity', '0044-03-15 BC', '\\x', '{}', '{}', 'null', '[]', '-1 days', NULL)",
    "(3, -0.01, -0.0000000001, 1e-40, 1e300, '1999-12-31 23:59:59.999999+00', '1970-01-01', '1970-01-01', "
    "'\\x0102', '{{1,2},{3,4}}', '{\"\"}', '{}', '{\"k\": [true, null]}', '00:00:00.000001', NULL)",
]


# -- VARIANT: an encoder of the binary format from typed values and from PostgreSQL text ------------

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_NTZ = datetime(1970, 1, 1)
_EPOCH_DAY = date(1970, 1, 1).toordinal()


def _v_str(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b) << 2 | 1]) + b if len(b) <= 63 else struct.pack("<BI", 16 << 2, len(b)) + b


def _v_int(i: int) -> bytes:
    return struct.pack("<Bq", 6 << 2, i)


def _v_decimal_text(t: str) -> bytes:
    if t in ("NaN", "Infinity", "-Infinity"):
        return _v_str(t)
    whole, _, frac = t.partition(".")
    return struct.pack("<BB", 10 << 2, len(frac)) + int(whole + frac).to_bytes(16, "little", signed=True)


def _v_decimal(d: Decimal) -> bytes:
    if not d.is_finite():
        return _v_str(str(d))
    sign, digits, exp = d.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    return struct.pack("<BB", 10 << 2, -int(exp)) + unscaled.to_bytes(16, "little", signed=True)


def _v_ts(dt: datetime) -> bytes:
    delta = dt - _EPOCH
    return struct.pack("<Bq", 12 << 2, (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)


def _v_date(d: date) -> bytes:
    return struct.pack("<Bi", 11 << 2, d.toordinal() - _EPOCH_DAY)


def _v_binary(b: bytes) -> bytes:
    return struct.pack("<BI", 15 << 2, len(b)) + b


def _v_packed(parts: list[bytes]) -> tuple[int, bytes, bytes]:
    """(offset size, offset list, data) of an array's elements or an object's fields."""
    data = b"".join(parts)
    size = 1 if len(data) <= 0xFF else 2 if len(data) <= 0xFFFF else 3
    offsets, off = [], 0
    for p in parts:
        offsets.append(off.to_bytes(size, "little"))
        off += len(p)
    offsets.append(off.to_bytes(size, "little"))
    return size, b"".join(offsets), data


def _v_array(items: list[bytes]) -> bytes:
    size, offsets, data = _v_packed(items)
    return bytes([((size - 1) << 2) | 3, len(items)]) + offsets + data


_NULL = bytes([0])


class VariantTable:
    """Encoder/decoder of one table's rows as VARIANT objects (keys fixed per table, sorted)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.order = sorted(range(len(names)), key=lambda i: names[i])
        keys = [names[i].encode() for i in self.order]
        offsets, off = [0], 0
        for k in keys:
            off += len(k)
            offsets.append(off)
        self.metadata = bytes([1 | 0x10]) + bytes([len(keys)]) + bytes(offsets) + b"".join(keys)  # 1-byte offsets
        self.ids = bytes(range(len(keys)))

    def encode(self, values: list[bytes]) -> bytes:
        parts = [values[i] for i in self.order]
        size, offsets, data = _v_packed(parts)
        return bytes([(size - 1) << 2 | 2, len(parts)]) + self.ids + offsets + data

    def decode_fields(self, value: bytes) -> dict[str, Any]:
        """One object's fields as Python values (the own fast decoder)."""
        size = ((value[0] >> 2) & 3) + 1
        n = value[1]
        id_start = 2
        off_start = id_start + n
        data_start = off_start + (n + 1) * size
        out = {}
        keys = [self.names[i] for i in self.order]
        for j in range(n):
            o = int.from_bytes(value[off_start + j * size: off_start + (j + 1) * size], "little")
            out[keys[value[id_start + j]]] = _v_decode(value, data_start + o)
        return out


def _v_decode(v: bytes, pos: int) -> Any:
    h = v[pos]
    basic, info = h & 3, h >> 2
    if basic == 1:
        return v[pos + 1: pos + 1 + info].decode()
    if basic == 3:
        size = (info & 3) + 1
        n = v[pos + 1]
        off_start = pos + 2
        data_start = off_start + (n + 1) * size
        return [_v_decode(v, data_start + int.from_bytes(v[off_start + j * size: off_start + (j + 1) * size], "little"))
                for j in range(n)]
    if info == 0:
        return None
    if info == 6:
        return struct.unpack_from("<q", v, pos + 1)[0]
    if info == 10:
        scale = v[pos + 1]
        return Decimal(int.from_bytes(v[pos + 2: pos + 18], "little", signed=True)).scaleb(-scale)
    if info == 12:
        return _EPOCH + timedelta(microseconds=struct.unpack_from("<q", v, pos + 1)[0])
    if info == 13:
        return _EPOCH_NTZ + timedelta(microseconds=struct.unpack_from("<q", v, pos + 1)[0])
    if info == 11:
        return date.fromordinal(_EPOCH_DAY + struct.unpack_from("<i", v, pos + 1)[0])
    if info == 15:
        n = struct.unpack_from("<I", v, pos + 1)[0]
        return v[pos + 5: pos + 5 + n]
    if info == 16:
        n = struct.unpack_from("<I", v, pos + 1)[0]
        return v[pos + 5: pos + 5 + n].decode()
    if info == 7:
        return struct.unpack_from("<d", v, pos + 1)[0]
    if info in (1, 2):
        return info == 1
    raise ValueError(f"variant type {info}")


def variant_from_typed(row: tuple[Any, ...]) -> list[bytes]:
    """The bench table's typed values (from Arrow) as VARIANT values."""
    i, qty, price, total, created, day, blob, tags, attrs, note = row
    return [
        _v_int(i), _NULL if qty is None else _v_int(qty), _v_decimal_text(price) if isinstance(price, str) else _v_decimal(price), _v_str(str(total)), _v_ts(created),
        _v_date(day), _v_binary(blob), _v_array([_v_str(t) for t in tags]), _v_str(attrs), _v_str(note),
    ]


def variant_from_text(row: tuple[str, ...]) -> list[bytes]:
    """The bench table's PostgreSQL text values (what pgoutput sends) as VARIANT values."""
    i, qty, price, total, created, day, blob, tags, attrs, note = row
    arr = _pg_array_items(tags)
    return [
        _v_int(int(i)), _v_int(int(qty)), _v_decimal_text(price), _v_str(total),
        _v_ts(datetime.fromisoformat(created)), _v_date(date.fromisoformat(day)), _v_binary(bytes.fromhex(blob[2:])),
        _v_array([_v_str(t) for t in arr]), _v_str(attrs), _v_str(note),
    ]


def _pg_array_items(text: str) -> list[str]:
    """A 1-D text array's elements (PostgreSQL's array text parsed by the JSON encoder's parser)."""
    import json as _json

    from flinkish_spark.connectors.postgres.rows.encode import _array_json

    return _json.loads(_array_json(text, lambda v: _json.dumps(v)))


def variant_struct(values: list[bytes], metadata: bytes) -> pa.StructArray:
    fields = [pa.field("value", pa.binary(), nullable=False),
              pa.field("metadata", pa.binary(), nullable=False, metadata={b"variant": b"true"})]
    return pa.StructArray.from_arrays([pa.array(values, pa.binary()), pa.array([metadata] * len(values), pa.binary())],
                                      fields=fields)


def current_schema(conn: Any, table: str) -> TableSchema:
    from flinkish_spark.connectors.postgres.source.catalog import load_table_schema, psycopg_query, table_oid

    schema = load_table_schema(psycopg_query(conn), table_oid(conn, table, table))
    assert schema is not None
    return schema


# -- measuring ------------------------------------------------------------------------------------------


def rate(fn: Callable[[], Any], rows: int, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return rows / statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from flinkish_spark.embedded.postgres import start_postgres

    home = tempfile.mkdtemp(prefix="flinkish-bench-rows-")
    pg = start_postgres(os.path.join(home, "data"))
    results: dict[str, Any] = {"rows": args.rows}
    try:
        url = pg.uri
        conn = psycopg.connect(url, autocommit=True)
        for k, v in SESSION_SETTINGS.items():
            conn.execute(f"SET {k} = '{v}'")
        conn.execute(TABLE_DDL)
        conn.execute(FILL.replace("%s", str(args.rows)))
        conn.execute("ANALYZE bench")
        schema = current_schema(conn, "bench")
        vt = VariantTable(list(schema.names))
        ad = adbc.connect(url)
        cur = ad.cursor()
        for k, v in SESSION_SETTINGS.items():
            cur.execute(f"SET {k} = '{v}'")

        def read(query: str) -> pa.Table:
            cur.execute(query)
            return cur.fetch_arrow_table()

        n = args.rows
        enc: dict[str, float] = {}
        enc["snapshot typed Arrow (ADBC), today's single-table read"], typed = rate(lambda: read("SELECT * FROM bench"), n, args.repeats)
        enc["snapshot JSON built by the server (ADBC)"], json_rows = rate(
            lambda: read(f"SELECT {row_sql(schema)} AS row FROM bench"), n, args.repeats)
        json_rows = json_rows.column(0)

        def typed_to_variant() -> pa.StructArray:
            cols = [typed.column(c).to_pylist() for c in schema.names]
            cols[8] = [str(v) for v in cols[8]]  # jsonb arrives as text
            return variant_struct([vt.encode(variant_from_typed(r)) for r in zip(*cols)], vt.metadata)

        enc["snapshot typed Arrow + VARIANT encode (Python)"], variants = rate(
            lambda: (read("SELECT * FROM bench"), typed_to_variant())[1], n, args.repeats)
        texts = conn.execute("SELECT " + ", ".join(f"{c}::text" for c in schema.names) + " FROM bench").fetchall()
        encoder = RowEncoder(schema)
        names = list(schema.names)
        enc["changes: text -> JSON (Python)"], _ = rate(
            lambda: pa.array([encoder.encode(dict(zip(names, r))) for r in texts], pa.string()), n, args.repeats)
        enc["changes: text -> VARIANT (Python)"], _ = rate(
            lambda: variant_struct([vt.encode(variant_from_text(r)) for r in texts], vt.metadata), n, args.repeats)

        dec: dict[str, float] = {}
        dec["JSON -> typed Arrow (pyarrow C++ reader)"], decoded = rate(lambda: decode_rows(json_rows, schema), n, args.repeats)
        values = variants.field("value").to_pylist()

        def variant_to_arrow() -> pa.Table:
            rows = [vt.decode_fields(v) for v in values]
            return pa.table({c: [r.get(c) for r in rows] for c in schema.names})

        dec["VARIANT -> typed Arrow (own Python decoder)"], _ = rate(variant_to_arrow, n, args.repeats)
        from pyspark.sql.variant_utils import VariantUtils

        sample = min(n, 20_000)
        metas = variants.field("metadata").to_pylist()
        dec["VARIANT -> Python (pyspark VariantUtils.to_python)"], _ = rate(
            lambda: [VariantUtils.to_python(v, m) for v, m in zip(values[:sample], metas[:sample])], sample, 1)
        assert decoded.num_rows == n

        results["encode_rows_per_s"] = {k: round(v) for k, v in enc.items()}
        results["decode_rows_per_s"] = {k: round(v) for k, v in dec.items()}
        results["bytes_per_row"] = {
            "typed Arrow": round(typed.nbytes / n), "JSON text": round(json_rows.nbytes / n),
            "VARIANT (value + metadata)": round(variants.nbytes / n),
        }
        spark = None
        if not args.no_spark:
            import flinkish_spark

            spark = flinkish_spark.session(app_name="bench-rows")
            results["spark_rows_per_s"] = spark_decode(spark, json_rows, variants, schema, min(n, 200_000), args.repeats)
        results["exactness"] = exactness(conn, ad, url, spark)
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)

    print(f"\nrow encoding, {args.rows} rows of a 10-column table (rows/s, median of {args.repeats})\n")
    print_table(["encode", "rows/s"], [(k, f"{v:,}") for k, v in results["encode_rows_per_s"].items()])
    print()
    print_table(["decode to typed Arrow", "rows/s"], [(k, f"{v:,}") for k, v in results["decode_rows_per_s"].items()])
    print()
    print_table(["bytes per row", ""], list(results["bytes_per_row"].items()))
    if "spark_rows_per_s" in results:
        print()
        print_table(["Spark decode (cached, 10 columns, noop)", "rows/s"],
                    [(k, f"{v:,}") for k, v in results["spark_rows_per_s"].items()])
    print()
    paths = sorted({p for row in results["exactness"].values() for p in row})
    print_table(["type"] + paths, [[t] + [row.get(p, "") for p in paths] for t, row in results["exactness"].items()])
    print("\nwrote", write_results("row_encoding", results))


def spark_decode(spark: Any, json_rows: pa.ChunkedArray, variants: pa.StructArray, schema: TableSchema, n: int,
                 repeats: int) -> dict[str, float]:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    step = 10_000  # rows per partition, read as batches of 2,000 from an Arrow file (never pickled into the tasks)
    folder = tempfile.mkdtemp(prefix="flinkish-bench-rows-spark-")
    files = {}
    for kind, column in (("json", json_rows.combine_chunks()[:n]), ("variant", variants[:n])):
        files[kind] = os.path.join(folder, f"{kind}.arrow")
        table = pa.table({"row": column})
        with pa.OSFile(files[kind], "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=2_000)

    class R(DataSourceReader):
        def __init__(self, path: str) -> None:
            self.path = path

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(0, n, step)]

        def read(self, partition: InputPartition) -> Any:
            reader = pa.ipc.open_file(pa.memory_map(self.path))
            first = partition.value // 2_000
            for i in range(first, min(reader.num_record_batches, first + step // 2_000)):
                yield reader.get_batch(i)

    class D(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_rows"

        def schema(self) -> str:
            return "row " + ("string" if self.options.get("kind") == "json" else "variant")

        def reader(self, schema: Any) -> DataSourceReader:
            return R(files[self.options["kind"]])

    spark.dataSource.register(D)
    out = {}
    exprs = {
        "json": [f"from_json(row, '{schema.spark_ddl()}') AS r"],
        "variant": [f"variant_get(row, '$.{c.name}', '{c.spark_type}') AS {c.name}" for c in schema.columns],
    }
    for kind, label in (("json", "from_json(row, schema)"), ("variant", "variant_get per column")):
        df = spark.read.format("bench_rows").option("kind", kind).load().cache()
        df.count()
        sel = df.selectExpr(*exprs[kind])
        if kind == "json":
            sel = sel.select("r.*")
        out[label], _ = rate(lambda: sel.write.format("noop").mode("overwrite").save(), n, repeats)
        df.unpersist()
    shutil.rmtree(folder, ignore_errors=True)
    return {k: round(v) for k, v in out.items()}


def variant_of(v: Any) -> bytes:
    """Any psycopg value as a VARIANT value: the most exact form the format has (strings beyond it)."""
    import json as _json

    if v is None:
        return _NULL
    if isinstance(v, bool):
        return bytes([(1 if v else 2) << 2])
    if isinstance(v, int):
        return _v_int(v)
    if isinstance(v, float):
        return struct.pack("<Bd", 7 << 2, v)
    if isinstance(v, Decimal):
        if v.is_finite() and len(v.as_tuple().digits) <= 38 and 0 <= -int(v.as_tuple().exponent) <= 38:
            return _v_decimal(v)
        return _v_str(str(v))
    if isinstance(v, datetime):
        if v.tzinfo is not None:
            return _v_ts(v)
        delta = v - _EPOCH_NTZ
        return struct.pack("<Bq", 13 << 2, (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if isinstance(v, date):
        return _v_date(v)
    if isinstance(v, (bytes, memoryview)):
        return _v_binary(bytes(v))
    if isinstance(v, list):
        return _v_array([variant_of(x) for x in v])
    if isinstance(v, (dict,)):
        return _v_str(_json.dumps(v))
    return _v_str(str(v))


def edge_truth(url: str, names: list[str]) -> list[dict[str, Any]]:
    """psycopg's typed value of each cell of the edge table; a value Python cannot hold is ('text', its text)."""
    import psycopg

    out = []
    with psycopg.connect(url, autocommit=True) as c:
        for k, v in SESSION_SETTINGS.items():
            c.execute(f"SET {k} = '{v}'")
        c.execute("SET TimeZone = 'UTC'")
        for (rid,) in c.execute("SELECT id FROM edge ORDER BY id").fetchall():
            row = {}
            for name in names:
                try:
                    row[name] = c.execute(f"SELECT {name} FROM edge WHERE id = %s", (rid,)).fetchone()[0]
                except psycopg.DataError:
                    row[name] = ("text", c.execute(f"SELECT {name}::text FROM edge WHERE id = %s", (rid,)).fetchone()[0])
            out.append(row)
    return out


def exactness(conn: Any, ad: Any, url: str, spark: Any) -> dict[str, dict[str, str]]:
    """Per type of the edge table: does each decode path give back psycopg's typed value?"""
    conn.execute(EDGE_DDL)
    conn.execute("INSERT INTO edge VALUES " + ", ".join(EDGE_ROWS))
    schema = current_schema(conn, "edge")
    cur = ad.cursor()
    cur.execute(f"SELECT {row_sql(schema)} AS row FROM edge ORDER BY id")
    rows = cur.fetch_arrow_table().column(0)
    truth = edge_truth(url, list(schema.names))
    paths: dict[str, list[dict[str, Any]]] = {"JSON -> pyarrow": decode_rows(rows, schema).to_pylist()}
    vt = VariantTable(list(schema.names))
    variants = variant_struct([vt.encode([variant_of(None if isinstance(r[n], tuple) else r[n]) for n in schema.names])
                               for r in truth], vt.metadata)
    paths["VARIANT -> Python (own decoder)"] = [vt.decode_fields(v) for v in variants.field("value").to_pylist()]
    if spark is not None:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        jdf = spark.createDataFrame([(r,) for r in rows.to_pylist()], "row string")
        paths["JSON -> Spark from_json"] = [r.asDict() for r in jdf.selectExpr(
            f"from_json(row, '{schema.spark_ddl()}') AS r").select("r.*").collect()]
        paths["VARIANT -> Spark variant_get"] = [r.asDict() for r in spark_variant_rows(spark, variants).selectExpr(
            *[f"try_variant_get(row, '$.{c.name}', '{c.spark_type}') AS {c.name}" for c in schema.columns]).collect()]
    out: dict[str, dict[str, str]] = {}
    for col in schema.columns:
        verdicts: dict[str, str] = {}
        for path, got_rows in paths.items():
            vs = [_same(want[col.name], got[col.name], col.spark_type) for want, got in zip(truth, got_rows)]
            bad = sorted({v for v in vs if v != "exact"})
            verdicts[path] = "exact" if not bad else "; ".join(bad)[:70]
        out[f"{col.name} {col.type}"] = verdicts
    return out


def spark_variant_rows(spark: Any, variants: pa.StructArray) -> Any:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    batch = pa.record_batch([variants], names=["row"])

    class R(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Any:
            yield batch

    class D(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_edge_variant"

        def schema(self) -> str:
            return "row variant"

        def reader(self, schema: Any) -> DataSourceReader:
            return R()

    spark.dataSource.register(D)
    return spark.read.format("bench_edge_variant").load()


def _same(want: Any, got: Any, spark_type: str) -> str:
    import json as _json
    import math
    from datetime import timedelta as _td

    if isinstance(want, tuple):  # no Python value (infinity, BC): null is the best a typed reader can do
        return f"{want[1]}->null" if got is None else f"{want[1]}->{got!r}"
    if want is None:
        if got == "null" and spark_type == "string":
            return "exact (as JSON text)"  # a json column holding the JSON literal null (psycopg loads it as None)
        return "exact" if got is None else f"null->{got!r}"
    if isinstance(want, float) and math.isnan(want):
        return "exact" if isinstance(got, float) and math.isnan(got) else f"NaN->{got!r}"
    if isinstance(want, Decimal) and not want.is_finite():
        if isinstance(got, str) and got == str(want):
            return "exact (as text)"
        return f"{want}->{got!r}"
    if got is None:
        return f"{str(want)[:20]}->null"
    if isinstance(want, (dict, list)) and isinstance(got, str):
        return "exact (as JSON text)" if _json.loads(got) == want else f"{want!r}->{got!r}"
    if isinstance(want, Decimal) and isinstance(got, str):
        return "exact (as text)" if Decimal(got) == want and Decimal(got).as_tuple() == want.as_tuple() else f"{want}->{got}"
    if isinstance(want, _td) and isinstance(got, str):
        return "exact (as text)"
    if isinstance(want, (bytes, memoryview)):
        return "exact" if bytes(want) == bytes(got) else "bytes differ"
    if isinstance(want, datetime) and isinstance(got, datetime):
        a = want if want.tzinfo is None else want.astimezone(timezone.utc).replace(tzinfo=None)
        b = got if got.tzinfo is None else got.astimezone(timezone.utc).replace(tzinfo=None)
        return "exact" if a == b else f"{want}->{got}"
    if not isinstance(want, str) and isinstance(got, str):
        return "exact (as text)" if str(want) == got else f"{want!r}->{got!r}"
    return "exact" if want == got else f"{str(want)[:30]}->{str(got)[:30]}"


if __name__ == "__main__":
    main()
