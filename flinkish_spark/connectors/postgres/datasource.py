"""``flinkish.postgres`` for both directions: reads go to the source, writes to the sink.

Spark's Python data source registry keys classes by ``name()``, so one class must answer
``readStream.format("flinkish.postgres")`` *and* ``writeStream.format("flinkish.postgres")``.
This one holds no state of its own and delegates: :meth:`schema` and :meth:`streamReader` to
:class:`~flinkish_spark.connectors.postgres.source.PostgresSourceDataSource`, :meth:`streamWriter`
to :class:`~flinkish_spark.connectors.postgres.sink.PostgresSinkDataSource`. Each side therefore
validates only its own options, and each keeps writing its own class into the metadata it
records (the source's descriptor, which the final checkpoint notification rebuilds it from).
Delegation rather than multiple inheritance: both sides define ``configure``, ``EXTRA_OPTIONS``
and an ``__init__`` that validates, which one class cannot hold twice.
"""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from flinkish_spark.connectors.postgres.sink import PostgresSinkDataSource
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource


class PostgresDataSource(DataSource):
    """``spark.readStream.format("flinkish.postgres")`` and ``df.writeStream.format("flinkish.postgres")``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        # The sink's run id must live as long as this instance: Spark keeps the instance for the
        # whole query and calls streamWriter() again for every micro-batch. A sink made afresh
        # each time would look like a new run at every commit and wait out the lease of the last.
        self.run_id = uuid.uuid4().hex

    @classmethod
    def name(cls) -> str:
        return "flinkish.postgres"

    def schema(self) -> StructType:
        return PostgresSourceDataSource(self.options).schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PostgresSourceDataSource(self.options).streamReader(schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        sink = PostgresSinkDataSource(self.options)
        sink.run_id = self.run_id
        return sink.streamWriter(schema, overwrite)
