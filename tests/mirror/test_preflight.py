"""``flinkish mirror``'s preflight: every mistake found before Spark starts, in one line naming the fix.

Each case runs the command as a user does (a subprocess) against the embedded PostgreSQL with
one bad input, and checks what the user notices: exit code 2, the line with the fix, the time
to the answer (printed; Spark's start alone takes longer than the bound asserted here), and
that nothing was created -- no replication slot or publication on the server, no folder or
object in storage. No Spark starts (a case that got past the preflight would, and time out).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

from flinkish_spark.testing.mirror import slots_and_publications

SECRET = "pre-fl1ght-pw"
#: A case that gets past the preflight starts Spark and mirrors until killed: fail it long before that matters.
TIMEOUT_S = 120


def as_role(url: str, role: str, password: str | None = None) -> str:
    """``url`` with another user (the embedded server trusts local connections: any password is accepted)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}" if password else f"{role}@{host}"))


def role(conn: Any, name: str, attributes: str = "") -> None:
    """A login role (cluster-wide: created once, reused by later tests with its attributes reset)."""
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
    conn.execute(f"{'ALTER' if exists else 'CREATE'} ROLE {name} WITH LOGIN NOSUPERUSER "
                 f"{attributes or 'NOREPLICATION'}")


def mirror(pg_url: str, tmp_path: Path, *, source: str | None = None, tables: str = "public.fh_*",
           to: str | None = None, extra: tuple[str, ...] = ()) -> tuple[int, str, float]:
    cmd = [sys.executable, "-m", "flinkish_spark.cli", "mirror", "--from", source or pg_url, "--tables", tables,
           "--to", to or str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "meta"), *extra]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"no answer within {TIMEOUT_S}s (the preflight let it through):\n"
                             f"{(e.stdout or b'')[-3000:]!r}\n{(e.stderr or b'')[-3000:]!r}") from None
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


TABLES = "CREATE TABLE fh_a (id int PRIMARY KEY, v text); INSERT INTO fh_a VALUES (1, 'a');" \
         "CREATE TABLE fh_b (id int PRIMARY KEY, v text); INSERT INTO fh_b VALUES (1, 'b');"


def no_replication(conn: Any, url: str, db: str) -> dict[str, Any]:
    role(conn, "fh_plain")
    conn.execute("ALTER TABLE fh_a OWNER TO fh_plain; ALTER TABLE fh_b OWNER TO fh_plain")
    return {"source": as_role(url, "fh_plain")}


def no_create_on_database(conn: Any, url: str, db: str) -> dict[str, Any]:
    role(conn, "fh_repl", "REPLICATION")
    conn.execute("ALTER TABLE fh_a OWNER TO fh_repl; ALTER TABLE fh_b OWNER TO fh_repl")
    return {"source": as_role(url, "fh_repl")}


def not_the_tables_owner(conn: Any, url: str, db: str) -> dict[str, Any]:
    role(conn, "fh_reader", "REPLICATION")
    conn.execute(f'GRANT CREATE ON DATABASE "{db}" TO fh_reader; GRANT SELECT ON fh_a, fh_b TO fh_reader')
    return {"source": as_role(url, "fh_reader")}


def no_select(conn: Any, url: str, db: str) -> dict[str, Any]:
    role(conn, "fh_owner", "REPLICATION")
    conn.execute(f'GRANT CREATE ON DATABASE "{db}" TO fh_owner; ALTER TABLE fh_a OWNER TO fh_owner')
    return {"source": as_role(url, "fh_owner")}


def given_publication_missing(conn: Any, url: str, db: str) -> dict[str, Any]:
    """A name given for a publication that does not exist: the source would create it, which this role may not."""
    role(conn, "fh_repl", "REPLICATION")
    conn.execute("GRANT SELECT ON fh_a, fh_b TO fh_repl")
    return {"source": as_role(url, "fh_repl"), "extra": ("--source-option", "publication=fh_nope")}


