"""The core's services, built once per process from the gateway config: what every face serves.

``Core.build`` makes the context (catalog, secrets, reach, limits), the read service with its
ticket and direct-task signers, and the concurrency bounds calls hold while they run (streams,
uploads, SQL statements). It knows no face; ``flight_gateway.app`` gives it to each.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flight_gateway.catalog import Catalog
from flight_gateway.core.config import GatewayConfig
from flight_gateway.core.context import Gateway
from flight_gateway.core.layout import Layouts, SliceStore
from flight_gateway.core.read import ReadService
from flight_gateway.core.secrets import SecretResolver
from flight_gateway.core.slots import Slots
from flight_gateway.protocol.direct import DirectSigner
from flight_gateway.protocol.tickets import TicketSigner
from planners.registry import configure_resources


@dataclass
class Core:
    gw: Gateway
    reads: ReadService
    #: Streams (DoGet, SQL results) per principal.
    streams: Slots
    #: DoPut uploads per principal and gateway-wide.
    uploads: Slots
    #: SQL statements gateway-wide (each also holds one of its caller's streams).
    statements: Slots
    config: GatewayConfig | None = None
    _layouts: Layouts | None = field(default=None, repr=False)
    _layouts_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The slice store's directory when this process made it (no ``iceberg_rest_dir``):
    #: removed on close, as nothing else knows it (a gateway per test left one in /tmp each).
    _own_root: Path | None = field(default=None, repr=False)

    @property
    def layouts(self) -> Layouts:
        """Pinned versions as files (DESIGN §16-§17): the process's one slice store, shared by
        the Iceberg REST face and Flight SQL (hot slices made once for both), made on first
        use under ``iceberg_rest_dir`` (default: a temporary directory)."""
        with self._layouts_lock:
            if self._layouts is None:
                config = self.config or GatewayConfig()
                settings = config.rest_settings
                if config.iceberg_rest_dir:
                    root = Path(config.iceberg_rest_dir)
                else:
                    root = self._own_root = Path(tempfile.mkdtemp(prefix="harness-slices-"))
                store = SliceStore(root, budget_bytes=settings.disk_budget_mb << 20,
                                   pin_s=settings.pin_s,
                                   group_readable=settings.group_readable)  # fmt: skip
                self._layouts = Layouts(self.gw, store)
            return self._layouts

    def close(self) -> None:
        with self._layouts_lock:
            if self._layouts is not None:
                self._layouts.store.close()
            if self._own_root is not None:
                shutil.rmtree(self._own_root, ignore_errors=True)
                self._own_root = None

    @property
    def catalog(self) -> Catalog:
        return self.gw.catalog

    @classmethod
    def build(cls, catalog: Catalog, config: GatewayConfig) -> Core:
        key = config.ticket_key_bytes()
        gw = Gateway(
            catalog,
            SecretResolver(config.secret_names),
            config.reach_policy,
            config.limit_values,
            tag_secret=hmac.new(key, b"write-tags", hashlib.sha256).digest(),
        )
        limits = gw.limits
        configure_resources(limits.kinds)
        reads = ReadService(
            gw,
            TicketSigner(key, config.ticket_ttl_s),
            direct=DirectSigner(key, config.ticket_ttl_s),
        )
        streams = Slots(limits.max_streams_per_principal, "max_streams_per_principal",
                        what="streams")  # fmt: skip
        uploads = Slots(limits.max_uploads_per_principal, "max_uploads_per_principal",
                        limits.max_concurrent_uploads, "max_concurrent_uploads",
                        what="uploads")  # fmt: skip
        statements = Slots(limits.max_concurrent_statements, "max_concurrent_statements",
                           limits.max_concurrent_statements, "max_concurrent_statements",
                           what="SQL statements")  # fmt: skip
        return cls(gw, reads, streams, uploads, statements, config)

    @contextlib.contextmanager
    def statement_slots(self, name: str) -> Iterator[None]:
        """A stream slot of ``name`` and a gateway-wide statement slot while a statement is
        typed or runs."""
        with self.streams.hold(name), self.statements.hold(name):
            yield

    def take_statement_slots(self, name: str) -> None:
        """The slots of ``statement_slots`` for a statement whose result outlives the call
        (released by ``release_statement_slots`` when its stream ends)."""
        self.streams.acquire(name)
        try:
            self.statements.acquire(name)
        except BaseException:
            self.streams.release(name)
            raise

    def release_statement_slots(self, name: str) -> None:
        self.statements.release(name)
        self.streams.release(name)
