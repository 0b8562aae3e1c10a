"""Catalog storage: SQLAlchemy engine set-up, table definitions and migrations.

Two backends, chosen by URL: a SQLite file (the embedded default) and PostgreSQL (shared by
several gateway replicas). Every write transaction serialises on the table's row in
``harness_tables``: on PostgreSQL with ``SELECT ... FOR UPDATE``, on SQLite with
``BEGIN IMMEDIATE`` (the database write lock). Writers therefore queue instead of failing.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    cast,
    create_engine,
    event,
    extract,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool

from flight_gateway.protocol.errors import HarnessError

log = logging.getLogger(__name__)

metadata = MetaData()

# One row per catalog: the schema version of the catalog database itself, and the catalog's
# identity (``catalog_id``, random, made once): what it writes into storage another catalog
# may share carries it (``catalog_tag``), so neither takes nor deletes the other's files.
catalog_info = Table(
    "harness_catalog_info",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("schema_version", Integer, nullable=False),
    Column("catalog_id", String(32), nullable=True),
)

# Ids handed out so far, per kind of row (``table``): a table's id is never used again, so a
# table dropped and created under the same name is another incarnation (SQLite reuses the
# largest rowid once its row is deleted).
last_ids = Table(
    "harness_last_ids",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("last_id", BigInteger, nullable=False),
)

tables = Table(
    "harness_tables",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(512), nullable=False, unique=True),
    Column("current_version", BigInteger, nullable=False),
    Column("min_version", BigInteger, nullable=False),  # oldest version still readable
    Column("partition_by", JSON, nullable=False),
    Column("primary_key", JSON, nullable=False),
    Column("last_field_id", Integer, nullable=False),
    Column("next_fencing_token", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
)

schemas = Table(
    "harness_schemas",
    metadata,
    Column("table_id", ForeignKey("harness_tables.id", ondelete="CASCADE"), primary_key=True),
    Column("schema_id", Integer, primary_key=True),
    Column("fields", JSON, nullable=False),
    Column("added_version", BigInteger, nullable=False),
)

versions = Table(
    "harness_versions",
    metadata,
    Column("table_id", ForeignKey("harness_tables.id", ondelete="CASCADE"), primary_key=True),
    Column("version", BigInteger, primary_key=True),
    Column("committed_at", Float, nullable=False),
    Column("commit_id", String(256), nullable=False),
    Column("schema_id", Integer, nullable=False),
    Column("summary", JSON, nullable=False),
    UniqueConstraint("table_id", "commit_id", name="uq_harness_versions_commit_id"),
    Index("ix_harness_versions_time", "table_id", "committed_at"),
)

sources = Table(
    "harness_sources",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("table_id", ForeignKey("harness_tables.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(512), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("config", JSON, nullable=False),
    Column("partition", JSON, nullable=False),
    Column("added_version", BigInteger, nullable=False),
    Column("removed_version", BigInteger, nullable=True),
    Index("ix_harness_sources_table", "table_id", "name"),
)

# State of a source as set by the commit that made ``version``. The state at version v is the
# row with the greatest version <= v; the primary key makes that one index seek per source.
source_states = Table(
    "harness_source_states",
    metadata,
    Column("source_id", ForeignKey("harness_sources.id", ondelete="CASCADE"), primary_key=True),
    Column("version", BigInteger, primary_key=True),
    Column("state", JSON, nullable=False),
    Column("state_version", BigInteger, nullable=False),
)

# Versioned key/values: ns 'external' (writer state such as consumer offsets) and 'property'.
# A null value deletes the key from that version on.
kv = Table(
    "harness_kv",
    metadata,
    Column("table_id", ForeignKey("harness_tables.id", ondelete="CASCADE"), primary_key=True),
    Column("ns", String(16), primary_key=True),
    Column("key", String(512), primary_key=True),
    Column("version", BigInteger, primary_key=True),
    Column("value", JSON, nullable=True),
)

locks = Table(
    "harness_locks",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),  # queue order
    Column("lock_id", String(64), nullable=False, unique=True),
    Column("table_id", ForeignKey("harness_tables.id", ondelete="CASCADE"), nullable=False),
    Column("owner", String(512), nullable=False),
    Column("sources", JSON, nullable=False),
    Column("granted", Boolean, nullable=False),
    Column("fencing_token", BigInteger, nullable=True),
    # Granted: end of the lease. Waiting: end of the waiter's heartbeat, so a waiter that
    # died stops holding its place in the queue.
    Column("expires_at", Float, nullable=False),
    Column("ttl_s", Float, nullable=False),
    Index("ix_harness_locks_table", "table_id", "granted"),
)


def _migration_1(conn: Connection) -> None:
    metadata.create_all(conn)


def _migration_2(conn: Connection) -> None:
    """The Postgres commit and lock functions (one round trip per commit or lock step)."""
    if conn.dialect.name == "postgresql":
        from flight_gateway.catalog import pg_functions as postgres_sql

        conn.exec_driver_sql(postgres_sql.COMMIT_FUNCTION_V1)
        conn.exec_driver_sql(postgres_sql.LOCK_FUNCTION_V1)


def _migration_3(conn: Connection) -> None:
    """Table ids are never reused (``last_ids``), starting past the largest one in use."""
    last_ids.create(conn, checkfirst=True)
    if conn.execute(select(last_ids.c.last_id).where(last_ids.c.name == "table")).first() is None:
        largest = conn.execute(select(func.max(tables.c.id))).scalar() or 0
        conn.execute(last_ids.insert().values(name="table", last_id=int(largest)))


def next_table_id(conn: Connection) -> int:
    """A table id no table of this catalog ever had (taken under the counter's row lock)."""
    q = select(last_ids.c.last_id).where(last_ids.c.name == "table")
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    row = conn.execute(q).first()
    largest = conn.execute(select(func.max(tables.c.id))).scalar() or 0
    new = max(int(row[0]) if row else 0, int(largest)) + 1
    if row is None:
        conn.execute(last_ids.insert().values(name="table", last_id=new))
    else:
        conn.execute(last_ids.update().where(last_ids.c.name == "table").values(last_id=new))
    return new


def _migration_4(conn: Connection) -> None:
    """The Postgres lock step with per-source queue places (``locks.step``)."""
    if conn.dialect.name == "postgresql":
        from flight_gateway.catalog import pg_functions as postgres_sql

        conn.exec_driver_sql(postgres_sql.LOCK_FUNCTION_V2)


def _migration_5(conn: Connection) -> None:
    """The catalog's identity (``catalog_info.catalog_id``); a new catalog's row gets its own
    when ``migrate`` inserts it."""
    columns = {c["name"] for c in inspect(conn).get_columns(catalog_info.name)}
    if "catalog_id" not in columns:
        conn.execute(text(f"ALTER TABLE {catalog_info.name} ADD COLUMN catalog_id VARCHAR(32)"))
    conn.execute(
        catalog_info.update()
        .where(catalog_info.c.catalog_id.is_(None))
        .values(catalog_id=uuid.uuid4().hex)
    )


def catalog_id(conn: Connection) -> str:
    return str(conn.execute(select(catalog_info.c.catalog_id)).scalar_one())


# Append-only list: migration i (1-based) moves the catalog from schema version i-1 to i.
# Never edit a released migration; add a new one.
MIGRATIONS: list[Callable[[Connection], None]] = [
    _migration_1,
    _migration_2,
    _migration_3,
    _migration_4,
    _migration_5,
]
SCHEMA_VERSION = len(MIGRATIONS)


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and paths; pick psycopg 3 as the Postgres driver."""
    if "://" not in url:
        url = f"sqlite:///{url}"
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, usable: int | None = None) -> Engine:
    """The catalog's engine; on PostgreSQL its pool fitted to a server that leaves ``usable``
    connections to clients (``pool_sizes``; None: the defaults)."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        # A few connections kept open (one thread uses a connection at a time): opening one
        # per use cost more than the transactions it ran, because closing the last connection
        # to a WAL database checkpoints and deletes the log, with an fsync, every time (a
        # one-row DoPut took 20 ms, most of it there). No cap beyond them (max_overflow=-1),
        # as before: a caller never waits for a pooled connection, only for SQLite's own
        # lock (timeout: the busy timeout for BEGIN IMMEDIATE).
        engine = create_engine(
            url,
            poolclass=QueuePool,
            pool_size=4,
            max_overflow=-1,
            connect_args={"timeout": 120, "check_same_thread": False},
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # We emit BEGIN ourselves (below); pysqlite's implicit transactions would not
            # take the write lock up front.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=120000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = "IMMEDIATE" if conn.get_execution_options().get("harness_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    main, _ = pool_sizes(usable)
    return create_engine(url, pool_size=main[0], max_overflow=main[1], pool_pre_ping=True)


#: (pool_size, max_overflow) of a catalog's engines on PostgreSQL when the server has room:
#: transactions and reads (8 kept, up to 40), and one-statement commits and lock steps (32
#: kept, up to 64: a busy gateway has a few dozen in flight).
MAIN_POOL, FAST_POOL = (8, 32), (32, 32)


def pool_sizes(usable: int | None) -> tuple[tuple[int, int], tuple[int, int]]:
    """(pool_size, max_overflow) of a catalog's two engines on a server that leaves ``usable``
    connections to clients (None: unknown, the defaults). One catalog (one gateway) takes at
    most half of them, shared between its engines in the defaults' proportion, so a replica,
    maintenance and the sources' pools find room: past the server's limit a new connection is
    refused ("too many clients already") and the call fails, while below a pool's cap a caller
    waits for a connection another gives back (no catalog path holds two at once)."""
    if usable is None:
        return MAIN_POOL, FAST_POOL
    main_max, fast_max = sum(MAIN_POOL), sum(FAST_POOL)
    budget = max(4, usable // 2)
    main_total = min(main_max, max(2, budget * main_max // (main_max + fast_max)))
    fast_total = min(fast_max, max(2, budget - main_total))
    main_kept, fast_kept = min(MAIN_POOL[0], main_total), min(FAST_POOL[0], fast_total)
    return (main_kept, main_total - main_kept), (fast_kept, fast_total - fast_kept)


def usable_connections(engine: Engine) -> int | None:
    """Connections the catalog's PostgreSQL server leaves to clients (its ``max_connections``
    less those reserved for superusers); None on SQLite."""
    if is_sqlite(engine):
        return None
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
        ).first()
    return int(row[0]) if row is not None else None


def autocommit_engine(url: str, usable: int | None = None) -> Engine:
    """Postgres connections for one-statement transactions (the commit and lock functions).

    In autocommit mode the statement is its own transaction: no BEGIN or COMMIT round trips.
    No ping before use either (another round trip): callers retry once on a dead connection,
    which is safe because what they send is idempotent (commit ids, lock ids).
    """
    _, fast = pool_sizes(usable)
    return create_engine(
        normalize_url(url),
        isolation_level="AUTOCOMMIT",
        # Kept open, not closed on return: a busy gateway has a few dozen commits in flight.
        pool_size=fast[0],
        max_overflow=fast[1],
        pool_reset_on_return=None,
    )


def call_once_retried(engine: Engine, sql: str, params: tuple[Any, ...]) -> Any:
    """One statement on ``engine``; retried once if the pooled connection was dead."""
    for attempt in (1, 2):
        try:
            with engine.connect() as conn:
                return conn.exec_driver_sql(sql, params).scalar()
        except DBAPIError as e:
            if attempt == 2 or not e.connection_invalidated:
                raise
    raise AssertionError("unreachable")


def one_statement(engine: Engine, sql: str, params: Any) -> list[Any]:
    """The rows of one read-only statement on a DBAPI connection of ``engine``'s pool, sent
    once more on a fresh connection when the pooled one was dead (the autocommit engine does
    not ping before use; a read is safe to repeat)."""
    for attempt in (1, 2):
        try:
            return _one_statement(engine, sql, params)
        except DBAPIError as e:
            if attempt == 2 or not e.connection_invalidated:
                raise
    raise AssertionError("unreachable")


def _one_statement(engine: Engine, sql: str, params: Any) -> list[Any]:
    raw = engine.raw_connection()
    cur = None
    try:
        cur = raw.cursor()
        cur.execute(sql, params)
        return list(cur.fetchall())
    except engine.dialect.loaded_dbapi.Error as e:
        # As SQLAlchemy does: a broken connection is not lent again and, when the server went
        # away, none of those pooled with it (they are dead too).
        gone = engine.dialect.is_disconnect(e, raw.dbapi_connection, cur)
        raw.invalidate(e)
        if gone:
            engine.dispose()
        error = DBAPIError.instance(
            sql, params, e, engine.dialect.loaded_dbapi.Error, dialect=engine.dialect
        )
        error.connection_invalidated = gone
        raise error from e
    finally:
        if cur is not None:
            with contextlib.suppress(Exception):
                cur.close()
        raw.close()


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """A transaction that may write. On SQLite it holds the write lock from its first statement."""
    with engine.connect().execution_options(harness_write=True) as conn, conn.begin():
        yield conn


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: one consistent snapshot of the catalog."""
    with engine.connect() as conn, conn.begin():
        yield conn


def db_now(conn: Connection) -> float:
    """Seconds since the epoch by the catalog database's clock.

    Replicas sharing a Postgres catalog use its clock for leases and commit times, so their own
    clocks may disagree without breaking lock expiry.
    """
    if conn.dialect.name == "postgresql":
        return float(
            conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")).scalar_one()
        )
    return time.time()


def clock(conn: Connection) -> Any:
    """The catalog clock as a value for a statement: on Postgres an expression the statement
    evaluates itself (so a statement needs no separate round trip to read the time)."""
    if conn.dialect.name == "postgresql":
        return cast(extract("epoch", func.clock_timestamp()), Float)
    return time.time()


def migrate(engine: Engine) -> None:
    """Create or upgrade the catalog schema. Safe to call from many processes at once."""
    with write_tx(engine) as conn:
        if conn.dialect.name == "postgresql":
            # Serialise concurrent first opens; released at transaction end.
            conn.execute(text("SELECT pg_advisory_xact_lock(7310925)"))
        current = 0
        if conn.dialect.has_table(conn, catalog_info.name):
            row = conn.execute(select(catalog_info.c.schema_version)).first()
            current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise HarnessError(
                f"catalog schema version {current} is newer than this release supports "
                f"({SCHEMA_VERSION}); upgrade the gateway"
            )
        for i in range(current, SCHEMA_VERSION):
            log.info("migrating harness catalog schema %d -> %d", i, i + 1)
            MIGRATIONS[i](conn)
        if current == 0:
            conn.execute(
                catalog_info.insert().values(
                    id=1, schema_version=SCHEMA_VERSION, catalog_id=uuid.uuid4().hex
                )
            )
        elif current < SCHEMA_VERSION:
            conn.execute(catalog_info.update().values(schema_version=SCHEMA_VERSION))
