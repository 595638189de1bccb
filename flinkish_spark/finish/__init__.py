"""Finishing pipelines (FLIP-147 for Spark): final epoch, automatic termination, stop with
and without drain, the end-of-input watermark flush, and restore checks.

Public entry points: :func:`await_finished`, :func:`stop`, :func:`with_watermark`.
"""

from flinkish_spark.finish.controller import FinishController, QueryEnd, await_finished, stop
from flinkish_spark.finish.watermark import END_OF_INPUT_TS, with_watermark

__all__ = ["END_OF_INPUT_TS", "FinishController", "QueryEnd", "await_finished", "stop", "with_watermark"]
