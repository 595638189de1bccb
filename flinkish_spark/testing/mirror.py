"""Checking a multi-table stream against the database: replay it into per-table states, read the tables the same way.

:func:`replay` applies the stream rows a ``flinkish.parquet`` sink wrote (epoch by epoch, as
a keyed sink would: snapshot rows, then changes by ``(_lsn, _seq)``; at the end of an epoch with
a re-snapshot's ``E``, the keys no row since the epoch holding ``B`` wrote are deleted) to one dict per table,
key -> row, independently of :func:`flinkish_spark.connectors.postgres.rows.split_tables` (a column an
update lists as unchanged keeps the key's value).
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
from decimal import Decimal
from typing import Any, Callable, Iterable

import pyarrow.parquet as pq

from flinkish_spark.connectors.lakehouse.table_modes import TableModes, parse_table_modes
from flinkish_spark.connectors.lakehouse.transform.hooks import as_target
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms, parse_transforms
from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD, TableSchema
from flinkish_spark.mirror.compare import compare_rows, current_rows, delta_reader, rows_by_key, source_rows
from flinkish_spark.testing.spark_log import committed_batches

State = dict[str, dict[tuple[Any, ...], dict[str, Any]]]

#: Tables m_a, m_b, m_c, m_drop (matching ``public.m_*``) and ``other``, with exact types and rows.
SETUP = """
CREATE TABLE m_a (id bigint PRIMARY KEY, v text, n numeric(40,10), ts timestamptz, b bytea, tags text[]);
CREATE TABLE m_b (k text PRIMARY KEY, j jsonb, d date, nn numeric);
CREATE TABLE m_c (id int PRIMARY KEY, amount numeric(12,2), f float8);
CREATE TABLE m_drop (id int PRIMARY KEY, v text);
CREATE TABLE other (id int PRIMARY KEY, v text);
INSERT INTO m_a SELECT g, 'a' || g, g * 1234567.0123456789, timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000001 s',
  decode(md5(g::text), 'hex'), ARRAY['t' || g % 7, 'x y'] FROM generate_series(1, 3000) g;
INSERT INTO m_b SELECT 'k' || g, jsonb_build_object('g', g, 'big', 1.000000000000000000000000000000000000001),
  date '2020-01-01' + g, 12345678901234567890123456789012345678901234567890.5 + g FROM generate_series(1, 1500) g;
