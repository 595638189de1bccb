"""Where ``flinkish mirror`` runs its query: a Spark driver in the pipeline process, or a Spark Connect server.

* ``--master URL`` (``pipeline.master``): ``local[N]`` (the default: ``local[P]`` for ``--parallelism P``,
  ``pipeline.parallelism``, default 2; on any master P is the number of sink tasks, :mod:`.spread`),
  ``local-cluster[N,cores,memoryMB]``, ``spark://host:7077``, ``yarn``, ``k8s://https://...``.
  The pipeline process is the driver (client deploy mode): the source's planning and the sink's commit run
  there, the reading and writing tasks on the executors. On a master whose executors are other machines, the
  passwords travel to them as ``spark.executorEnv`` entries, whose names Spark redacts (``...PASSWORD``).
* ``--remote sc://host:port`` (``pipeline.remote``): a Spark Connect server runs the query -- the source's
  planning, the tasks and the sink's commit, in the server's Python, with the server's environment. The
  pipeline process is its client: it starts and stops the query, shows the progress and records the figures
  (from the metadata and the query's progress events), and calls nothing of Spark's JVM. A call that finds the
  server gone waits at most ``--server-timeout`` (default 60 s, :mod:`flinkish_spark.connect_client`: pyspark
  alone retries for about ten minutes), then the mirror exits :data:`EXIT_RETRY` with one line saying so: the
  same command continues from the checkpoint once the server is back.

Guarantees: every bad value is one :class:`ConfigError` before anything starts (:func:`placement`); a
Connect URL's parameters (a token) are never printed (:func:`shown`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from flinkish_spark.errors import ConfigError

#: The exit code of a mirror whose Spark Connect server stopped answering (sysexits' EX_TEMPFAIL): nothing is
#: lost, the same command continues once the server is back -- a supervisor restarts it.
EXIT_RETRY = 75

_MASTER = re.compile(
    r"^(local(\[(\d+|\*)(,\d+)?\])?"  # local, local[4], local[*], local[4,2] (with task retries)
    r"|local-cluster\[\d+,\d+,\d+\]"  # local-cluster[executors,cores,memoryMB]
    r"|spark://[^/:,\s]+(:\d+)?(,[^/:,\s]+(:\d+)?)*"  # standalone, with standby masters
    r"|yarn"
    r"|k8s://(https?://)?[^/\s:]+(:\d+)?(/\S*)?)$")
_REMOTE = re.compile(r"^sc://[^/:;\s]+(:\d{1,5})?/?(;.*)?$")
_MASTERS = "local[N], local-cluster[N,cores,memoryMB], spark://host:7077, yarn or k8s://https://host:443"


def shown(remote: str) -> str:
    """``sc://host:port`` without the URL's parameters (``;token=...``)."""
    return remote.split(";", 1)[0].rstrip("/")


def check_master(value: str, what: str) -> str:
    if not _MASTER.match(value.strip()):
        raise ConfigError(f"{what}: {value!r} is not a Spark master URL; use {_MASTERS} (or --remote sc://host:port "
                          "for a Spark Connect server)")
    return value.strip()


def check_remote(value: str, what: str) -> str:
    value = value.strip()
    if not _REMOTE.match(value):
        raise ConfigError(f"{what}: {shown(value)!r} is not a Spark Connect URL; use sc://host:port (e.g. "
                          "sc://spark-server:15002; parameters such as ;token=... after the port)")
    return value


