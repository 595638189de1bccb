"""Positions in a MySQL or MariaDB binary log, and whether the server still has them.

Two kinds, both frozen, comparable and serialisable to one string (what a checkpoint stores):

* :class:`FilePosition` -- ``binlog.000012:4567``: a log file and a byte offset in it. Ordered by the
  file's sequence number (not its name as text: ``binlog.1000000`` follows ``binlog.999999``), then the
  offset. Valid on one server only: a replica's files have other names and offsets.
* :class:`MariaGtidPosition` -- ``0-1-100,1-2-5``: MariaDB's GTID position (``@@gtid_binlog_pos``), the
  last transaction per replication domain as ``domain-server-sequence``. Sequence numbers grow within a
  domain whichever server wrote them, so the position survives a failover to a replica. The order is
  partial: ``a <= b`` when b has every domain of a at the same or a later sequence number (two positions
  that each lead in another domain are not comparable, and neither ``<=`` holds). MySQL's GTID sets
  (``uuid:1-100``) are another format and not this type.

:func:`purged` says whether a position needs a log file that the server no longer has (``PURGE BINARY
LOGS``, ``expire_logs_days``/``binlog_expire_logs_seconds``): there is no replication slot to hold the
logs, the position lives in flinkish's checkpoint, so the source checks at start and each epoch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from flinkish_spark.errors import ConfigError

_FILE = re.compile(r"^(?P<base>.+)\.(?P<seq>[0-9]+)$")
_GTID = re.compile(r"^(?P<domain>[0-9]+)-(?P<server>[0-9]+)-(?P<seq>[0-9]+)$")


def _file_key(name: str) -> tuple[str, int]:
    m = _FILE.match(name)
    if m is None:
        raise ConfigError(f"{name!r} is not a binary log file name (base name, a dot and a number: binlog.000012)")
    return m["base"], int(m["seq"])


@dataclass(frozen=True)
class FilePosition:
    """A log file and a byte offset in it (4: the file's first event, after its magic number)."""

    file: str
    offset: int

    def __post_init__(self) -> None:
        _file_key(self.file)
        if self.offset < 4:
            raise ConfigError(f"binary log offset {self.offset} in {self.file}: the first event is at offset 4")

    @property
    def key(self) -> tuple[str, int, int]:
        base, seq = _file_key(self.file)
        return base, seq, self.offset

    def __lt__(self, other: FilePosition) -> bool:
        return self.key < other.key

    def __le__(self, other: FilePosition) -> bool:
        return self.key <= other.key

    def __gt__(self, other: FilePosition) -> bool:
        return self.key > other.key

    def __ge__(self, other: FilePosition) -> bool:
        return self.key >= other.key

    def __str__(self) -> str:
        return f"{self.file}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> FilePosition:
        file, sep, offset = text.strip().rpartition(":")
        if not sep or not offset.isdigit():
            raise ConfigError(f"{text!r} is not a binary log position (file:offset, e.g. binlog.000012:4567)")
        return cls(file, int(offset))


@dataclass(frozen=True, order=True)
class Gtid:
    """One MariaDB GTID: replication domain, the id of the server that wrote it, sequence number."""

    domain: int
    server: int
    seq: int

    def __str__(self) -> str:
        return f"{self.domain}-{self.server}-{self.seq}"

    @classmethod
    def parse(cls, text: str) -> Gtid:
        m = _GTID.match(text.strip())
        if m is None:
            raise ConfigError(f"{text!r} is not a MariaDB GTID (domain-server-sequence, e.g. 0-1-100)")
        return cls(int(m["domain"]), int(m["server"]), int(m["seq"]))


@dataclass(frozen=True)
class MariaGtidPosition:
    """The last GTID per domain, sorted by domain (one GTID per domain: ``@@gtid_binlog_pos``)."""

    gtids: tuple[Gtid, ...] = ()

    def __post_init__(self) -> None:
        domains = [g.domain for g in self.gtids]
        if len(set(domains)) != len(domains):
            raise ConfigError(f"GTID position {self}: more than one GTID for a domain")
        object.__setattr__(self, "gtids", tuple(sorted(self.gtids, key=lambda g: g.domain)))

    @property
    def by_domain(self) -> dict[int, Gtid]:
        return {g.domain: g for g in self.gtids}

    def after(self, gtid: Gtid) -> MariaGtidPosition:
        """This position once the transaction ``gtid`` has been read (its domain's entry replaced)."""
        return MariaGtidPosition(tuple(g for g in self.gtids if g.domain != gtid.domain) + (gtid,))

    def __le__(self, other: MariaGtidPosition) -> bool:
        theirs = other.by_domain
        return all(g.domain in theirs and g.seq <= theirs[g.domain].seq for g in self.gtids)

    def __ge__(self, other: MariaGtidPosition) -> bool:
        return other <= self

    def __lt__(self, other: MariaGtidPosition) -> bool:
        return self <= other and self != other

    def __gt__(self, other: MariaGtidPosition) -> bool:
        return other < self

    def __str__(self) -> str:
        return ",".join(str(g) for g in self.gtids)

    @classmethod
    def parse(cls, text: str) -> MariaGtidPosition:
        """``@@gtid_binlog_pos`` text: ``0-1-100,1-2-5``; empty for a server that wrote no transaction."""
        items = [t for t in re.split(r"[,\s]+", text.strip()) if t]
        return cls(tuple(Gtid.parse(t) for t in items))


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class MysqlGtidSet:
    """MySQL's GTID set (``@@gtid_executed``, ``SHOW MASTER STATUS``' Executed_Gtid_Set): per source server UUID,
    the transaction numbers as closed intervals, merged and sorted, so that one set has one text
    (``uuid:1-23,uuid2:1-3``). Unlike MariaDB's position it names every transaction, not the last per domain."""

    intervals: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        per: dict[str, list[tuple[int, int]]] = {}
        for item in (t for t in re.split(r"[,\s]+", text.strip()) if t):
            uuid, *ranges = item.lower().split(":")
            if not _UUID.fullmatch(uuid) or not ranges:
                raise ConfigError(f"{item!r} is not a MySQL GTID set entry (uuid:1-5:7); not a MySQL GTID set: {text!r}")
            for r in ranges:
                lo, _, hi = r.partition("-")
                if not lo.isdigit() or not (hi or lo).isdigit():
                    raise ConfigError(f"{item!r}: not a MySQL GTID set (transaction numbers as 1-5:7)")
                per.setdefault(uuid, []).append((int(lo), int(hi or lo)))
        merged = []
        for uuid in sorted(per):
            out: list[tuple[int, int]] = []
            for lo, hi in sorted(per[uuid]):
                if out and lo <= out[-1][1] + 1:
                    out[-1] = (out[-1][0], max(out[-1][1], hi))
                else:
                    out.append((lo, hi))
            merged.append((uuid, tuple(out)))
        return cls(tuple(merged))

    def __le__(self, other: MysqlGtidSet) -> bool:
        """Every transaction of this set is in ``other``."""
        theirs = dict(other.intervals)
        return all(any(a <= lo and hi <= b for a, b in theirs.get(uuid, ())) for uuid, rs in self.intervals
                   for lo, hi in rs)

    def __str__(self) -> str:
        return ",".join(uuid + "".join(f":{lo}" if lo == hi else f":{lo}-{hi}" for lo, hi in rs)
                        for uuid, rs in self.intervals)


def purged(position: FilePosition | MariaGtidPosition, log_files: Sequence[str],
           first_gtid_list: MariaGtidPosition | None = None) -> bool:
    """Whether reading from ``position`` needs a log the server has purged.

    ``log_files``: the first column of ``SHOW BINARY LOGS`` (oldest first). ``first_gtid_list``: the
    ``Gtid_list`` event of the oldest file (the GTID state before it; :func:`first_gtid_list` reads it),
    needed for a GTID position. A file position is purged when its file is older than the oldest file;
    a GTID position when the oldest file starts after it in some domain."""
    if not log_files:
        return True
    if isinstance(position, FilePosition):
        return position.key[:2] < _file_key(log_files[0])
    if first_gtid_list is None:
        raise ValueError("a GTID position needs the oldest log's Gtid_list to be checked")
    return not first_gtid_list <= position


def parse_gtid_list_info(info: str) -> MariaGtidPosition:
    """The ``Info`` column of a ``Gtid_list`` event in ``SHOW BINLOG EVENTS``: ``[0-1-3,1-2-7]``."""
    return MariaGtidPosition.parse(info.strip().strip("[]"))


def first_gtid_list(events: Iterable[Sequence[object]]) -> MariaGtidPosition:
    """From the rows of ``SHOW BINLOG EVENTS IN '<oldest file>' LIMIT 3`` (Log_name, Pos, Event_type, ...,
    Info): the GTID state before that file; empty when it has no Gtid_list event (nothing before it)."""
    for row in events:
        if str(row[2]) == "Gtid_list":
            return parse_gtid_list_info(str(row[5]))
    return MariaGtidPosition()
