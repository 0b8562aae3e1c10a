"""ADBC connections to PostgreSQL opened from one driver database per DSN.

The ADBC PostgreSQL driver reads the server's type catalogue (``pg_type``) when a *database*
handle is made, and its DB-API ``connect`` makes a database for every connection: 36-46 ms of
each new connection on loopback (the catalogue query on both sides), against ~2 ms for a
connection of a database kept here. A gateway's first statement over a PostgreSQL source, and
every burst that grows a read process's pool (a replica restarted under load), paid it per
connection.

The catalogue is the types as they were when the database was made: a type created later (an
enum, a composite, their arrays) comes back as opaque bytes (``unnamed<oid:...>``). A read that
meets one asks for ``renew``, which makes the DSN's database again if the one that connection
came from is older than ``FRESH_S``. A database younger than that knows every type the server
had: a type it still did not know is one the driver never reads (its catalogue query leaves
out range types), remembered per DSN so that reads of it do not renew again, and read as
before. A database is also made again when it is older than ``MAX_AGE_S``, so a changed type
catalogue is learnt on the next new connection within that.

The driver counts a database's open connections in a plain integer, changed when a connection
opens or closes with the GIL released: the connections of one database are opened and closed
one at a time (its ``lock``), or concurrent ones could leave the count wrong and the database's
release failing. A connection that waits longer than ``LOCK_WAIT_S`` for it (another one slow
to connect: a far or unanswering server) is opened from a database of its own instead, as the
driver's DB-API does; a close that waits that long closes without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

log = logging.getLogger(__name__)

#: A database made this recently knew the server's types when the read's query ran.
FRESH_S = 1.0
#: A database older than this is made again for the next new connection.
MAX_AGE_S = 300.0
#: Databases kept (each holds the server's type catalogue, a few hundred KB).
MAX_DSNS = 64
#: How long opening or closing a connection waits for its database's lock.
LOCK_WAIT_S = 0.25


@dataclass
class _Database:
    shared: Any  # adbc_driver_manager.dbapi's shared database handle (reference counted)
    made: float = field(default_factory=time.monotonic)
    lock: threading.RLock = field(default_factory=threading.RLock)
    released: bool = False  # the holder let go of it (connections still open keep it)


def _connection_class() -> Any:
    import adbc_driver_manager.dbapi as dbapi

    class Connection(dbapi.Connection):
        """A DB-API connection of a kept database, closed under the database's lock."""

        def __init__(self, db: _Database, raw: Any) -> None:
            self.harness_database = db
            super().__init__(db.shared, raw, autocommit=True)

        def close(self) -> None:
            lock = self.harness_database.lock
            held = lock.acquire(timeout=LOCK_WAIT_S)
            try:
                super().close()
            finally:
                if held:
                    lock.release()

    return Connection


