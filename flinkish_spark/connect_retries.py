"""A pyspark Connect retry policy bounded in time: see :mod:`flinkish_spark.connect_client`.

A module of its own because it imports pyspark's Connect client (grpc), which a Classic-only
install lacks; :mod:`flinkish_spark.connect_client` imports it only for a Connect session.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from pyspark.sql.connect.client.retries import RetryPolicy, RetryPolicyState


class BoundedRetries(RetryPolicy):
    """``inner`` (retrying the same errors, with the same backoff) for at most ``seconds`` per call, until
    :meth:`give_up`.

    ``now`` and ``pause`` (wait that many seconds; True if given up meanwhile) are for tests.
    """

    def __init__(self, inner: RetryPolicy, seconds: float, now: Callable[[], float] = time.monotonic,
                 pause: Callable[[float], bool] | None = None) -> None:
        super().__init__(max_retries=inner.max_retries, initial_backoff=inner.initial_backoff,
                         max_backoff=inner.max_backoff, backoff_multiplier=inner.backoff_multiplier,
                         jitter=inner.jitter, min_jitter_threshold=inner.min_jitter_threshold,
                         recognize_server_retry_delay=inner.recognize_server_retry_delay,
                         max_server_retry_delay=inner.max_server_retry_delay)
        self.inner = inner
        self.seconds = seconds
        self.now = now
        self._given_up = threading.Event()
        self.pause = pause or self._given_up.wait
        self._name = f"{inner.name} for at most {seconds:g}s"

    def can_retry(self, exception: BaseException) -> bool:
        return self.inner.can_retry(exception)

    def to_state(self) -> RetryPolicyState:
        # pyspark makes one state per call (one ``Retrying``): the bound counts from this call's first failure.
        return _BoundedState(self)

    def give_up(self) -> None:
        """End every call's retries now, also of calls waiting for their next attempt (pyspark's background
        calls to a server that is gone: the process would wait for them at its exit)."""
        self._given_up.set()

    @property
    def given_up(self) -> bool:
        return self._given_up.is_set()


class _BoundedState(RetryPolicyState):
    def __init__(self, policy: BoundedRetries) -> None:
        super().__init__(policy)
        self._bounded = policy
        self._inner = policy.inner.to_state()
        self._first_failure: float | None = None

    def next_attempt(self, exception: Optional[BaseException] = None) -> Optional[int]:
        bounded = self._bounded
        now = bounded.now()
        if self._first_failure is None:
            self._first_failure = now
        left_s = self._first_failure + bounded.seconds - now
        wait_ms = self._inner.next_attempt(exception)
        if bounded.given_up or left_s <= 0 or wait_ms is None:
            return None
        # The wait happens here, not in pyspark's sleep (it is then 0 ms): give_up() cuts it short. The last
        # wait ends at the bound, for one more attempt there.
        if bounded.pause(min(wait_ms / 1000, left_s)) or bounded.given_up:
            return None
        return 0
