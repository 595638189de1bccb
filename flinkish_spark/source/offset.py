"""The offset a flinkish source hands to Spark: a small JSON object in Spark's offset log.

It names the source checkpoint file of the epoch (``uid`` + ``ckpt`` below ``root``) and
carries what the driver-side finish controller (see :mod:`flinkish_spark.finish`) must
know without reading any metadata: the source's status and its stop / end-of-input
state. Because Spark writes offsets to its write-ahead log before a batch runs, all
of this is as durable and replay-safe as the batch itself.

Fields (all but the first three optional; readers ignore fields they do not know)::

    v       offset format version (1)
    uid     the source uid
    ckpt    the checkpoint id, -1 before the first epoch (genesis)
    status  RUNNING | PARTIALLY_FINISHED | FINISHED
    root    the metadata root URL (never credentials)
    endpointUrl, region   non-secret storage settings needed to reach ``root``
    stop    id of the stop request this source has stopped (or drained) for
    eoi     end-of-input watermark: "pending" (finished, waiting for the other
            inputs of the query) or "emitted" (the marker row was read)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

OFFSET_VERSION = 1
GENESIS = -1

EndOfInput = Literal["pending", "emitted"]


@dataclass(frozen=True)
class SourceOffset:
    uid: str
    ckpt: int
    status: str | None = None
    root: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    stop: str | None = None
    eoi: EndOfInput | None = None
    version: int = OFFSET_VERSION

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    def with_(self, **changes: Any) -> "SourceOffset":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"v": self.version, "uid": self.uid, "ckpt": self.ckpt}
        for key, value in (
            ("status", self.status),
            ("root", self.root),
            ("endpointUrl", self.endpoint_url),
            ("region", self.region),
            ("stop", self.stop),
            ("eoi", self.eoi),
        ):
            if value is not None:
                d[key] = value
        return d

    @classmethod
    def from_json(cls, d: Any) -> "SourceOffset | None":
        """The offset in ``d`` (a dict or a JSON string), or None if it is not a flinkish offset."""
        if isinstance(d, str):
            try:
                d = json.loads(d)
            except ValueError:
                return None
        if not isinstance(d, dict) or "ckpt" not in d or "uid" not in d:
            return None
        eoi = d.get("eoi")
        return cls(
            uid=str(d["uid"]),
            ckpt=int(d["ckpt"]),
            status=d.get("status"),
            root=d.get("root"),
            endpoint_url=d.get("endpointUrl"),
            region=d.get("region"),
            stop=d.get("stop"),
            eoi=eoi if eoi in ("pending", "emitted") else None,
            version=int(d.get("v", 0)),
        )

    def storage_options(self) -> dict[str, str]:
        """Spark-style options to reach ``root`` (credentials come from the environment)."""
        out = {}
        if self.endpoint_url:
            out["endpointUrl"] = self.endpoint_url
        if self.region:
            out["region"] = self.region
        return out
