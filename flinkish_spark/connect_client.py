"""How long a Spark Connect client waits for a server that stopped answering, and the error it then raises.

pyspark retries a call that finds the server unreachable (gRPC ``UNAVAILABLE``) with its
``DefaultPolicy``: 15 retries, the backoff growing to 60 s, about ten minutes per call. A
pipeline script whose server died (killed, out of memory, its machine lost) therefore waits
that long in *each* call before it fails, pyspark's exit handlers included: measured, 611 s
until :func:`flinkish_spark.await_finished` raised, 20 minutes more until the process exited. The
query itself is gone with the server; waiting cannot bring it back.

:class:`~flinkish_spark.connect_retries.BoundedRetries` wraps each of the client's retry
policies (pyspark's supported extension point, ``client.set_retry_policies``): the same policy,
the same backoff, but a call gives up once ``seconds`` have passed since its first failed
attempt (the last wait is cut short to end at the bound). So a call fails at most about
``seconds`` plus one attempt after the server died; once one has, the others waiting end too. :func:`flinkish_spark.session` installs it on the Connect sessions it makes;
``await_finished`` and ``stop`` install it on a session that has no bound yet (a user's own
``SparkSession.builder.remote(...)``), for good: pyspark's background calls (releasing a
finished execution) must not hold the process at its exit for ten minutes either.

:func:`server_calls` turns the error of a call that gave up into one
:class:`~flinkish_spark.errors.ConnectServerUnavailableError` naming the server
(``sc://host:port``, never a token). A server that answers but hangs is not covered: pyspark's
per-call deadlines (10 minutes for most calls) bound that.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any, Iterator

from flinkish_spark.errors import ConfigError, ConnectServerUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_SERVER_TIMEOUT_S = 60.0
"""How long a call waits for a Connect server that does not answer, unless told otherwise: a
restart of the server takes longer, and a restarted server no longer runs the query anyway."""

# Error classes of a server that answers but is not the one that ran the query (it restarted).
_SESSION_GONE = ("INVALID_HANDLE.SESSION_CHANGED", "INVALID_HANDLE.SESSION_NOT_FOUND")


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no ``sparkContext``, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def check_server_timeout(seconds: float | None) -> float | None:
    """``seconds`` as a float, or :class:`ConfigError` unless it is None or a positive number."""
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise ConfigError(f"server_timeout={seconds!r}: expected the seconds (> 0) a call waits for a Spark Connect "
                          f"server that does not answer (default {DEFAULT_SERVER_TIMEOUT_S:g})")
    return value


def retry_bound(spark: "SparkSession") -> float | None:
    """The bound installed on Connect session ``spark``'s client, None if there is none."""
    from flinkish_spark.connect_retries import BoundedRetries

    bounds = [p.seconds for p in spark.client.get_retry_policies() if isinstance(p, BoundedRetries)]
    return bounds[0] if bounds else None


def bound_retries(spark: "SparkSession", seconds: float | None = None) -> float:
    """Bound every retry policy of Connect session ``spark``'s client to ``seconds`` per call, and return the bound.

    ``None`` keeps a bound already installed, else installs :data:`DEFAULT_SERVER_TIMEOUT_S`.
    The user's own policies are kept (wrapped), only their total time is bounded.
    """
    from flinkish_spark.connect_retries import BoundedRetries

    seconds = check_server_timeout(seconds)
    if seconds is None:
        seconds = retry_bound(spark) or DEFAULT_SERVER_TIMEOUT_S
    client = spark.client
    policies = [p.inner if isinstance(p, BoundedRetries) else p for p in client.get_retry_policies()]
    client.set_retry_policies([BoundedRetries(p, seconds) for p in policies])
    return seconds


def _give_up(spark: "SparkSession") -> None:
    """End the retries of Connect session ``spark`` (also pyspark's background calls waiting for their next
    attempt) and close its client: the server-side session is gone with the server."""
    from flinkish_spark.connect_retries import BoundedRetries

    # pyspark's listener thread, whose event stream ends now too, would repeat the news with the gRPC detail.
    warnings.filterwarnings("ignore", message="StreamingQueryListenerBus Handler thread received exception",
                            category=UserWarning)
    client = spark.client
    for policy in client.get_retry_policies():
        if isinstance(policy, BoundedRetries):
            policy.give_up()
    # A closed client is a stopped session: the process exits without pyspark's cleanup calls at exit
    # (each would retry the dead server again), and ``SparkSession.builder.remote(url).getOrCreate()``
    # makes a new session. close() waits for the background calls, which end now.
    with contextlib.suppress(Exception):
        client.close()


def server_url(spark: "SparkSession") -> str:
    """``sc://host:port`` of Connect session ``spark``: no parameters, so never a token."""
    builder = getattr(spark.client, "_builder", None)  # pyspark keeps the parsed URL there
    endpoint = getattr(builder, "endpoint", None) or getattr(spark.client, "host", "?")
    return f"sc://{endpoint}"


def server_lost(exc: BaseException) -> str | None:
    """``"unavailable"`` or ``"restarted"`` if ``exc`` means the Connect server no longer runs this session
    (gRPC ``UNAVAILABLE`` once the retries gave up, or the error class of a restarted server), None for any
    other error. Duck-typed: this module must import without pyspark's Connect client (grpc)."""
    status = getattr(exc, "getGrpcStatusCode", None) or getattr(exc, "code", None)
    try:
        code = status() if callable(status) else None
    except Exception:  # noqa: BLE001 - not a gRPC error after all
        code = None
    if code is not None and getattr(code, "name", None) == "UNAVAILABLE":
        return "unavailable"
    condition = getattr(exc, "getCondition", None)
    if callable(condition) and condition() in _SESSION_GONE:
        return "restarted"
    return None


@contextlib.contextmanager
def server_calls(spark: "SparkSession", seconds: float | None = None) -> Iterator[float | None]:
    """Within the block, calls to Connect session ``spark`` wait at most ``seconds`` (see :func:`bound_retries`)
    for a server that does not answer, then raise :class:`ConnectServerUnavailableError`. Yields the bound
    (None for a Classic session, where it does nothing)."""
    if not is_connect(spark):
        yield None
        return
    bound = bound_retries(spark, seconds)
    try:
        yield bound
    except Exception as exc:
        lost = server_lost(exc)
        if lost is None:
            raise
        why = f"did not answer for {bound:g}s (server_timeout)" if lost == "unavailable" else "restarted"
        _give_up(spark)
        # One error, not pyspark's chain: the gRPC detail adds nothing a user can act on.
        raise ConnectServerUnavailableError(
            f"the Spark Connect server {server_url(spark)} {why}: the query no "
            "longer runs there. Once the server is back, run the same script again: it continues from its "
            "checkpoints, every row exactly once"
        ) from None
