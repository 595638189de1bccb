"""Checking a multi-table stream against the database: replay it into per-table states, read the tables the same way.

:func:`replay` applies the stream rows a ``flinkish.parquet`` sink wrote (epoch by epoch, as
a keyed sink would: snapshot rows, then changes by ``(_lsn, _seq)``; at the end of an epoch with
a re-snapshot's ``E``, the keys it did not deliver since ``B`` are deleted) to one dict per table,
key -> row, independently of :func:`flinkish_spark.connectors.postgres.rows.split_tables`.
:func:`table_states` reads the server's tables as the same JSON rows (``row_sql``), so the
two compare value for value. A column a row does not carry (it was written before an
``ADD COLUMN``) counts as null; columns the table no longer has are not compared (a mirror
keeps a dropped column, null from then on).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
from typing import Any, Iterable

import pyarrow.parquet as pq

from flinkish_spark.connectors.postgres.rows import TableSchema, row_sql

State = dict[str, dict[tuple[Any, ...], dict[str, Any]]]


def _key(row: dict[str, Any], key: Iterable[str]) -> tuple[Any, ...]:
    return tuple(json.dumps(row.get(k)) for k in key)


def replay(path: str) -> tuple[State, collections.Counter[tuple[str, tuple[Any, ...]]]]:
    """The per-table states the stream under ``path`` makes, and how often each (table, key) came as a snapshot row."""
    by_epoch: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for f in glob.glob(os.path.join(path, "**", "part-*.parquet"), recursive=True):
        m = re.match(r"part-(\d+)-", os.path.basename(f))
        assert m, f
        by_epoch[int(m.group(1))].extend(pq.read_table(f).to_pylist())
    state: State = collections.defaultdict(dict)
    keys: dict[str, tuple[str, ...]] = {}
    snapshots: collections.Counter[tuple[str, tuple[Any, ...]]] = collections.Counter()
    resnapshot: dict[str, set[tuple[Any, ...]]] = {}  # table -> keys its re-snapshot delivered since 'B'
    for epoch in sorted(by_epoch):
        rows = by_epoch[epoch]
        closing: list[str] = []
        ordered = [r for r in rows if r["_lsn"] is None] + sorted((r for r in rows if r["_lsn"] is not None),
                                                                   key=lambda r: (r["_lsn"], r["_seq"]))
        for r in ordered:
            table, op = r["_table"], r["_op"]
            if op == "s":
                keys[table] = TableSchema.from_json(r["row"]).key
                continue
            if op == "t":
                state[table].clear()
                continue
            if op in ("B", "E"):
                if op == "B":
                    resnapshot[table] = set()
                else:
                    closing.append(table)  # applied at the end of the epoch: its r rows may come after
                continue
            row = json.loads(r["row"])
            k = _key(row, keys[table])
            if op == "d":
                state[table].pop(k, None)
            else:
                state[table][k] = row
                if op == "r":
                    snapshots[(table, k)] += 1
                    if table in resnapshot:
                        resnapshot[table].add(k)
        for table in closing:  # a re-snapshot ends: the keys it did not deliver are gone
            seen = resnapshot.pop(table)
            state[table] = {k: v for k, v in state[table].items() if k in seen}
    return state, snapshots


def table_states(conn: Any, tables: Iterable[str]) -> tuple[State, dict[str, TableSchema]]:
    """The server's ``tables`` (``schema.table``) as JSON rows by key, and their schemas, over a psycopg connection."""
    from flinkish_spark.connectors.postgres.rows.encode import SESSION_SETTINGS
    from flinkish_spark.connectors.postgres.source.catalog import load_table_schema, psycopg_query, table_oid
    from flinkish_spark.connectors.postgres.connection import qualified as quoted

    for k, v in SESSION_SETTINGS.items():
        conn.execute(f"SET {k} = '{v}'")
    state: State = {}
    schemas: dict[str, TableSchema] = {}
    for table in tables:
        sql_name = quoted(*table.split(".", 1))
        schema = load_table_schema(psycopg_query(conn), table_oid(conn, sql_name, "table_states"))
        assert schema is not None
        schemas[table] = schema
        rows = [json.loads(r[0]) for r in conn.execute(f"SELECT {row_sql(schema)} FROM {sql_name}").fetchall()]
        state[table] = {_key(r, schema.key): r for r in rows}
    return state, schemas


def differences(replayed: State, source: State, schemas: dict[str, TableSchema]) -> dict[str, Any]:
    """Per table, what differs between the replayed stream and the server (empty when the mirror is exact)."""
    out: dict[str, Any] = {}
    for table, rows in source.items():
        names = schemas[table].names
        mine = {k: {n: r.get(n) for n in names} for k, r in replayed.get(table, {}).items()}
        theirs = {k: {n: r.get(n) for n in names} for k, r in rows.items()}
        if mine != theirs:
            missing = [k for k in theirs if k not in mine]
            extra = [k for k in mine if k not in theirs]
            wrong = [(k, mine[k], theirs[k]) for k in theirs if k in mine and mine[k] != theirs[k]]
            out[table] = {"missing": missing[:5], "extra": extra[:5], "wrong": wrong[:3],
                          "counts": (len(mine), len(theirs))}
    return out