INSERT INTO m_c SELECT g, g / 100.0, g * 0.1 FROM generate_series(1, 1000) g;
INSERT INTO m_drop SELECT g, 'd' FROM generate_series(1, 100) g;
INSERT INTO other SELECT g, 'o' FROM generate_series(1, 100) g;
"""

#: A writer process (argv: url, stop file, Spark commits folder): changes every table until the stop file
#: exists; after two committed epochs it adds m_a.extra, widens m_c.amount, creates m_new, drops m_drop.
WRITER = r'''
import os, random, sys, time, psycopg
url, stop_file, commits_dir = sys.argv[1], sys.argv[2], sys.argv[3]
rnd = random.Random(7)
next_id = 1_000_000
ddl_at, ddl_done = None, 0
def committed():
    return sum(1 for n in os.listdir(commits_dir) if n.isdigit()) if os.path.isdir(commits_dir) else 0
with psycopg.connect(url, autocommit=True) as conn:
    while not os.path.exists(stop_file):
        if ddl_at is None and committed() >= 2:
            ddl_at = time.time()  # the pipeline runs: schema changes and new tables from now on
        if ddl_at is not None and ddl_done < 4 and time.time() - ddl_at > 2 * ddl_done:
            [lambda: conn.execute("ALTER TABLE m_a ADD COLUMN extra int"),
             lambda: conn.execute("ALTER TABLE m_c ALTER COLUMN amount TYPE numeric(14,2)"),
             lambda: (conn.execute("CREATE TABLE m_new (id int PRIMARY KEY, u uuid, iv interval, f float8)"),
                      conn.execute("INSERT INTO m_new SELECT g, gen_random_uuid(), g * interval '1.5 day', g / 3.0 "
                                   "FROM generate_series(1, 700) g")),
             lambda: conn.execute("DROP TABLE m_drop")][ddl_done]()
            ddl_done += 1
        k = rnd.randint(1, 3000)
        op = rnd.random()
        with conn.transaction():
            if op < 0.3:
                conn.execute("INSERT INTO m_a (id, v, n, ts, b, tags) VALUES (%s, 'new', 1.5, now(), '\\x00', '{a}')", (next_id,))
                next_id += 1
            elif op < 0.5:
                conn.execute("UPDATE m_a SET v = v || '+', n = n * 3, tags = tags || 'u'::text WHERE id = %s", (k,))
                if ddl_done >= 1:
                    conn.execute("UPDATE m_a SET extra = %s WHERE id = %s", (k, k + 1))
            elif op < 0.6:
                conn.execute("UPDATE m_a SET id = %s WHERE id = %s", (next_id, k))  # a key change
                next_id += 1
            elif op < 0.7:
                conn.execute("DELETE FROM m_a WHERE id = %s", (k,))
            elif op < 0.8:
                conn.execute("UPDATE m_b SET j = j || '{\"u\": 1}', nn = nn * 2 WHERE k = %s", (f"k{k % 1500}",))
                conn.execute("DELETE FROM m_b WHERE k = %s", (f"k{(k * 7) % 1500}",))
            elif op < 0.9:
                conn.execute("UPDATE m_c SET amount = amount + 0.01, f = f / 3 WHERE id = %s", (k % 1000,))
                conn.execute("UPDATE other SET v = v || '+' WHERE id = %s", (k % 100,))
                if ddl_done < 4:
                    conn.execute("UPDATE m_drop SET v = v || '+' WHERE id = %s", (k % 100,))
            elif ddl_done >= 3:
                conn.execute("UPDATE m_new SET f = f * 2, iv = iv + interval '1 s' WHERE id = %s", (k % 700,))
                conn.execute("INSERT INTO m_new VALUES (%s, gen_random_uuid(), '1 hour', 0.5)", (next_id,))
                next_id += 1
        time.sleep(0.004)
'''


#: Columns and rows chosen for :data:`SETUP`'s tables under :data:`WRITER` (a routing sink's ``transforms``, issue 30
#: item 2): m_a never gets b nor the column the writer adds (extra), and gets ``vlen`` (three values: the lakehouse
#: runs partition m_a by it, :data:`PARTITIONED_M_A`; the writer's ``v || '+'`` moves keys between its values);
#: m_c's rows enter as the writer divides f (``amount > f``), without f, with computed columns; m_new's rows leave
#: as the writer doubles f and enter as it inserts, without iv.
WORKLOAD_TRANSFORMS = json.dumps([
    {"tables": "public.m_a", "columns.exclude": ["b", "extra"],
     "computed": {"vlen": "CASE WHEN length(v) <= 4 THEN 'short' WHEN length(v) = 5 THEN 'mid' ELSE 'long' END"}},
    {"tables": "public.m_c", "columns.exclude": "f", "filter": "amount > f",
     "computed": {"cents": "CAST(amount * 100 AS bigint)", "src": "_source_table"}},
    {"tables": "public.m_new", "projection": "* EXCEPT (iv), concat('n', CAST(id AS string)) AS tag", "filter": "f < 100"}])


#: m_a's rule in the lakehouse runs (soft deletes, partitioned by :data:`WORKLOAD_TRANSFORMS`'s ``vlen``).
PARTITIONED_M_A = {"tables": "public.m_a", "deletes": "soft", "partitionBy": ["vlen"]}
#: m_b's rule: history tracking only j (``trackHistoryColumns``). The writer's first update of a key adds "u" to j
#: (a version), each later one changes only nn (``j || '{"u": 1}'`` leaves j as it is): the current version is
#: updated in place (:func:`tracked_history_problems`).
TRACKED_M_B = {"tables": "public.m_b", "mode": "history", "trackHistoryColumns": ["j"]}
#: m_b's nn before any update (``SETUP``: this plus the key's number); each update doubles it.
_NN0 = Decimal("12345678901234567890123456789012345678901234567890.5")


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
        for r in rows:  # a 'B' counts for the whole epoch: its tasks' rows come in any order
            if r["_op"] == "B":
                resnapshot[r["_table"]] = set()
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
                if op == "E":
                    closing.append(table)  # applied at the end of the epoch: its r rows may come after
                continue
            row = json.loads(r["row"])
            k = _key(row, keys[table])
            if op == "d":
                state[table].pop(k, None)
            else:
                unchanged = row.pop(UNCHANGED_FIELD, None) or ()  # not carried: the key's value stays
                state[table][k] = {**{c: state[table].get(k, {}).get(c) for c in unchanged}, **row}
                if op == "r":
                    snapshots[(table, k)] += 1
                if table in resnapshot:  # as the keyed sinks: every key written since 'B', changes too
                    resnapshot[table].add(k)
        for table in closing:  # a re-snapshot ends: the keys it did not deliver are gone
            seen = resnapshot.pop(table)
            state[table] = {k: v for k, v in state[table].items() if k in seen}
    return state, snapshots


def table_states(conn: Any, tables: Iterable[str]) -> tuple[State, dict[str, TableSchema]]:
    """The server's ``tables`` (``schema.table``) as JSON rows by key, and their schemas, over a psycopg connection
    (read as :func:`flinkish_spark.mirror.compare.source_rows` reads them)."""
    state: State = {}
    schemas: dict[str, TableSchema] = {}
    for table in tables:
        schema, texts = source_rows(conn, table)
        schemas[table] = schema
        rows = [json.loads(t) for t in texts]
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


def target_differences(read: Callable[[str], Any], source: State, schemas: dict[str, TableSchema],
                       modes: TableModes = TableModes(), transforms: Transforms = Transforms()) -> dict[str, Any]:
    """Per source table, what differs between its routed target (``read(table)``: its rows as an Arrow table
    as a reader of the format sees them, None when there is no target) and the server's rows decoded to the
    stream's Arrow types (:func:`flinkish_spark.mirror.compare.compare_rows`; ``modes``: each target's shape, whose
    current rows are compared; ``transforms``: the columns and rows each target gets, ``as_target``); empty when
    every target is equal."""
    from flinkish_spark.connectors.postgres.rows import decode_rows

    out: dict[str, Any] = {}
    for table, rows in source.items():
        schema, theirs = as_target(transforms, table, schemas[table],
                                   decode_rows([json.dumps(r) for r in rows.values()], schemas[table]))
        mode = modes.of(table)
        target = read(table)
        result = compare_rows(table, schema, theirs, target, mode)
        target = current_rows(target, mode)
        if target is None:
            out[table] = "no target"
        elif not result.equal:
            mine, wanted = rows_by_key(target, schema), rows_by_key(theirs, schema)
            out[table] = {"missing": result.missing[:5], "extra": result.extra[:5],
                          "wrong": [(k, mine[k], wanted[k]) for k in result.different[:3]],
                          "counts": (result.target_rows, result.source_rows)}
    return out


def delta_differences(root: str, source: State, schemas: dict[str, TableSchema],
                      options: dict[str, str] | None = None) -> dict[str, Any]:
    """:func:`target_differences` of the routed Delta targets ``root/<schema>/<table>`` (delta-rs's scan,
    deletion vectors applied); ``options``: the sink's storage options for an ``s3://`` root (``endpointUrl``),
    its table modes and its route rules (``routes``: a merged shard is compared with its rows of the target)."""
    return target_differences(delta_reader(root, options), source, schemas,
                              parse_table_modes((options or {}).get, "test"), parse_transforms((options or {}).get, "test"))


def slots_and_publications(url: str) -> tuple[int, list[str]]:
    """The database's replication slots (how many) and publications (names)."""
    import psycopg

    with psycopg.connect(url) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()
        pubs = [r[0] for r in conn.execute("SELECT pubname FROM pg_publication").fetchall()]
    return int(slots[0]) if slots else 0, pubs


