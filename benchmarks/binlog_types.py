"""What each binary log decoder makes of every MySQL type (issue 29, item 5: the choice is not speed alone).

One row of the type table of ``tests/connectors/mysql/test_types.py`` (``COLUMNS``: every integer width signed
and unsigned up to BIGINT UNSIGNED's 2^64-1, DECIMAL(65,30), a latin1 VARCHAR with a non-ASCII letter, ENUM
and SET, BIT(1) and BIT(9), JSON, a zero DATE, DATETIME(6), TIMESTAMP(3), TIME -838:59:59.5, YEAR 0, a POINT,
a MariaDB UUID) is inserted on a MariaDB of :mod:`flinkish_spark.embedded.mariadb` (``sql_mode=''``,
``time_zone=+00:00``) and read back from the binary log by ``mysql-replication`` and ``mysql-event-stream``;
printed beside what ``SELECT`` shows, written to ``benchmarks/results/binlog_types.json``.

    pip install --target /tmp/binlog-libs mysql-replication mysql-event-stream
    PYTHONPATH=/tmp/binlog-libs:. python benchmarks/binlog_types.py
"""

from __future__ import annotations

import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "connectors", "mysql"))
from _common import print_table, write_results  # noqa: E402
from test_types import COLUMNS  # noqa: E402

from flinkish_spark.embedded.mariadb import temporary_mariadb  # noqa: E402

VALUES = {
    "ti": "-5", "ti1": "1", "tiu": "255", "si": "-300", "siu": "65535", "mi": "16777215", "i": "-7",
    "iu": "4294967295", "bi": "-9223372036854775808", "biu": "18446744073709551615", "d": "-1234567890.12",
    "d0": "42", "d65": "12345678901234567890123456789012345.123456789012345678901234567890", "f": "1.5",
    "db": "2.25", "c": "'ab'", "vc": "'Zoë'", "tx": "'text ✓'", "bn": "x'01020300'", "vb": "x'ff00'",
    "bl": "x'deadbeef'", "e": "'it''s, big'", "st": "'a,c'", "b1": "b'1'", "b9": "b'100000001'",
    "j": "'{\"k\": [1, 2]}'", "dt": "'0000-00-00'", "dtm": "'2024-02-29 23:59:59.123456'",
    "ts": "'2024-03-01 12:00:00.5'", "tm": "'-838:59:59.5'", "y": "0", "g": "ST_GeomFromText('POINT(1 2)')",
    "u": "'123e4567-e89b-12d3-a456-426614174000'",
}
SERVER_ID = 4712


def mysql_replication(port: int, log_file: str) -> dict[str, Any]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    stream = BinLogStreamReader(connection_settings={"host": "127.0.0.1", "port": port, "user": "root", "passwd": ""},
                                server_id=SERVER_ID, log_file=log_file, log_pos=4, resume_stream=True, blocking=False,
                                only_events=[WriteRowsEvent])
    try:
        for event in stream:
            return dict(event.rows[0]["values"])
    finally:
        stream.close()
    return {}


def mysql_event_stream(port: int, log_file: str) -> dict[str, Any]:
    from mysql_event_stream import BinlogClient, CdcEngine

    with BinlogClient(host="127.0.0.1", port=port, user="root", password="", server_id=SERVER_ID,
                      start_binlog_file=log_file, start_binlog_position=4, ssl_mode=0) as client, CdcEngine() as engine:
        client.connect()
        client.start()
        while True:
            result = client.poll()
            if result.data is None:
                continue
            engine.set_checksum_enabled(result.checksum_enabled)
            engine.feed(result.data)
            while (event := engine.next_event()) is not None:
                if event.after:
                    client.stop()
                    return dict(event.after)


def main() -> None:
    names = [c.split()[0] for c in COLUMNS]
    decoded: dict[str, dict[str, Any]] = {}
    with temporary_mariadb("flinkish-bench-mariadb-") as db:
        db.sql(f"CREATE DATABASE ty; CREATE TABLE ty.t (id int PRIMARY KEY, {', '.join(COLUMNS)})")
        log_file = db.sql("SHOW MASTER STATUS").split("\t")[0]
        db.sql("SET sql_mode = ''; SET time_zone = '+00:00'; INSERT INTO ty.t (id, " + ", ".join(names)
               + ") VALUES (1, " + ", ".join(VALUES[n] for n in names) + ")")
        shown = db.sql("SET time_zone = '+00:00'; SELECT " + ", ".join(
            f"HEX({n})" if n in ("bn", "vb", "bl", "g", "b9") else f"{n} + 0" if n == "b1" else n for n in names)
            + " FROM ty.t").rstrip("\n").split("\t")
        for label, read in (("mysql-replication", mysql_replication), ("mysql-event-stream", mysql_event_stream)):
            try:
                decoded[label] = read(db.port, log_file)
            except ImportError:
                decoded[label] = {}
    rows = [[f"{d.split(' ', 1)[1][:28]}", shown[k][:30], *(repr(decoded[lib].get(n, "-"))[:34] for lib in decoded)]
            for k, (n, d) in enumerate(zip(names, COLUMNS))]
    print_table(["type", "SELECT shows", *decoded], rows)
    path = write_results("binlog_types", {"selected": dict(zip(names, shown)),
                                          "decoded": {lib: {k: repr(v) for k, v in vals.items()}
                                                      for lib, vals in decoded.items()}})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