def given_publication_without_a_table(conn: Any, url: str, db: str) -> dict[str, Any]:
    conn.execute("CREATE PUBLICATION fh_pub FOR TABLE fh_a")
    return {"extra": ("--source-option", "publication=fh_pub")}


def leftovers_of_another_mirror(conn: Any, url: str, db: str) -> dict[str, Any]:
    """What a mirror with another checkpoint (or a failed run of old) left: the names this one would create."""
    conn.execute("CREATE PUBLICATION flinkish_mirror FOR TABLE fh_a")
    conn.execute("SELECT pg_create_logical_replication_slot('flinkish_mirror', 'pgoutput')")
    return {}


def no_matching_table(conn: Any, url: str, db: str) -> dict[str, Any]:
    return {"tables": "public.nothing_*"}


def to_under_a_file(conn: Any, url: str, db: str) -> dict[str, Any]:
    return {"to": "{tmp}/a-file/lake"}


def to_the_source_database(conn: Any, url: str, db: str) -> dict[str, Any]:
    host = urllib.parse.urlsplit(url).netloc.rsplit("@", 1)[-1]
    # Another spelling of the same server and database: localhost for 127.0.0.1, another user.
    other = url.replace(host, host.replace("127.0.0.1", "localhost"), 1)
    return {"to": as_role(other, "postgres"), "extra": ("--format", "postgres")}


def sink_option_the_sink_refuses(conn: Any, url: str, db: str) -> dict[str, Any]:
    return {"extra": ("--sink-option", "mergeMode=sometimes")}


def transform_naming_a_missing_column(conn: Any, url: str, db: str) -> dict[str, Any]:
    return {"extra": ("--sink-option", 'transforms=[{"tables": "public.fh_a", "filter": "nope > 1"}]')}


def unreachable_source_with_a_password(conn: Any, url: str, db: str) -> dict[str, Any]:
    return {"source": f"postgresql://postgres:{SECRET}@127.0.0.1:1/{db}"}


Case = Callable[[Any, str, str], dict[str, Any]]
CASES: list[tuple[Case, list[str]]] = [
    (no_replication, ["role 'fh_plain' has no REPLICATION privilege", "ALTER ROLE fh_plain WITH REPLICATION"]),
    (no_create_on_database, ["may not create the publication", "GRANT CREATE ON DATABASE",
                             "--source-option publication="]),
    (not_the_tables_owner, ["may not create the publication", "does not own public.fh_a, public.fh_b",
                            "--source-option publication="]),
    (no_select, ["GRANT SELECT ON public.fh_b TO fh_owner"]),
    (given_publication_missing, ["the publication 'fh_nope' does not exist, and the role 'fh_repl' may not create it",
                                 "GRANT CREATE ON DATABASE", "does not own public.fh_a, public.fh_b",
                                 "CREATE PUBLICATION fh_nope FOR TABLE public.fh_a, public.fh_b"]),
    (given_publication_without_a_table, ["the publication 'fh_pub' does not publish public.fh_b",
                                         "ALTER PUBLICATION fh_pub ADD TABLE public.fh_b"]),
    (leftovers_of_another_mirror, ["a publication named 'flinkish_mirror' already exists and was not created by "
                                   "this source", "DROP PUBLICATION flinkish_mirror",
                                   "SELECT pg_drop_replication_slot('flinkish_mirror')"]),
    (no_matching_table, ["no table matches 'tables' = 'public.nothing_*'"]),
    (to_under_a_file, ["is not writable"]),
    (to_the_source_database, ["--to names the source database itself"]),
    (sink_option_the_sink_refuses, ["mergeMode", "sometimes"]),
    (transform_naming_a_missing_column, ["source table public.fh_a: transforms rule for 'public.fh_a' names column(s) "
                                         "nope (in the filter 'nope > 1') the table does not have (its columns: id, v)"]),
    (unreachable_source_with_a_password, ["is unreachable"]),
]


