"""What both lakehouse table formats (Delta, Iceberg) share: data file writing, statistics, storage options."""
