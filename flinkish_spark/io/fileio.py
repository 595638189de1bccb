"""A small, picklable FileIO over fsspec.

Guarantees:

* :meth:`FileIO.write_exclusive` is put-if-absent: exactly one of two concurrent
  writers of the same path succeeds, and a reader never sees a partially written
  file. On local disk it writes a temporary file and hard-links it into place
  (``link(2)`` fails if the target exists); on S3 it is a single PUT with
  ``If-None-Match: *``; on ``memory://`` it is an exclusive open.
* A retried exclusive write whose earlier attempt landed is recognised (the
  stored bytes equal ours) and reported as success, as pyiceberg does for commits --
  also when the retry was the S3 client's own (botocore and s3fs resend a PUT whose
  answer was lost, and the resent one meets ``412``): on object stores a
  ``FileExistsError`` is always checked against the stored bytes. Every exclusive write
  of flinkish carries a run id or a timestamp, so another writer's object never equals ours.
* ``409 ConditionalRequestConflict`` (another conditional write of the key in flight) is
  retried like a transient failure: the retry writes, or finds the other writer's object
  and answers :class:`~flinkish_spark.errors.AlreadyExistsError` ("taken").
* Transient storage failures are retried with backoff for idempotent calls and
  surface as :class:`~flinkish_spark.errors.StorageUnavailableError` naming the
  endpoint; refusals surface as :class:`~flinkish_spark.errors.StorageAccessError`.

A FileIO pickles as its URL protocol and storage options: the fsspec file
system is created lazily in each process (driver, executors).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, TypeVar

import fsspec
import fsspec.asyn
from fsspec.core import split_protocol

from flinkish_spark.errors import (
    AlreadyExistsError,
    ConfigError,
    StorageAccessError,
    StorageUnavailableError,
)
from flinkish_spark.io import local_disk

T = TypeVar("T")

_SUPPORTED_PROTOCOLS = ("file", "local", "memory", "s3", "s3a")
_S3_COPY_CONCURRENCY = 32
# Defaults that keep an unreachable endpoint from hanging a query for minutes
# (botocore's default connect timeout is 60 s with several retries).
_S3_CONFIG_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 60,
    "retries": {"max_attempts": 3, "mode": "standard"},
}


def storage_options_from(options: Mapping[str, str], url: str) -> dict[str, Any]:
    """Build fsspec storage options for ``url`` from Spark-style options and the environment.

    Options (all optional):

    * ``endpointUrl`` -- S3 endpoint; default ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``.
    * ``region`` -- S3 region; default ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.
    * ``storageOptions`` -- a JSON object passed to fsspec as is (wins over the above).

    The environment is read here, on the driver, so executors that do not share
    the driver's environment still reach the same endpoint.
    """
    protocol = protocol_of(url)
    raw = options.get("storageOptions")
    extra: dict[str, Any] = {}
    if raw:
        try:
            extra = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"option 'storageOptions' is not valid JSON ({exc.msg}); "
                'pass a JSON object such as {"anon": false}'
            ) from None
        if not isinstance(extra, dict):
            raise ConfigError("option 'storageOptions' must be a JSON object, e.g. {\"anon\": false}")
    result: dict[str, Any] = {}
    if protocol == "s3":
        endpoint = (
            options.get("endpointUrl")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        if endpoint:
            if not endpoint.startswith(("http://", "https://")):
                raise ConfigError(
                    f"option 'endpointUrl' must be an http:// or https:// URL, got {endpoint!r}"
                )
            result["endpoint_url"] = endpoint
        region = options.get("region") or os.environ.get("AWS_REGION") or os.environ.get(
            "AWS_DEFAULT_REGION"
        )
        client_kwargs: dict[str, Any] = {}
        if region:
            client_kwargs["region_name"] = region
        if client_kwargs:
            result["client_kwargs"] = client_kwargs
        result["config_kwargs"] = dict(_S3_CONFIG_DEFAULTS)
    result.update(extra)
    return result


def protocol_of(url: str) -> str:
    protocol, _ = split_protocol(url)
    protocol = protocol or "file"
    if protocol == "s3a":
        return "s3"
    return protocol


def _validate_url(url: str, what: str) -> None:
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{what} must be a non-empty path or URL (file://, s3://, memory://)")
    protocol = protocol_of(url)
    if protocol not in _SUPPORTED_PROTOCOLS and protocol not in fsspec.available_protocols():
        raise ConfigError(
            f"{what} {url!r} uses the unknown protocol {protocol!r}; "
            "use a local path, file://, s3:// or memory://"
        )


@dataclass
class FileIO:
    """File access rooted in one fsspec protocol. Paths are full URLs or local paths."""

    protocol: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    retries: int = 4
    _fs: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping[str, Any] | None = None, what: str = "path") -> "FileIO":
        _validate_url(url, what)
        return cls(protocol=protocol_of(url), storage_options=dict(storage_options or {}))

    # -- pickling: never ship a live file system (sockets, event loops) ------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "storage_options": self.storage_options, "retries": self.retries}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.protocol = state["protocol"]
        self.storage_options = state["storage_options"]
        self.retries = state["retries"]
        self._fs = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = _shared_filesystem(self.protocol, self.storage_options)
        return self._fs

    @property
    def is_local(self) -> bool:
        """A local disk (``file`` / ``local``): plain ``os`` calls, fsyncs and renames instead of requests."""
        return self.protocol in ("file", "local")

    @property
    def endpoint(self) -> str:
        if self.protocol == "s3":
            return str(self.storage_options.get("endpoint_url") or "the default AWS S3 endpoint")
        return f"{self.protocol}://"

    def strip(self, url: str) -> str:
        """The path as the file system wants it (no protocol)."""
        if self.is_local and url.startswith("/") and os.sep == "/":
            # What fsspec's LocalFileSystem._strip_protocol returns for an absolute POSIX path, without its
            # prefix loop: a many-table commit strips ~70 paths per table (a tenth of its time on a local disk).
            return url.rstrip("/") or "/"
        return str(self.fs._strip_protocol(url))

    def url(self, path: str) -> str:
        """A full URL for a stripped path."""
        if self.is_local:
            return path
        return f"{self.protocol}://{path.lstrip('/')}" if self.protocol != "memory" else f"memory://{path}"

    # -- error mapping and retries ------------------------------------------------------

    def _call(self, what: str, path: str, fn: Callable[[], T], idempotent: bool = True, retries: int | None = None) -> T:
        retries = self.retries if retries is None else retries
        delay = 0.2
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except (FileNotFoundError, FileExistsError, AlreadyExistsError):
                raise
            except PermissionError as exc:
                raise StorageAccessError(
                    f"{what} {path!r} was refused: {exc}. Check the credentials and that the "
                    "bucket or directory exists and is writable."
                ) from exc
            except Exception as exc:  # noqa: BLE001 - mapped below, re-raised if unknown
                if _is_missing_credentials(exc):
                    raise StorageAccessError(
                        f"{what} {path!r} failed: no S3 credentials were found. Set AWS_ACCESS_KEY_ID "
                        "and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment of the driver "
                        "and the executors, or pass them in the option 'storageOptions', e.g. "
                        '{"key": "...", "secret": "..."}.'
                    ) from exc
                transient = _is_transient(exc)
                if transient and idempotent and attempt <= retries:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                if _is_conflict(exc):
                    raise StorageUnavailableError(
                        f"{what} {path!r} met a concurrent conditional write of the same object "
                        f"(409 ConditionalRequestConflict at {self.endpoint}); retry"
                    ) from exc
                if transient:
                    raise StorageUnavailableError(
                        f"{what} {path!r} failed: the storage endpoint {self.endpoint} did not answer "
                        f"({type(exc).__name__}: {exc}). Check that it is running and reachable; set "
                        "the option 'endpointUrl' or AWS_ENDPOINT_URL to the right address."
                    ) from exc
                if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                    raise StorageAccessError(f"{what} {path!r} was refused: {exc}") from exc
                if _is_access_error(exc):
                    raise StorageAccessError(
                        f"{what} {path!r} was refused: {exc}. Check that the bucket exists and "
                        "the credentials may write to it."
                    ) from exc
                raise

    # -- reads --------------------------------------------------------------------------

    def read_bytes(self, path: str) -> bytes:
        """The whole (small: metadata, markers) file. On S3 one GET: s3fs would first ask for
        the size (a HEAD, and a listing when the file is missing) to split large reads."""
        kwargs = {"max_concurrency": 1} if self.protocol == "s3" else {}
        return self._call("reading", path, lambda: bytes(self.fs.cat_file(self.strip(path), **kwargs)))

    def exists(self, path: str) -> bool:
        return self._call("checking", path, lambda: bool(self.fs.exists(self.strip(path))))

    def small_file_exists(self, path: str) -> bool:
        """Whether the small file ``path`` exists, in one request.

        s3fs's ``exists`` follows a 404 with a listing (is it a folder?); for a marker
        file a GET answers in one request either way.
        """
        if self.protocol != "s3":
            return self.exists(path)
        try:
            self.read_bytes(path)
        except FileNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        return self._call("checking", path, lambda: int(self.fs.size(self.strip(path))))

    def list_names(self, directory: str) -> list[str]:
        """Base names of the entries directly in ``directory`` ([] if it does not exist)."""

        def ls() -> list[str]:
            d = self.strip(directory)
            try:
                entries = self.fs.ls(d, detail=False, refresh=True) if self.protocol == "s3" else self.fs.ls(d, detail=False)
            except FileNotFoundError:
                return []
            return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)

        return self._call("listing", directory, ls)

    def find(self, path: str) -> list[str]:
        """Every file below the directory ``path``, or ``[path]`` if it is a file (stripped, sorted).

        Only files: on an object store a "directory" is a listing, and the answer to "is
        this a directory?" can change between two requests while objects come and go
        (s3fs's find then reports the prefix itself), so entries are filtered by type
        from one listing instead of asking isdir/exists separately.
        """

        def find() -> list[str]:
            stripped = self.strip(path)
            if self.protocol == "s3":
                self.fs.invalidate_cache()
            try:
                found = self.fs.find(stripped, detail=True)
            except FileNotFoundError:
                return []
            return sorted(_files_only(found))

        return self._call("listing", path, find)

    def glob(self, pattern: str) -> list[str]:
        """Every file matching ``pattern``; a matching directory contributes the files below it."""

        def glob() -> list[str]:
            if self.protocol == "s3":
                self.fs.invalidate_cache()
            matches = self.fs.glob(self.strip(pattern), detail=True)
            files = set(_files_only(matches))
            for name, info in matches.items():
                if info.get("type") == "directory":
                    files.update(_files_only(self.fs.find(name, detail=True)))
            return sorted(files)

        return self._call("listing", pattern, glob)

    def open_input(self, path: str) -> Any:
        return self._call("opening", path, lambda: self.fs.open(self.strip(path), "rb"))

    # -- writes ---------------------------------------------------------------------------

    def write_exclusive(self, path: str, data: bytes, sync_folder: bool = True) -> None:
        """Create ``path`` with ``data``; raise AlreadyExistsError if it exists (put-if-absent). On a local disk the
        data is fsynced before the name appears; ``sync_folder`` False leaves the folder's fsync (the name's
        durability after a machine crash) to the caller: :mod:`flinkish_spark.io.local_disk`."""
        stripped = self.strip(path)
        attempt = 0
        while True:
            attempt += 1
            try:
                if self.is_local:
                    local_disk.create_exclusive(stripped, data, sync_folder)
                else:
                    self._call("writing", path, lambda: self.fs.pipe_file(stripped, data, mode="create"), idempotent=False)
                return
            except FileExistsError:
                # An earlier attempt of ours may have landed before its answer was lost -- ours,
                # or on an object store the client's own resend of the PUT (it surfaces as 412).
                remote = not self.is_local
                if (attempt > 1 or remote) and self._stored_equals(path, data):
                    return
                raise AlreadyExistsError(f"{path!r} already exists") from None
            except StorageUnavailableError:
                if attempt > self.retries:
                    raise
                time.sleep(0.2 * attempt)

    def stage_exclusive(self, path: str, data: bytes) -> str:
        """A local disk's put-if-absent in two steps, for many files behind one sync: ``data`` in a hidden
        temporary file beside ``path``, *not* fsynced -- the caller syncs the file system (:mod:`.local_disk`)
        before :meth:`publish_staged`, so that the name never appears before its bytes are durable. Returns
        the temporary file's name."""
        assert self.is_local, "staged writes are for a local disk"
        stripped = self.strip(path)
        return self._call("writing", path, lambda: local_disk.stage_file(stripped, data, durable=False), idempotent=False)

    def publish_staged(self, staged: str, path: str) -> None:
        """The second step of :meth:`stage_exclusive`: ``staged`` linked to ``path`` (AlreadyExistsError when
        ``path`` exists) and removed either way; the folder is not fsynced (the caller syncs the file system)."""
        try:
            local_disk.publish_staged(staged, self.strip(path), sync_folder=False)
        except FileExistsError:
            raise AlreadyExistsError(f"{path!r} already exists") from None

    def _stored_equals(self, path: str, data: bytes) -> bool:
        try:
            return self.read_bytes(path) == data
        except FileNotFoundError:
            return False

    def write_bytes(self, path: str, data: bytes, durable: bool = True) -> None:
        """Write (or overwrite) ``path``; atomic on local disk via rename. ``durable`` False: a local file is
        not fsynced first (a hint whose readers take a torn one for none, e.g. Delta's ``_last_checkpoint``)."""
        stripped = self.strip(path)
        if self.is_local:
            # staged in a hidden file, as a put-if-absent's: a listing of the folder never sees a name with the file's
            # prefix that vanishes a moment later (a reader taking the newest "v..." would read a half-written file)
            os.replace(local_disk.stage_file(stripped, data, durable), stripped)
            return
        self._call("writing", path, lambda: self.fs.pipe_file(stripped, data))

    def makedirs(self, path: str) -> None:
        if self.is_local:
            self._call("creating", path, lambda: os.makedirs(self.strip(path), exist_ok=True))

    def delete(self, path: str) -> None:
        """Delete ``path``; a missing file is not an error (deletes are retried)."""

        def rm() -> None:
            try:
                self.fs.rm_file(self.strip(path))
            except FileNotFoundError:
                pass

        self._call("deleting", path, rm)

    def delete_many(self, paths: list[str]) -> None:
        """Delete files (never folders); missing ones are not an error. On S3: bulk deletes."""
        if not paths:
            return
        if self.protocol == "s3":
            stripped = [self.strip(p) for p in paths]
            bulk = getattr(self.fs, "_bulk_delete", None)
            if bulk is None:  # an s3fs without it: the public call (it lists each path first)
                self._call("deleting", paths[0], lambda: self.fs.rm(stripped))
                return
            by_bucket: dict[str, list[str]] = {}
            for p in stripped:
                by_bucket.setdefault(p.split("/", 1)[0], []).append(p)
            chunks = [ps[i:i + 1000] for ps in by_bucket.values() for i in range(0, len(ps), 1000)]

            async def delete_all() -> None:
                await asyncio.gather(*(bulk(chunk) for chunk in chunks))

            self._call("deleting", paths[0], lambda: fsspec.asyn.sync(self.fs.loop, delete_all))
            return
        for p in paths:
            self.delete(p)

    def move(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (copy + delete on object stores)."""
        s, d = self.strip(src), self.strip(dst)
        if self.is_local:
            os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
            self._call("moving", src, lambda: os.replace(s, d))
            return
        self._call("copying", src, lambda: self.fs.copy(s, d))
        self.delete(src)

    def move_many(self, pairs: list[tuple[str, str]], small: bool = False) -> None:
        """Move several files; on object stores the copies run concurrently, then bulk deletes.

        ``small=True`` promises every file is under S3's 5 GB limit for a single server-side
        copy: then each file costs exactly one CopyObject request (s3fs's generic copy first
        lists and heads every path, one after another).
        """
        if not pairs:
            return
        if self.is_local or (len(pairs) == 1 and not small):
            for src, dst in pairs:
                self.move(src, dst)
            return
        srcs = [self.strip(s) for s, _ in pairs]
        dsts = [self.strip(d) for _, d in pairs]
        copy_one = getattr(self.fs, "_copy_basic", None) if small and self.protocol == "s3" else None
        if copy_one is None:
            self._call("copying", pairs[0][0], lambda: self.fs.copy(srcs, dsts))
        else:
            async def copy_all() -> None:
                limit = asyncio.Semaphore(_S3_COPY_CONCURRENCY)

                async def one(src: str, dst: str) -> None:
                    async with limit:
                        await copy_one(src, dst)

                await asyncio.gather(*(one(s, d) for s, d in zip(srcs, dsts)))

            # Idempotent: copying the same staged bytes to the same name again is harmless.
            self._call("copying", pairs[0][0], lambda: fsspec.asyn.sync(self.fs.loop, copy_all))
        self.delete_many([s for s, _ in pairs])

    def check_writable_root(self, url: str, what: str) -> None:
        """Fail fast, before anything is written, when ``url`` cannot be reached."""
        stripped = self.strip(url)
        if self.protocol == "s3":
            bucket = stripped.split("/", 1)[0]
            if not bucket:
                raise ConfigError(f"{what} {url!r} names no bucket; use s3://BUCKET/prefix")
            try:
                # Fail fast when a query is defined: the client's own retries suffice here.
                self._call("checking", url, lambda: self.fs.ls(bucket, refresh=True), retries=0)
            except FileNotFoundError:
                raise StorageAccessError(
                    f"{what} {url!r}: the bucket {bucket!r} does not exist at {self.endpoint}; "
                    "create it first or fix the URL"
                ) from None
        elif self.is_local:
            probe = stripped
            while probe and not os.path.exists(probe):
                probe = os.path.dirname(probe.rstrip("/"))
            if probe and (not os.path.isdir(probe) or not os.access(probe, os.W_OK)):
                raise StorageAccessError(
                    f"{what} {url!r} is not writable: {probe!r} is not a writable directory"
                )

    def remove_empty_dirs(self, directory: str) -> None:
        """Remove ``directory`` and its empty sub-folders (local disk; object stores have none)."""
        if not self.is_local:
            return
        top = self.strip(directory)
        for root, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
            try:
                os.rmdir(root)
            except OSError:
                pass


_FS_LOCK = threading.Lock()
_FS_CACHE: dict[tuple[str, str], Any] = {}
_FS_CACHE_PID = os.getpid()


def _files_only(entries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    # fsspec's find answers ``{path: {}}`` for a plain file path: no type means a file.
    # A key ending in "/" is a folder placeholder some S3 tools create, never data.
    return [name for name, info in entries.items() if info.get("type", "file") == "file" and not name.endswith("/")]


def _shared_filesystem(protocol: str, storage_options: Mapping[str, Any]) -> Any:
    """One fsspec file system per process and (protocol, options).

    Creating an S3 client costs 0.2-0.4 s (botocore loads its service model), and Spark
    runs commits and tasks in Python workers that each build several FileIOs: sharing
    the client is what keeps an S3 commit in the tens of milliseconds. The instance is
    ours, never fsspec's global one, and has no listing cache: Spark reuses Python
    workers across tasks and queries, and a cached listing answers stale sizes (a file
    then reads as 0 bytes). A forked process builds its own (sockets and event loops
    must not cross a fork).
    """
    global _FS_CACHE_PID
    options = dict(storage_options)
    if protocol == "s3":
        options.setdefault("skip_instance_cache", True)
        options.setdefault("use_listings_cache", False)
    key = (protocol, json.dumps(options, sort_keys=True, default=repr))
    with _FS_LOCK:
        if _FS_CACHE_PID != os.getpid():
            _FS_CACHE.clear()
            _FS_CACHE_PID = os.getpid()
        fs = _FS_CACHE.get(key)
        if fs is None:
            fs = fsspec.filesystem(protocol, **options)
            _FS_CACHE[key] = fs
        return fs


def _is_transient(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in _chain(exc)}
    transient_names = {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "TimeoutError",
        "ServerTimeoutError",
    }
    if names & transient_names:
        return True
    return any(_is_transient_answer(e) for e in _chain(exc))


# S3's answers worth retrying: its error codes for "busy / try again" and the HTTP statuses
# of a server-side failure. Matched only where they are codes -- a path holds numbers too
# (epoch 503, a table m500), and a permanent error on it must not be retried.
_TRANSIENT_ERROR_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "500", "502", "503", "504"})
_TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
# botocore's text for an error answer, when only the text is left: "An error occurred (SlowDown) when calling ..."
_BOTOCORE_ERROR_CODE = re.compile(r"^An error occurred \(([A-Za-z0-9]+)\) when calling ")


def _is_transient_answer(exc: BaseException) -> bool:
    """Whether ``exc`` is a server's transient answer, read from its attributes (botocore's
    ``response``, aiohttp's ``status``) or from botocore's message format -- never from a
    number anywhere in the message."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error") or {}
        metadata = response.get("ResponseMetadata") or {}
        if str(error.get("Code", "")) in _TRANSIENT_ERROR_CODES or metadata.get("HTTPStatusCode") in _TRANSIENT_STATUSES:
            return True
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status in _TRANSIENT_STATUSES:
        return True
    match = _BOTOCORE_ERROR_CODE.match(str(exc))
    return match is not None and match.group(1) in _TRANSIENT_ERROR_CODES


def _is_conflict(exc: BaseException) -> bool:
    """S3's 409 ConditionalRequestConflict: a concurrent conditional write of the key; ours was not applied."""
    return any("ConditionalRequestConflict" in str(e) for e in _chain(exc))


def _is_missing_credentials(exc: BaseException) -> bool:
    return any(type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError") for e in _chain(exc))


def _is_access_error(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket"))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__