@pytest.mark.parametrize("case, expected", CASES, ids=[c.__name__ for c, _ in CASES])
def test_a_mistake_is_found_before_anything_is_created(case: Case, expected: list[str], pg_url: str,
                                                       tmp_path: Path) -> None:
    db = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(TABLES)
        given = case(conn, pg_url, db)
    (tmp_path / "a-file").write_text("not a folder")
    if "to" in given:
        given["to"] = given["to"].replace("{tmp}", str(tmp_path))
    rc, out, seconds = mirror(pg_url, tmp_path, **given)
    print(f"{case.__name__}: exit {rc} after {seconds:.2f}s")
    assert rc == 2, out[-3000:]
    for text in expected:
        assert text in out, out[-3000:]
    assert "starting Spark" not in out and "Traceback" not in out, out[-3000:]
    assert SECRET not in out
    assert seconds < 10, f"{seconds:.1f}s"  # about 1 s here; Spark's start alone takes longer
    left = {given_publication_without_a_table: (0, ["fh_pub"]), leftovers_of_another_mirror: (1, ["flinkish_mirror"])}
    assert slots_and_publications(pg_url) == left.get(case, (0, []))  # only what the case made itself
    assert not (tmp_path / "lake").exists() and not (tmp_path / "meta").exists()


def test_every_problem_is_named_at_once(pg_url: str, tmp_path: Path) -> None:
    """Two tables the role may not read: two lines, not one per attempt; and one without a key: a warning."""
    db = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(TABLES + "CREATE TABLE fh_c (v text);")
        role(conn, "fh_owner", "REPLICATION")
        conn.execute(f'GRANT CREATE ON DATABASE "{db}" TO fh_owner; ALTER TABLE fh_c OWNER TO fh_owner')
    rc, out, seconds = mirror(pg_url, tmp_path, source=as_role(pg_url, "fh_owner"))
    print(f"exit {rc} after {seconds:.2f}s")
    assert rc == 2, out
    lines = out.strip().splitlines()
    assert any("GRANT SELECT ON public.fh_a TO fh_owner" in ln for ln in lines), out
    assert any("GRANT SELECT ON public.fh_b TO fh_owner" in ln for ln in lines), out
    assert [ln for ln in lines if "public.fh_c" in ln] == [
        "flinkish mirror: warning: public.fh_c is not followed: it has no primary key. ALTER TABLE public.fh_c ADD "
        "PRIMARY KEY (...) or ALTER TABLE public.fh_c REPLICA IDENTITY USING INDEX <a unique index on NOT NULL "
        "columns>, and it is picked up (snapshot, then its changes) at the next catalog poll, without a restart"], out
    assert slots_and_publications(pg_url) == (0, [])


def test_an_s3_target_is_probed_with_a_put_and_a_delete(s3: str, pg_url: str, tmp_path: Path) -> None:
    """A missing bucket is refused before Spark; a writable one gets a probe object that is gone again."""
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.mirror.preflight import probe_writable

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(TABLES)
    rc, out, seconds = mirror(pg_url, tmp_path, to="s3://no-such-bucket/lake",
                              extra=("--sink-option", f"endpointUrl={s3}"))
    print(f"missing bucket: exit {rc} after {seconds:.2f}s")
    assert rc == 2 and "the bucket 'no-such-bucket' does not exist" in out, out[-3000:]
    assert seconds < 10 and slots_and_publications(pg_url) == (0, [])

    io = FileIO.for_url("s3://test/lake", {"endpoint_url": s3})
    assert probe_writable(io, "s3://test/lake", "--to") is None
    assert io.list_names("s3://test/lake") == [] and io.list_names("s3://test") == []


