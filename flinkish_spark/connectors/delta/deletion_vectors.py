"""Delta deletion vectors: the codec, the descriptor, the file (Delta PROTOCOL.md, "Deletion Vectors").

A deletion vector (DV) is the set of row positions of one data file that are no longer
in the table. Its bytes are a ``RoaringBitmapArray``: the magic number 1681511377
(little-endian int32), then a 64-bit roaring bitmap in the "portable" serialization
(number of 32-bit buckets as a little-endian int64, then per bucket its high 32 bits as
a little-endian int32 and a standard 32-bit roaring bitmap) -- exactly what
``pyroaring.BitMap64.serialize`` writes. A *descriptor* in the ``add``/``remove`` action
says where the bytes are:

* ``storageType = "i"``: inline, ``pathOrInlineDv`` = the bytes in Z85 (padded to a
  multiple of 4; ``sizeInBytes`` is the unpadded length);
* ``"u"``: in the file ``<table>/<prefix>/deletion_vector_<uuid>.bin``, ``pathOrInlineDv``
  = prefix + Z85 of the UUID's 16 bytes (the last 20 characters), ``offset`` = where
  this vector's size field starts in the file;
* ``"p"``: an absolute path (read, never written here).

A DV file holds a version byte (1), then per vector its size (big-endian int32), the
bytes, and their CRC-32 (big-endian). The sink writes one DV file per epoch commit,
below the epoch's own folder (the prefix ``flinkish/<uid>/e<epoch>``), holding every
vector the commit changes, so the epoch's cleanup finds it where it finds the epoch's
data files. Vectors of at most :data:`INLINE_MAX_BYTES` bytes go inline.

Verified against delta-rs 1.6 (``DeltaTable.scan()`` applies them,
``DeltaTable.deletion_vectors()`` lists them): tests/connectors/delta/test_deletion_vectors.py.
"""

from __future__ import annotations

import array
import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from flinkish_spark.errors import CorruptMetadataError

