"""``${NAME}`` references in source configs: resolved only from names the operator allows, and
never shown again.

Source configs are written by table writers, so a reference could otherwise read any variable of
the gateway's environment (its ticket key included) and send it to a host of the writer's choosing
or get it back in an error message. The gateway therefore resolves only names matching the
operator's patterns (``secrets.allow`` in the gateway config, default ``HARNESS_SECRET_*``), and
remembers every value it substituted so that error messages, replies and log lines can be
scrubbed of them (``scrub``, ``ScrubFilter``).

An entry of ``secrets.allow`` is a name pattern (any table's config may use those names) or
``{"names": [patterns], "tables": [table patterns]}``: only configs of those tables may use them,
so one team's table admins cannot point another team's secret at a host they choose.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument

REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_ALLOWED = ("HARNESS_SECRET_*",)
_MIN_SECRET_CHARS = 4  # shorter values would scrub ordinary words out of messages
_REDACTED = "***"

_values: set[str] = set()
_lock = threading.Lock()
#: Passwords written into a DSN literally (``postgresql://u:pw@h``, ``password=pw``): a
#: library's error may quote the DSN it was given (DuckLake's attach does).
URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)([^@/\s]+)(@)")
DSN_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"]+)", re.I)


def remember(value: str) -> None:
    """Treat ``value`` as a secret from now on (scrubbed from errors and logs)."""
    if len(value) >= _MIN_SECRET_CHARS:
        with _lock:
            _values.add(value)


def scrub(text: str) -> str:
    """``text`` with every remembered secret value, and every password written into a DSN,
    replaced by ``***``."""
    with _lock:
        values = sorted(_values, key=len, reverse=True)
    for v in values:
        if v in text:
            text = text.replace(v, _REDACTED)
    return passwords_hidden(text)


def passwords_hidden(text: str) -> str:
    return DSN_PASSWORD.sub(r"\1***", URL_PASSWORD.sub(r"\1***\3", text))


class ScrubFilter(logging.Filter):
    """Removes secret values from log records (message and arguments), whoever logs them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _values or "password" in message.lower() or "://" in message:
            clean = scrub(message)
            if clean != message:
                record.msg, record.args = clean, None
        return True


@dataclass(frozen=True)
class SecretRule:
    """Names (patterns) a source config may reference, and the tables (patterns) whose configs
    may; ``tables`` None means every table."""

    names: tuple[str, ...]
    tables: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, entry: Any) -> SecretRule:
        if isinstance(entry, str):
            return cls((entry,))
        if isinstance(entry, Mapping) and set(entry) <= {"names", "tables"} and "names" in entry:
            names, tables = entry["names"], entry.get("tables")
            if _strings(names) and (tables is None or _strings(tables)):
                return cls(tuple(names), None if tables is None else tuple(tables))
        raise ValueError(
            "secrets.allow entries are name patterns or {'names': [...], 'tables': [...]}"
        )

    def permits(self, name: str, table: str | None) -> bool:
        if not any(fnmatch.fnmatchcase(name, p) for p in self.names):
            return False
        if self.tables is None:
            return True
        return table is not None and any(fnmatch.fnmatchcase(table, p) for p in self.tables)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


class SecretResolver:
    """Resolves ``${NAME}`` references that a rule of ``allowed`` permits for the table."""

    def __init__(
        self, allowed: Sequence[Any] = DEFAULT_ALLOWED, env: Mapping[str, str] | None = None
    ) -> None:
        self.rules = tuple(SecretRule.parse(a) for a in allowed)
        self._env = env

    def permits(self, name: str, table: str | None = None) -> bool:
        return any(r.permits(name, table) for r in self.rules)

    def _refuse(self, name: str, where: str, table: str | None) -> InvalidArgument:
        scope = f" for table {table!r}" if table is not None else ""
        return InvalidArgument(
            f"{where} references ${{{name}}}, which the gateway does not allow{scope} "
            "(see secrets.allow in the gateway config)"
        )

    def _sub(self, text: str, where: str, table: str | None) -> str:
        env = os.environ if self._env is None else self._env

        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if not self.permits(name, table):
                raise self._refuse(name, where, table)
            if name not in env:
                raise InvalidArgument(f"{where} references ${{{name}}}, which is not set")
            remember(env[name])
            return env[name]

        return REF.sub(one, text)

    def resolve(self, config: Any, *, where: str, table: str | None = None) -> Any:
        """``config`` with every allowed reference replaced (strings, nested lists and objects)."""
        if isinstance(config, str):
            return self._sub(config, where, table)
        if isinstance(config, Mapping):
            return {k: self.resolve(v, where=where, table=table) for k, v in config.items()}
        if isinstance(config, list):
            return [self.resolve(v, where=where, table=table) for v in config]
        return config

    def check(self, config: Any, *, where: str, table: str | None = None) -> None:
        """Refuse references to names the gateway does not allow, without resolving them."""
        if isinstance(config, str):
            for name in REF.findall(config):
                if not self.permits(name, table):
                    raise self._refuse(name, where, table)
        elif isinstance(config, Mapping):
            for v in config.values():
                self.check(v, where=where, table=table)
        elif isinstance(config, list):
            for v in config:
                self.check(v, where=where, table=table)