def test_another_schema_of_the_source_database_is_a_valid_target(pg_url: str, tmp_path: Path) -> None:
    """Only a target template that names a table the mirror reads is refused in the source database."""
    from flinkish_spark.mirror.config import from_args
    from flinkish_spark.mirror.preflight import problems

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(TABLES)

    def found(*sink_option: str) -> list[str]:
        return problems(from_args(source=pg_url, tables="public.fh_*", to=pg_url, fmt="postgres",
                                  checkpoint=str(tmp_path / "meta"), sink_option=sink_option))

    assert found("table=mirror.{schema}_{table}") == []
    assert any("--to names the source database itself" in p and "public.fh_copy_fh_a" in p
               for p in found("table={schema}.fh_copy_{table}")), found("table={schema}.fh_copy_{table}")


def test_a_given_publication_name_that_does_not_exist_yet_is_created_by_a_role_that_may(pg_url: str,
                                                                                      tmp_path: Path) -> None:
    """As the source documents: a name given for a publication that does not exist is created (here: a superuser)."""
    from flinkish_spark.mirror.config import from_args
    from flinkish_spark.mirror.preflight import problems

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(TABLES)
    assert problems(from_args(source=pg_url, tables="public.fh_*", to=str(tmp_path / "lake"), fmt=None,
                              checkpoint=str(tmp_path / "meta"), source_option=["publication=fh_new"])) == []
    assert slots_and_publications(pg_url) == (0, []) and not (tmp_path / "lake").exists()


def test_wal_level_not_logical_is_found_before_anything_is_created(tmp_path: Path) -> None:
    """A server of its own with ``wal_level = replica`` (the embedded one is logical)."""
    import os

    if os.environ.get("FLINKISH_TEST_POSTGRES_URL"):
        pytest.skip("needs a second embedded server")
    from flinkish_spark.embedded.postgres import temporary_postgres

    with temporary_postgres("flinkish-test-pg-replica-", settings={"wal_level": "replica"}) as server:
        with psycopg.connect(server.uri, autocommit=True) as conn:
            conn.execute(TABLES)
        rc, out, seconds = mirror(server.uri, tmp_path)
        print(f"wal_level replica: exit {rc} after {seconds:.2f}s")
        assert rc == 2 and "wal_level is 'replica'" in out and "ALTER SYSTEM SET wal_level = 'logical'" in out, out
        assert seconds < 10 and slots_and_publications(server.uri) == (0, [])
        assert not (tmp_path / "lake").exists() and not (tmp_path / "meta").exists()


def test_tables_without_a_usable_key_are_warnings_not_problems(pg_url: str, tmp_path: Path) -> None:
    """No primary key, REPLICA IDENTITY FULL or NOTHING without one: the mirror may start, each is a warning;
    REPLICA IDENTITY USING INDEX on a unique index is a key (no word about it)."""
    from flinkish_spark.mirror.config import from_args
    from flinkish_spark.mirror.preflight import problems

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE fh_ok (id int PRIMARY KEY); CREATE TABLE fh_none (v text); "
                     "CREATE TABLE fh_full (v text); ALTER TABLE fh_full REPLICA IDENTITY FULL; "
                     "CREATE TABLE fh_nothing (v text); ALTER TABLE fh_nothing REPLICA IDENTITY NOTHING; "
                     "CREATE TABLE fh_index (code text NOT NULL); CREATE UNIQUE INDEX fh_index_code ON fh_index (code); "
                     "ALTER TABLE fh_index REPLICA IDENTITY USING INDEX fh_index_code")
    warnings: list[str] = []
    assert problems(from_args(source=pg_url, tables="public.fh_*", to=str(tmp_path / "lake"), fmt=None,
                              checkpoint=str(tmp_path / "meta")), warnings) == []
    assert [w.split(" is not followed: ")[0] for w in warnings] == ["public.fh_full", "public.fh_none",
                                                                    "public.fh_nothing"]
    assert "public.fh_full is not followed: it has no primary key (REPLICA IDENTITY FULL alone" in warnings[0]
    assert "REPLICA IDENTITY NOTHING, so its updates and deletes carry no key" in warnings[2]
    assert slots_and_publications(pg_url) == (0, [])
