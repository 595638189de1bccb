"""Finishing pipelines (FLIP-147 for Spark): final epoch, automatic termination, stop with
and without drain, the end-of-input watermark flush, and restore checks.

Public entry points: :func:`await_finished`, :func:`stop`, :func:`with_watermark`. The names
below are imported on first access (:mod:`flinkish_spark.lazy_exports`): a source's worker
that reads stop requests does not import the driver's controller.
"""

from typing import TYPE_CHECKING

from flinkish_spark.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from flinkish_spark.finish.controller import FinishController, QueryEnd, await_finished, stop
    from flinkish_spark.finish.watermark import END_OF_INPUT_TS, with_watermark
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "FinishController": "flinkish_spark.finish.controller",
        "QueryEnd": "flinkish_spark.finish.controller",
        "await_finished": "flinkish_spark.finish.controller",
        "stop": "flinkish_spark.finish.controller",
        "END_OF_INPUT_TS": "flinkish_spark.finish.watermark",
        "with_watermark": "flinkish_spark.finish.watermark",
    })

__all__ = ["END_OF_INPUT_TS", "FinishController", "QueryEnd", "await_finished", "stop", "with_watermark"]