MAGIC = 1681511377
NATIVE_MAGIC = 1681511376
FILE_FORMAT_VERSION = 1
INLINE_MAX_BYTES = 64
Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(Z85_ALPHABET)}


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Base85 (RFC 32); ``data`` is padded with zero bytes to a multiple of 4."""
    data = data + b"\0" * (-len(data) % 4)
    out: list[str] = []
    for (value,) in struct.iter_unpack(">I", data):
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(Z85_ALPHABET[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError(f"a Z85 string has a multiple of 5 characters, not {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i:i + 5]:
            value = value * 85 + _Z85_INDEX[c]
        out += struct.pack(">I", value)
    return bytes(out)


def _roaring() -> Any:
    from flinkish_spark.connectors.lakehouse.files import require

    return require("pyroaring", "delta", "deletion vectors of the flinkish.delta sink")


def encode_bitmap(positions: np.ndarray) -> bytes:
    """The RoaringBitmapArray bytes (magic number included) of sorted, unique row positions.

    Built bucket by bucket from 32-bit bitmaps (pyroaring builds those from a buffer ~10x
    faster than a 64-bit one from an iterable): the portable 64-bit form *is* that layout.
    """
    bitmap32 = _roaring().BitMap
    positions = np.asarray(positions, dtype=np.uint64)
    highs = positions >> np.uint64(32)
    buckets = np.unique(highs)
    out: list[bytes] = [struct.pack("<I", MAGIC), struct.pack("<Q", len(buckets))]
    for high in buckets:
        lows = (positions[highs == high] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        bitmap = bitmap32(array.array("I", lows.tobytes()))
        bitmap.run_optimize()
        out.append(struct.pack("<I", int(high)) + bitmap.serialize())
    return b"".join(out)


def decode_bitmap(data: bytes) -> np.ndarray:
    """Row positions (sorted int64) of RoaringBitmapArray bytes.

    Reads the portable format (magic 1681511377, what Delta writers write) and the older
    "native" one (magic 1681511376, big-endian: bitmap count, then per bitmap its size
    and a 32-bit roaring bitmap whose index is its high 32 bits), in which PROTOCOL.md's
    inline example is written.
    """
    roaring = _roaring()
    if len(data) >= 4 and struct.unpack_from("<I", data)[0] == MAGIC:
        bitmap = roaring.BitMap64.deserialize(data[4:])
        return np.frombuffer(bitmap.to_array(), dtype=np.uint64).astype(np.int64)
    if len(data) >= 8 and struct.unpack_from(">I", data)[0] == NATIVE_MAGIC:
        (count,) = struct.unpack_from(">i", data, 4)
        offset, parts = 8, []
        for high in range(count):
            (size,) = struct.unpack_from(">i", data, offset)
            lows = np.frombuffer(roaring.BitMap.deserialize(data[offset + 4:offset + 4 + size]).to_array(), dtype=np.uint32)
            parts.append(lows.astype(np.int64) + (high << 32))
            offset += 4 + size
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    raise CorruptMetadataError("a deletion vector does not start with a RoaringBitmapArray magic number")


@dataclass(frozen=True)
class Descriptor:
    """A deletion vector descriptor as it stands in an ``add``/``remove`` action."""

    storage_type: str
    path_or_inline: str
    offset: int | None
    size: int
    cardinality: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Descriptor":
        offset = d.get("offset")
        return cls(str(d["storageType"]), str(d["pathOrInlineDv"]), None if offset is None else int(offset),
                   int(d["sizeInBytes"]), int(d["cardinality"]))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline}
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size
        out["cardinality"] = self.cardinality
        return out

    @property
    def unique_id(self) -> str:
        """The protocol's ``uniqueId``: with the path, the identity of a logical file."""
        base = f"{self.storage_type}{self.path_or_inline}"
        return base if self.offset is None else f"{base}@{self.offset}"

    def relative_file(self) -> str | None:
        """For ``u``: the DV file relative to the table root (``<prefix>/deletion_vector_<uuid>.bin``)."""
        if self.storage_type != "u":
            return None
        if len(self.path_or_inline) < 20:
            raise CorruptMetadataError(f"deletion vector path {self.path_or_inline!r} is shorter than a Z85 UUID")
        prefix, encoded = self.path_or_inline[:-20], self.path_or_inline[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name

    def stored_file(self) -> str | None:
        """The file below the table this vector is stored in (``u``), None when none (inline,
        absolute, or a malformed descriptor): what a cleanup must keep next to the data file."""
        try:
            return self.relative_file() or None
        except CorruptMetadataError:
            return None


def inline_descriptor(data: bytes, cardinality: int) -> Descriptor:
    return Descriptor("i", z85_encode(data), None, len(data), cardinality)


def dv_file_uuid(uid: str, epoch: int) -> uuid.UUID:
    """The UUID of an epoch's DV file: the same for every attempt of the epoch's commit, so a
    retried attempt overwrites (never leaves behind) what an unfinished one wrote."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"flinkish.delta/{uid}/{epoch}")


class DvFileWriter:
    """Collects the vectors of one commit into one DV file (see the module docstring)."""

    def __init__(self, prefix: str, file_uuid: uuid.UUID) -> None:
        self.prefix = prefix.rstrip("/")
        self.uuid = file_uuid
        self.buffer = bytearray([FILE_FORMAT_VERSION])

    @property
    def relative_path(self) -> str:
        name = f"deletion_vector_{self.uuid}.bin"
        return f"{self.prefix}/{name}" if self.prefix else name

    def add(self, positions: np.ndarray) -> Descriptor:
        """Encode ``positions`` (sorted, unique); inline when small, else appended to the file."""
        data = encode_bitmap(positions)
        if len(data) <= INLINE_MAX_BYTES:
            return inline_descriptor(data, len(positions))
        offset = len(self.buffer)
        self.buffer += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data) & 0xFFFFFFFF)
        return Descriptor("u", self.prefix + z85_encode(self.uuid.bytes), offset, len(data), len(positions))

    @property
    def empty(self) -> bool:
        return len(self.buffer) == 1

    def bytes(self) -> bytes:
        return bytes(self.buffer)


def read_vector(descriptor: Descriptor, read_range: Any) -> np.ndarray:
    """Row positions a descriptor marks deleted. ``read_range(relative_or_absolute, start, end)``
    returns bytes of a file (``u``: relative to the table root; ``p``: the absolute path)."""
    if descriptor.storage_type == "i":
        data = z85_decode(descriptor.path_or_inline)[:descriptor.size]
    else:
        where = descriptor.relative_file() if descriptor.storage_type == "u" else descriptor.path_or_inline
        start = descriptor.offset or 0
        chunk = read_range(where, start, start + 4 + descriptor.size + 4)
        (size,) = struct.unpack_from(">i", chunk)
        if size != descriptor.size:
            raise CorruptMetadataError(f"deletion vector in {where} at {start}: size {size}, the log says {descriptor.size}")
        data = chunk[4:4 + size]
        (crc,) = struct.unpack_from(">I", chunk, 4 + size)
        if zlib.crc32(data) & 0xFFFFFFFF != crc:
            raise CorruptMetadataError(f"deletion vector in {where} at {start}: CRC-32 mismatch")
    positions = decode_bitmap(data)
    if len(positions) != descriptor.cardinality:
        raise CorruptMetadataError(f"deletion vector {descriptor.unique_id}: {len(positions)} positions, "
                                   f"the log says {descriptor.cardinality}")
    return positions


def union_positions(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted distinct row positions in ``a`` or ``b`` (int64): ``np.union1d``'s answer without its
    hash-based unique (numpy 2.x: ~1.8 s for 1 M positions, measured in a 2 M-row transaction's commit);
    a mask over the file's rows costs ~10 ms. Positions far beyond the arrays' sizes fall back to union1d."""
    if not len(a) and not len(b):
        return np.zeros(0, dtype=np.int64)
    top = int(max(a.max() if len(a) else 0, b.max() if len(b) else 0)) + 1
    low = min(a.min() if len(a) else 0, b.min() if len(b) else 0)
    if low < 0 or top > 16 * (len(a) + len(b)) + (1 << 20):
        return np.union1d(a, b).astype(np.int64, copy=False)
    mask = np.zeros(top, dtype=np.bool_)
    mask[a] = True
    mask[b] = True
    return np.flatnonzero(mask).astype(np.int64, copy=False)
