"""Where checkpoint metadata lives below the ``checkpoint`` root URL.

::

    <root>/sources/<uid>/<ckpt id, 12 digits>.parquet   one per epoch that changed the source

Names sort in checkpoint order; anything else in these folders (temporary
files of interrupted writes, a user's notes) is ignored by readers and by retention.
"""

from __future__ import annotations

import re

_CKPT_NAME = re.compile(r"^(\d{12})\.parquet$")
UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def source_dir(root: str, uid: str) -> str:
    return join(root, "sources", uid)


def checkpoint_name(ckpt_id: int) -> str:
    return f"{ckpt_id:012d}.parquet"


def parse_checkpoint_name(name: str) -> int | None:
    m = _CKPT_NAME.match(name)
    return int(m.group(1)) if m else None
