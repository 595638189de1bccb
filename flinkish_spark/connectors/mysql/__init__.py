"""MySQL and MariaDB (issue 29): the parts of a ``flinkish.mysql`` source that differ per database.

What is here does not depend on the CDC core shared with the PostgreSQL source (still to be lifted out
of ``connectors/postgres/source/``):

* :mod:`.connection` -- ``mysql://user@host:3306/db``, the password from the URL, ``passwordEnv`` or
  ``MYSQL_PWD`` (never printed), PyMySQL connections with access/unavailable errors;
* :mod:`.server` -- the binary log settings the source needs (log_bin, ROW, FULL row image and
  metadata), one error each naming the setting to change;
* :mod:`.position` -- file+offset and MariaDB GTID positions (comparable, one string each) and
  whether the server purged the logs a position needs;
* :mod:`.types` -- MySQL column types -> Arrow and Spark types;
* :mod:`.binlog` -- the log's events over the replication protocol (file+offset starts) and its table
  map events with the optional metadata of ``binlog_row_metadata=FULL``;
* :mod:`.row_values` -- row events -> Python values, one precompiled reader per column, by the rules
  of :mod:`.types` (MySQL 8's binary JSON through :mod:`.json_binary`; MariaDB's UUID/INET4/INET6 as
  text, told apart from BINARY(n) by the catalog's types);
* :mod:`.changes` -- a position range ``[start, end)`` of the log as whole transactions of row changes
  and statements (file or MariaDB GTID starts, the end fixed before the read, a purged start refused
  with the setting to change), the log's end now, and a blocking wait for the next commit;
* :mod:`.ddl` -- the log's DDL statements as schema changes (column, table, truncate), 'unknown' for
  what touches a table in a way it cannot classify;
* :mod:`.snapshot` -- the lock-free consistent snapshot and the log position it is consistent with
  (MariaDB's ``binlog_snapshot_file``/``_position``, as a GTID position too), primary key chunks, a
  chunk read into Arrow;
* :mod:`.stream_rows`, :mod:`.chunk_rows`, :mod:`.change_stream` -- chunks and change ranges as the CDC core's
  stream rows; with ``rowFormat=arrow`` packed straight from typed values (:mod:`.packed_chunks`,
  :mod:`.packed_changes`).

The binary log's row events are to be decoded by the project's own pure-Python code over PyMySQL (the
extra ``flinkish_spark[mysql]``), as ``connectors/postgres/pgoutput.py`` decodes PostgreSQL's: chosen by
measurement against ``mariadb-binlog``, ``mysql-replication`` and ``mysql-event-stream``
(docs/benchmarks.md, "MySQL binary log decoders", with what each makes of every type).
"""
