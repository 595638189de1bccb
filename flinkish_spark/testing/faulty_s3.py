"""An S3 proxy that misbehaves on purpose, in front of a real S3 API (moto's server in the tests).

It forwards every request unchanged and answers with the server's answer, except for the
requests a :class:`Fault` matches (method, key suffix, conditional or not), a given number of
times:

* ``"drop_answer"`` -- the request reaches the server (an object is written), then the
  connection is closed without an answer: the client's own retry (botocore, s3fs) sends
  the request again, as after a lost answer on a real network.
* ``"conflict"`` -- the request is *not* forwarded and the answer is S3's
  ``409 ConditionalRequestConflict`` (a concurrent conditional write on the key is in
  progress); ``before_answer`` runs first, e.g. to let "the other writer" finish its write.

Usage::

    with FaultyS3Proxy(moto_endpoint) as proxy:
        proxy.arm(Fault("drop_answer", "PUT", "/ckpt/00000001.parquet", conditional=True))
        io = FileIO.for_url("s3://b/x", {"endpoint_url": proxy.endpoint})
"""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

FaultKind = Literal["drop_answer", "conflict"]
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
CONFLICT_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conflicting conditional operation is currently in progress against this resource. "
    b"Please try again.</Message><RequestId>flinkish-faulty-s3</RequestId></Error>"
)


@dataclass
class Fault:
    kind: FaultKind
    method: str
    key_suffix: str
    conditional: bool = True  # only requests with If-None-Match
    times: int = 1
    before_answer: Callable[[], None] | None = None
    hits: int = field(default=0)


@dataclass
class Seen:
    method: str
    path: str
    conditional: bool
    status: int | None  # None: answer dropped or never asked for


class FaultyS3Proxy:
    def __init__(self, target: str) -> None:
        parsed = urllib.parse.urlsplit(target)
        self.target_host, self.target_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-s3", daemon=True)

    @property
    def endpoint(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def arm(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def __enter__(self) -> "FaultyS3Proxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _match(self, method: str, path: str, conditional: bool) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if (fault.hits < fault.times and fault.method == method and path.split("?", 1)[0].endswith(fault.key_suffix)
                        and (conditional or not fault.conditional)):
                    fault.hits += 1
                    return fault
        return None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _forward(self) -> None:
                body = self._body()
                conditional = "If-None-Match" in self.headers
                fault = proxy._match(self.command, self.path, conditional)
                if fault is not None and fault.kind == "conflict":
                    if fault.before_answer is not None:
                        fault.before_answer()
                    proxy.seen.append(Seen(self.command, self.path, conditional, 409))
                    self._answer(409, [("Content-Type", "application/xml")], CONFLICT_BODY)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(proxy.target_host, proxy.target_port, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                    status, answer_headers = answer.status, answer.getheaders()
                finally:
                    upstream.close()
                if fault is not None:  # "drop_answer": written upstream, the answer never arrives
                    proxy.seen.append(Seen(self.command, self.path, conditional, None))
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                proxy.seen.append(Seen(self.command, self.path, conditional, status))
                self._answer(status, [(k, v) for k, v in answer_headers if k.lower() not in _HOP_BY_HOP], data)

            def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response_only(status)
                has_length = False
                for k, v in headers:
                    if k.lower() == "content-length":
                        has_length = True
                        if self.command != "HEAD":
                            v = str(len(data))
                    self.send_header(k, v)
                if not has_length:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler
