"""Helpers for testing pipelines built with flinkish_spark: test sources.

Crash and failure injection live in :mod:`flinkish_spark.faults` (production code calls them),
the local S3 server in :mod:`flinkish_spark.embedded.s3`, the pipeline runner in
:mod:`flinkish_spark.runner`.
"""
