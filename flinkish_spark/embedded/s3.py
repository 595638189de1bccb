"""A local S3 API for tests and demos: moto's threaded server on a free loopback port.

Usage::

    with local_s3() as endpoint:      # "http://127.0.0.1:PORT"
        make_bucket(endpoint, "data")
        ... .option("endpointUrl", endpoint) ...

Credentials are dummy values put in the environment (before Spark starts, so
Spark's Python workers inherit them); nothing leaves the machine.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def set_dummy_credentials() -> None:
    for key, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(key, value)


@contextmanager
def local_s3() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the duration of the block; yield its endpoint URL.

    moto keeps buckets per *process*, not per server: a second server in the same process
    starts with the first one's buckets. Call :func:`reset` for an empty one.
    """
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    set_dummy_credentials()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def local_s3_process(start_timeout: float = 30.0) -> Iterator[str]:
    """Like :func:`local_s3`, with moto's server in a process of its own.

    For clients that hold the GIL while they wait for S3 (delta-rs does): they would starve a
    server running in a thread of the same process.
    """
    import socket
    import subprocess
    import sys
    import time

    set_dummy_credentials()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def reset(endpoint: str) -> None:
    """Forget every bucket and object on the server; clear fsspec's cached S3 clients."""
    import requests
    import s3fs

    requests.post(f"{endpoint}/moto-api/reset", timeout=10)
    s3fs.S3FileSystem.clear_instance_cache()


def make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)


def s3_storage_options(endpoint: str) -> dict[str, object]:
    return {"endpoint_url": endpoint}
