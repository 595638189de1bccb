"""The CDC core shared by every database flinkish follows: what PostgreSQL and MySQL do alike.

The shape of Flink CDC's ``flink-cdc-base``: one incremental-source framework, each database a
dialect (:mod:`.dialect`: its catalog, chunk splitter, positions and log reader). The core holds:

* :mod:`.patterns` -- the ``tables`` option's names and patterns, the tables left out for want of a key;
* :mod:`.registry` -- the followed tables, one immutable versioned file per change of the set;
* :mod:`.catalog_poll` -- tables joining, leaving, renamed, snapshotted again; their chunk splits;
* :mod:`.splits` -- the split ids (``snapshot-<g>-t<tid>-<n>``, ``changes-<g>``);
* :mod:`.resnapshot_request` -- ``flinkish mirror resnapshot``'s requests, taken exactly once;
* :mod:`.stream` -- the multi-table stream's schema, ``B``/``E`` brackets, schema and snapshot rows.

PostgreSQL's side is :mod:`flinkish_spark.connectors.postgres.source` (its dialect:
:class:`~flinkish_spark.connectors.postgres.source.dialect.PostgresDialect`).
What a new database implements: docs/cdc-core.md.
"""
