"""``flinkish mirror``: a whole PostgreSQL database (or the tables matching patterns) mirrored into one
Delta / Iceberg / PostgreSQL target per table, from the command line or a Flink CDC style pipeline file.

A thin layer over the public API (docs/mirror.md, "flinkish mirror"): :mod:`.config` turns flags or
YAML into the options a Python user would pass to ``flinkish.postgres`` (``tables``) and a routing
sink; :mod:`.pipeline` runs that query and stops it with drain on Ctrl-C / SIGTERM; :mod:`.progress`
shows what the checkpoint metadata and Spark's progress say; :mod:`.status` (``flinkish mirror status``,
``flinkish_spark.mirror_status``) and :mod:`.metrics` (``--metrics-port``) the same figures per table, from
the metadata and the counts :mod:`.counts` folds from each committed epoch (exact under ``kill -9``).
"""
