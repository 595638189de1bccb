"""Columns and rows chosen, computed columns: a routing sink's per-table-pattern transform (docs/mirror.md,
"Columns and rows chosen"). :mod:`.parse` and :mod:`.evaluate` compile Spark SQL texts to Arrow computations,
:mod:`.rules` holds the rules and what they do to a table's schema and rows, :mod:`.hooks` applies them where each
routing sink sees a task's rows."""