class Databases:
    """One ADBC database per DSN (at most ``MAX_DSNS``), connections opened from it."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Database] = OrderedDict()
        self._lock = threading.Lock()
        self._making: dict[str, threading.Lock] = {}
        #: Per DSN, the types a database younger than ``FRESH_S`` did not know either.
        self._never: dict[str, set[str]] = {}
        self._class: Any = None

    def connect(self, dsn: str) -> Any:
        """A new autocommit DB-API connection to ``dsn``."""
        import adbc_driver_manager
        import adbc_driver_manager.dbapi as dbapi

        if not hasattr(dbapi, "_SharedDatabase"):  # a driver manager without it: one each
            return _own(dsn)
        if self._class is None:
            self._class = _connection_class()
        while True:
            db = self._database(dsn)
            if not db.lock.acquire(timeout=LOCK_WAIT_S):
                return _own(dsn)  # another connection is slow to open: not behind it
            try:
                if db.released:  # renewed or evicted since: its handle may be closed
                    continue
                raw = adbc_driver_manager.AdbcConnection(db.shared._db)
                try:
                    return self._class(db, raw)
                except BaseException:
                    raw.close()
                    raise
            finally:
                db.lock.release()

    def renew(self, dsn: str, con: Any, unknown: frozenset[str]) -> bool:
        """``con`` (of ``dsn``) met types its database did not know (``unknown``, as the
        driver names them): whether to read again on a new connection (True: the DSN's next
        connections come from a database made now, or made since ``con``'s)."""
        db = getattr(con, "harness_database", None)
        if db is None:
            return False
        with self._lock:
            never = self._never.setdefault(dsn, set())
            if unknown <= never:
                return False
            if time.monotonic() - db.made < FRESH_S:
                if len(never) < 1024:
                    never.update(unknown)
                return False
            if self._kept.get(dsn) is db:
                del self._kept[dsn]
            else:
                db = None  # renewed already: its reference was let go then
        if db is not None:
            self._release(db)
        log.info("a PostgreSQL type the ADBC driver did not know: its types read again")
        return True

    def clear(self) -> None:
        with self._lock:
            dbs = list(self._kept.values())
            self._kept.clear()
        for db in dbs:
            self._release(db)

    def _database(self, dsn: str) -> _Database:
        with self._lock:
            db = self._kept.get(dsn)
            if db is not None and time.monotonic() - db.made < MAX_AGE_S:
                self._kept.move_to_end(dsn)
                return db
            making = self._making.setdefault(dsn, threading.Lock())
        with making:  # one thread reads the catalogue; the others wait for its database
            with self._lock:
                db = self._kept.get(dsn)
                if db is not None and time.monotonic() - db.made < MAX_AGE_S:
                    return db
            made = _Database(_shared(dsn))
            with self._lock:
                old = self._kept.pop(dsn, None)
                self._kept[dsn] = made
                evicted = []
                while len(self._kept) > MAX_DSNS:
                    gone, db = self._kept.popitem(last=False)
                    self._making.pop(gone, None)
                    evicted.append(db)
        for db in [old, *evicted]:
            if db is not None:
                self._release(db)
        return made

    @staticmethod
    def _release(db: _Database) -> None:
        """Let go of this holder's reference: the database closes with its last connection.
        Not while a connection is being opened on it (under its lock): then once that is done,
        on a thread of its own, so that a slow server does not hold the caller."""
        db.released = True  # no connection starts on it after this (``connect`` checks)
        if db.lock.acquire(timeout=LOCK_WAIT_S):
            _let_go(db)
        else:
            threading.Thread(
                target=_let_go_later, args=(db,), name="adbc-release", daemon=True
            ).start()


def _let_go_later(db: _Database) -> None:
    db.lock.acquire()
    _let_go(db)


def _let_go(db: _Database) -> None:
    """``db``'s holder reference closed; called with its lock held, released here."""
    try:
        db.shared.close()
    except Exception:
        log.debug("releasing an ADBC database failed", exc_info=True)
    finally:
        db.lock.release()


def _own(dsn: str) -> Any:
    """A connection with a database of its own (the driver's DB-API ``connect``)."""
    import adbc_driver_postgresql.dbapi as adbc

    return adbc.connect(dsn, autocommit=True)


def _shared(dsn: str) -> Any:
    import adbc_driver_manager.dbapi as dbapi
    import adbc_driver_postgresql

    return dbapi._SharedDatabase(adbc_driver_postgresql.connect(dsn))


def unknown_types(schema: pa.Schema) -> frozenset[str]:
    """The types of ``schema``'s columns (a result's, as the driver typed it), at any depth,
    that the driver's database did not know (``unnamed<oid:...>``)."""
    found: set[str] = set()
    for f in schema:
        _unknown(f.type, found)
    return frozenset(found)


def _unknown(t: pa.DataType, found: set[str]) -> None:
    name = getattr(t, "type_name", None)
    if isinstance(name, str) and name.startswith("unnamed<oid:"):
        found.add(name)
        return
    if isinstance(t, pa.ExtensionType):
        t = t.storage_type
    for i in range(t.num_fields):
        _unknown(t.field(i).type, found)


DATABASES = Databases()
