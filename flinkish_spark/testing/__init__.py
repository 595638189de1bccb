"""Helpers for testing pipelines built with flinkish_spark: crash injection, an S3 server, test sources."""