def run_workload(run_pipeline: Any, spec: Any, url: str, checkpoint_location: str, work_dir: str,
                 kills: int, seed: int, crash_at: str | None = None, epochs_after_ddl: int = 5) -> None:
    """:data:`SETUP`, then :data:`WRITER` running while ``spec(**extra)`` (a ``run_pipeline`` spec with a
    1-second trigger) is killed ``kills`` times at random moments after a commit (one slot and one
    publication after each kill) -- and once more at the named point ``crash_at`` when given --; the same
    spec is run once more until the writer's schema changes, new table and dropped table are all done in
    the source and ``epochs_after_ddl`` more epochs are committed, then the writer stops and a stop with
    drain (what ``flinkish stop --drain`` sends) ends that run: ``QUERY_END=drained``.

    The last run ends on a condition, not after a fixed time, and drains itself: one driver start and
    a 25 s wait fewer than a timed run followed by a drained restart (docs/testing.md)."""
    import random
    import subprocess
    import sys
    import threading
    import time

    import psycopg

    from flinkish_spark.errors import ConfigError
    from flinkish_spark.finish.stop_request import request_stop
    from flinkish_spark.io.fileio import FileIO

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
    stop_file = os.path.join(work_dir, "stop-writer")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url, stop_file, os.path.join(checkpoint_location, "commits")])
    source = spec()["source"]["options"]
    endpoint = source.get("endpointUrl")
    io = FileIO.for_url(source["checkpoint"], {"endpoint_url": endpoint} if endpoint else None)
    runs: dict[str, Any] = {}
    last_run = threading.Thread(target=lambda: runs.setdefault("last", run_pipeline(spec(end="external", runSeconds=300), timeout=400)),
                                daemon=True)
    try:
        rng = random.Random(seed)
        for kill in range(kills):
            before = len(committed_batches(checkpoint_location))
            # 0.5-4 s after the run's second commit: one to a few 1-second epochs on, anywhere in their cycle
            # (2-8 s made each kill run wait 5 s more on average, for no point of the cycle it did not reach).
            delay = rng.uniform(0.5, 4.0)
            run = run_pipeline(spec(), kill_after=delay, kill_when=lambda: len(committed_batches(checkpoint_location)) > before + 1)
            assert run.killed, f"expected a kill {delay:.1f}s after a commit, got rc={run.returncode}:\n{run.output[-3000:]}"
            assert slots_and_publications(url) == (1, ["flinkish_mirror"]), kill  # one slot, one publication
        if crash_at is not None:
            run = run_pipeline(spec(), crash_at=crash_at)
            assert run.killed, f"expected a kill at {crash_at}, got rc={run.returncode}:\n{run.output[-3000:]}"
            assert slots_and_publications(url) == (1, ["flinkish_mirror"]), crash_at
        last_run.start()
        deadline = time.time() + 300

        def wait(what: str, check: Callable[[], bool]) -> None:
            while not check():
                assert last_run.is_alive(), f"the last run ended before {what}:\n" + \
                    (runs["last"].output[-3000:] if "last" in runs else "")
                assert time.time() < deadline, f"no {what} within 300 s"
                time.sleep(0.3)

        def ddl_done() -> bool:  # the writer's last step drops m_drop (after the new column, the widening, m_new)
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute("SELECT to_regclass('public.m_drop') IS NULL").fetchone()
                return row is not None and bool(row[0])

        wait("the writer's schema changes, new and dropped table", ddl_done)
        after = len(committed_batches(checkpoint_location))
        wait(f"{epochs_after_ddl} epochs after them",
             lambda: len(committed_batches(checkpoint_location)) >= after + epochs_after_ddl)
    finally:
        open(stop_file, "w").close()
        writer.wait(timeout=60)
        if last_run.is_alive():  # the writer stopped: drain (after a failed wait too: end the run, not wait for it)
            try:
                request_stop(io, source["checkpoint"], source["uid"], drain=True)
            except ConfigError:  # no lease yet (a failure above): the run ends by its runSeconds
                pass
            last_run.join(timeout=400)
    last = runs.get("last")
    assert last is not None, "the last run did not end within 400 s of the drain request"
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]


