"""MySQL and MariaDB (issue 29): the parts of a ``flinkish.mysql`` source that differ per database.

What is here does not depend on the CDC core shared with the PostgreSQL source (still to be lifted out
of ``connectors/postgres/source/``):

* :mod:`.connection` -- ``mysql://user@host:3306/db``, the password from the URL, ``passwordEnv`` or
  ``MYSQL_PWD`` (never printed), PyMySQL connections with access/unavailable errors;
* :mod:`.server` -- the binary log settings the source needs (log_bin, ROW, FULL row image and
  metadata), one error each naming the setting to change;
* :mod:`.position` -- file+offset and MariaDB GTID positions (comparable, one string each) and
  whether the server purged the logs a position needs;
* :mod:`.types` -- MySQL column types -> Arrow and Spark types.

The binary log decoder is ``mysql-event-stream`` (a C++ engine behind ctypes; Linux wheels, Python
3.11+), PyMySQL the SQL client (the extra ``flinkish_spark[mysql]``), chosen by measurement against
``mariadb-binlog`` and ``mysql-replication``: docs/benchmarks.md, "MySQL binary log decoders" (what
each decoder makes of every type, and what the source must do after it, is there too).
"""