def placement(master: str | None, remote: str | None, server_timeout: float | None, *, checkpoint: str,
              spark_checkpoint: str | None, passwords: Sequence[tuple[str, str | None, str | None]],
              names: Mapping[str, str], parallelism: str | None = None, where: str = "") -> dict[str, Any]:
    """The :class:`~flinkish_spark.mirror.config.MirrorConfig` fields of where the mirror runs (``master``,
    ``remote``, ``server_timeout_s``), or one :class:`ConfigError`. ``server_timeout``: seconds, parsed by the
    caller (:func:`~flinkish_spark.mirror.config.parse_trigger`). ``passwords``: (setting, password given to
    this process, the ``passwordEnv`` option) of the source and the sink; ``names``: how the caller names the
    settings (flags or pipeline-file keys); ``where``: what every message starts with (``pipeline file: ``)."""
    if master is not None and remote is not None:
        raise ConfigError(f"{where}{names['master']} and {names['remote']} together: the query runs either on a Spark "
                          f"master driven from this process or in a Spark Connect server; give one")
    if server_timeout is not None and remote is None:
        raise ConfigError(f"{where}{names['server_timeout']} is for a Spark Connect server ({names['remote']} sc://...); "
                          "drop it")
    if remote is None:
        # Without a master, parallelism N is also the local driver's cores (local[N]); with one it is only the
        # number of sink tasks an epoch's per-table work is spread over (mirror.spread).
        default = f"local[{parallelism}]" if parallelism else "local[2]"
        return {"master": check_master(master, where + names["master"]) if master is not None else default}
    remote = check_remote(remote, where + names["remote"])
    if "://" in checkpoint and not checkpoint.startswith("file://") and not spark_checkpoint:
        raise ConfigError(
            f"{where}{names['remote']} with a {names['checkpoint']} that is not a local folder: give "
            f"{names['spark_checkpoint']}, a folder on the Spark Connect server's machine (Spark's own checkpoint; "
            "the default is a folder of this machine's state)")
    for setting, password, env in passwords:
        if password is not None and not env:
            raise ConfigError(
                f"{where}{names['remote']}: the password in {setting} cannot reach the connectors, which run in the Spark "
                f"Connect server (this process's environment is not the server's). Leave it out and set it in the "
                "server's environment (PGPASSWORD or ~/.pgpass there), or name a variable the server has with the "
                "connector's passwordEnv option")
    return {"remote": remote, "server_timeout_s": server_timeout}


def session(config: Any) -> Any:
    """The Spark session ``config`` runs on (see the module docstring)."""
    import flinkish_spark

    app = f"flinkish-mirror-{config.uid}"
    if config.remote is not None:
        return flinkish_spark.session(remote=config.remote, app_name=app, server_timeout=config.server_timeout_s)
    conf = {}
    if not config.master.startswith("local"):  # executors on other machines: the passwords' variables go along
        conf = {f"spark.executorEnv.{name}": value for name, value in config.password_env().items()}
    spark = flinkish_spark.session(master=config.master, app_name=app, conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def quiet(spark: Any) -> None:
    """Spark's log off (the cancelled batch's task errors of a stop at once); a Connect server's log is its own."""
    from flinkish_spark.connect_client import is_connect

    if spark is not None and not is_connect(spark):
        spark.sparkContext.setLogLevel("OFF")


def lost_server(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the Spark Connect server no longer runs the session (gone, or restarted)."""
    from flinkish_spark.connect_client import server_lost
    from flinkish_spark.errors import ConnectServerUnavailableError

    return isinstance(exc, ConnectServerUnavailableError) or (exc is not None and server_lost(exc) is not None)


def lost_server_line(config: Any, exc: BaseException) -> str:
    """What the mirror says, in one line, when its Connect server is gone."""
    from flinkish_spark.errors import ConnectServerUnavailableError

    if isinstance(exc, ConnectServerUnavailableError):
        why = " ".join(str(exc).split()).split(": the query", 1)[0].replace("(server_timeout)", "(--server-timeout)")
    else:  # before the query started: flinkish_spark.session() itself found no server
        why = f"the Spark Connect server {shown(config.remote)} did not answer"
    return (f"{why}: the mirror's query no longer runs there; nothing committed is lost. Once the server is back, "
            f"run the same command again: it continues from the checkpoint, exactly once (exit {EXIT_RETRY})")