def history_problems(target: Any, key: Iterable[str], tracked: Iterable[str] | None = None) -> list[str]:
    """What is wrong with a history target (an Arrow table with ``_valid_from``, ``_valid_to``, ``_current``): per
    key its versions, ordered by ``_valid_from``, must not overlap -- each closed at or before the next one's start
    (before: the key was deleted in between), only the last one current (or closed: deleted) -- and no version may
    be there twice (an epoch applied twice). ``tracked`` (``trackHistoryColumns``): a version closed where the next
    one opens (by a change, not a delete) must differ from it in a tracked column -- else the change of untracked
    columns only made a version instead of updating the current one (for a workload that never deletes and
    re-inserts a key at one commit time, which looks the same)."""
    names = list(key)
    rows = target.to_pylist()
    problems: list[str] = []
    seen: collections.Counter[tuple[Any, ...]] = collections.Counter(
        tuple(sorted((k, repr(v)) for k, v in r.items())) for r in rows)
    twice = [dict(r) for r, n in seen.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} versions written twice, e.g. {twice[0]}")
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        by_key[tuple(r[k] for k in names)].append(r)
    for k, versions in by_key.items():
        # a snapshot row's version begins "before the history began" (null) and comes first
        versions.sort(key=lambda r: (r["_valid_from"] is not None, r["_valid_from"] or 0, r["_valid_to"] is None,
                                     r["_valid_to"] or 0))
        for a, b in zip(versions, versions[1:]):
            if a["_current"] or a["_valid_to"] is None or b["_valid_from"] is None or a["_valid_to"] > b["_valid_from"]:
                problems.append(f"key {k}: version from {a['_valid_from']} (to {a['_valid_to']}, current "
                                f"{a['_current']}) overlaps the next one, from {b['_valid_from']}")
                break
            if tracked is not None and a["_valid_to"] == b["_valid_from"] and all(a[c] == b[c] for c in tracked):
                problems.append(f"key {k}: the version from {b['_valid_from']} equals the one before it in the tracked "
                                f"columns {list(tracked)}: an untracked change made a version")
                break
        last = versions[-1]
        if last["_current"] != (last["_valid_to"] is None):
            problems.append(f"key {k}: last version current={last['_current']} with valid_to {last['_valid_to']}")
    return problems


