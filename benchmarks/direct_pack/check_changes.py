"""The change prototype of sitecustomize.py against today's path, outside Spark: the same range (inserts, updates with NULLs,
key moves, deletes, an ADD COLUMN, two tables) packed by today's ``change_batches`` + ``Packer`` and by
``packed_change_batches``; per table the same schema rows in the same order and the same typed rows.

    PYTHONPATH=. python benchmarks/direct_pack/check_changes.py
"""
import os, sys
import tempfile
flag = os.path.join(tempfile.mkdtemp(), "direct-pack.flag"); open(flag, "w").close()
os.environ["FLINKISH_BENCH_DIRECT_PACK"] = flag
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
import importlib, sitecustomize; importlib.reload(sitecustomize)
import pyarrow as pa
from contextlib import closing
from mysql_source import DDL
from flinkish_spark.embedded.mariadb import temporary_mariadb
from flinkish_spark.connectors.mysql import dialect as D
from flinkish_spark.connectors.mysql.change_stream import change_batches as today
from flinkish_spark.connectors.mysql.changes import current_end, read_range
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.position import FilePosition
from flinkish_spark.connectors.mysql.row_values import RowDecoder
from flinkish_spark.connectors.mysql.server import collation_charsets
from flinkish_spark.connectors.postgres.rows.packed import Packer, read_pack
with temporary_mariadb() as db:
    db.sql("CREATE DATABASE bench; " + DDL + "; CREATE TABLE bench.u (k varchar(10) PRIMARY KEY, x int); FLUSH BINARY LOGS")
    f = db.sql("SHOW MASTER STATUS").split("\t")[0]
    db.sql("INSERT INTO bench.t SELECT seq, seq, concat('n', seq), seq/7, '2024-01-01' + INTERVAL seq SECOND, seq*0.5 FROM bench.seq_1_to_3000;"
           "BEGIN; UPDATE bench.t SET name = NULL WHERE id < 50; UPDATE bench.t SET id = id + 100000 WHERE id BETWEEN 50 AND 60; INSERT INTO bench.u VALUES ('a', 1), ('b', NULL); DELETE FROM bench.t WHERE id > 2990; COMMIT;"
           "ALTER TABLE bench.t ADD COLUMN extra int; UPDATE bench.t SET extra = 5 WHERE id < 10; UPDATE bench.u SET k = 'c' WHERE k = 'a'")
    info = parse_url(db.url_for("bench"))
    with closing(connect(info)) as conn:
        end = current_end(conn, True).file; cs = collation_charsets(conn)
    txns = list(read_range(info, FilePosition(f, 4), end, RowDecoder(cs, mariadb=True), 4711))
    args = (lambda n: True, lambda n: None, lambda d, t: None)
    a = list(Packer().pack_all(today(iter(txns), *args)))
    b = list(Packer().pack_all(D.change_batches(iter(txns), *args)))
    def flat(bs):
        rows, packs = [], {}
        for batch in bs:
            for r in batch.to_pylist():
                if r["_op"] == "s": rows.append(("s", r["_table"], r["_schema_id"]))
                else: packs.setdefault((r["_table"], r["_schema_id"]), []).append(read_pack(r["batch"]))
        return rows, {k: pa.concat_tables(v) for k, v in packs.items()}
    (sa, pa_), (sb, pb) = flat(a), flat(b)
    per = lambda rows: {t: [r for r in rows if r[1] == t] for t in {r[1] for r in rows}}
    assert per(sa) == per(sb), (sa, sb)
    assert pa_.keys() == pb.keys(), (pa_.keys(), pb.keys())
    for k in pa_:
        ta, tb = pa_[k], pb[k]
        assert ta.schema.names == tb.schema.names, (ta.schema, tb.schema)
        tb = tb.cast(ta.schema)
        assert ta.equals(tb), (k, ta.slice(0, 3).to_pylist(), tb.slice(0, 3).to_pylist())
        print(k, ta.num_rows, "equal")
os.remove(flag)
