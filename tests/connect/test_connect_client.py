"""How long a Connect call retries a server that does not answer: pyspark's default, and flinkish's bound.

No server: pyspark's own retry loop (``Retrying``) runs against a call that always fails with gRPC
``UNAVAILABLE`` (what a client sees once its server is gone), on a fake clock.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicy, Retrying

from flinkish_spark.connect_client import DEFAULT_SERVER_TIMEOUT_S, bound_retries, check_server_timeout, retry_bound
from flinkish_spark.connect_retries import BoundedRetries
from flinkish_spark.errors import ConfigError


class Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def trailing_metadata(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.attempts = 0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> bool:
        self.t += seconds
        return False

    def bounded(self, seconds: float) -> BoundedRetries:
        return BoundedRetries(DefaultPolicy(), seconds, now=self.now, pause=self.sleep)


def seconds_until_the_call_fails(policy: RetryPolicy, clock: Clock, error: Exception | None = None) -> float:
    with pytest.raises(type(error or Unavailable())):
        for attempt in Retrying([policy], sleep=clock.sleep):
            with attempt:
                clock.attempts += 1
                raise error or Unavailable()
    return clock.t


def test_pyspark_alone_retries_a_dead_server_for_ten_minutes_per_call() -> None:
    clock = Clock()
    assert seconds_until_the_call_fails(DefaultPolicy(), clock) > 600


def test_the_bound_ends_the_retries_at_the_bound_with_the_same_backoff() -> None:
    assert DEFAULT_SERVER_TIMEOUT_S <= 120
    for _ in range(20):  # the backoff's jitter is random
        clock = Clock()
        took = seconds_until_the_call_fails(clock.bounded(DEFAULT_SERVER_TIMEOUT_S), clock)
        # The last wait is cut short to end at the bound; one more attempt there, then the error.
        assert DEFAULT_SERVER_TIMEOUT_S <= took <= DEFAULT_SERVER_TIMEOUT_S + 0.01
        assert clock.attempts == 7  # at 0, after waits of 0.05, 0.2, 0.8, 3.2, 12.8 s (+ jitter), at the bound

    # An error the policy does not retry still fails at once.
    clock = Clock()
    assert seconds_until_the_call_fails(clock.bounded(5), clock, ValueError("x")) == 0
    assert clock.attempts == 1


def test_give_up_ends_a_call_waiting_for_its_next_attempt() -> None:
    policy = BoundedRetries(DefaultPolicy(), 60)
    failed: list[BaseException] = []

    def call() -> None:
        try:
            for attempt in Retrying([policy]):
                with attempt:
                    raise Unavailable()
        except BaseException as exc:  # noqa: BLE001
            failed.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=5)  # in its 12.8 s wait by then
    assert caller.is_alive()
    started = time.monotonic()
    policy.give_up()
    caller.join(timeout=10)
    assert not caller.is_alive() and isinstance(failed[0], Unavailable)
    assert time.monotonic() - started < 2


def test_bound_retries_wraps_the_clients_own_policies_once() -> None:
    class Mine(DefaultPolicy):
        pass

    client = SimpleNamespace(policies=[Mine()])
    client.get_retry_policies = lambda: list(client.policies)
    client.set_retry_policies = lambda ps: setattr(client, "policies", list(ps))
    spark: Any = SimpleNamespace(client=client)

    assert retry_bound(spark) is None
    assert bound_retries(spark) == DEFAULT_SERVER_TIMEOUT_S
    assert bound_retries(spark) == DEFAULT_SERVER_TIMEOUT_S  # None keeps the installed bound
    assert bound_retries(spark, 15) == 15 == retry_bound(spark)
    [policy] = client.policies
    assert isinstance(policy, BoundedRetries) and type(policy.inner) is Mine

    for bad in (0, -1, "soon", float("nan")):
        with pytest.raises(ConfigError, match="server_timeout"):
            check_server_timeout(bad)  # type: ignore[arg-type]