def tracked_history_problems(versions: Any) -> list[str]:
    """What is wrong with m_b's history target (:data:`TRACKED_M_B`; an Arrow table with k, j, nn and the history
    columns) against what :data:`WRITER` makes of :data:`SETUP`'s rows: j has two values per key -- j0 (without
    "u") and j1 --, each update doubles nn, there are no inserts. So, per key: its versions' j are [j0], [j1] or
    [j0, j1]; the j0 version is the snapshot's (``_valid_from`` null), never updated (nn as set up); a j1 version has
    nn doubled m >= 1 times; one after a j0 version was opened by the key's first update and updated in place m - 1
    times. (A j1 version opened by a change may be a key's first: the source replaces a snapshot row by a change made
    while its chunk was read, as the PostgreSQL run showed once.) The run must show both: a key with a version opened by a tracked change, and one whose
    version opened so was updated in place (without tracking: versions of their own). :func:`history_problems`
    (``tracked=["j"]``) checks the order of the versions."""
    import decimal

    problems: list[str] = []
    by_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in versions.to_pylist():
        by_key[r["k"]].append(r)
    opened, in_place = 0, 0
    with decimal.localcontext() as ctx:
        ctx.prec = 200  # nn has 50 digits and more: exact

        def doublings(k: str, nn: Any) -> int | None:
            base, value = _NN0 + int(k[1:]), Decimal(str(nn))
            return next((m for m in range(64) if base * 2 ** m == value), None)

        for k, vs in sorted(by_key.items()):
            vs.sort(key=lambda r: (r["_valid_from"] is not None, r["_valid_from"] or 0))
            has_u = ["u" in (json.loads(r["j"]) if isinstance(r["j"], str) else r["j"]) for r in vs]
            m = [doublings(k, r["nn"]) for r in vs]
            if has_u not in ([False], [True], [False, True]):
                problems.append(f"key {k}: versions with j {['j1' if u else 'j0' for u in has_u]} (j0, j1 or j0 then j1)")
            elif None in m:
                problems.append(f"key {k}: nn {[r['nn'] for r in vs]} is not its set-up value doubled")
            elif not has_u[0] and (vs[0]["_valid_from"] is not None or m[0] != 0):
                problems.append(f"key {k}: its j0 version is not the snapshot's (from {vs[0]['_valid_from']}, nn "
                                f"doubled {m[0]} times)")
            elif has_u[-1] and (m[-1] or 0) < 1:
                problems.append(f"key {k}: its j1 version's nn was never doubled")
            elif len(vs) == 2:
                opened += 1
                in_place += (m[1] or 0) >= 2
    if not opened:
        problems.append("no key has a version opened by a tracked change (j0 then j1)")
    if not in_place:
        problems.append("no version opened by a tracked change was updated in place by a later untracked one")
    return problems
