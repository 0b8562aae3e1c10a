"""Locations as the libraries will use them: the input of every ``reach`` check (DESIGN §14).

A source's config, its state and the metadata it reads name files, hosts and services. The
gateway's allow-lists (``reach``) are only as good as the form they compare, so everything here
turns a location into the form the library will act on — decoded, normalised, with the parts
that redirect a connection (query parameters, ``hostaddr``, userinfo, numeric hosts) brought
out — and refuses (INVALID_ARGUMENT) what it cannot interpret.

- **Storage** (``storage``): a local path, a ``file:`` URI or an object-store URI. pyarrow
  percent-decodes ``file:`` URIs, pyiceberg's file IO does not, so both readings are returned
  and each must be allowed. Local paths are resolved (``..``, symlinks) to the real file.
  Object-store URIs keep ``scheme://bucket/path`` (userinfo, which carries credentials, is
  dropped); ``..`` segments, fragments and query parameters other than the S3 ones pyarrow
  honours are refused; ``endpoint_override`` becomes a host to check.
- **Hosts** (``host``): lower-cased, IPv4 shorthand (``127.1``, ``0x7f.0.0.1``, ``2130706433``)
  and IPv6 written canonically, default ports made explicit.
- **Service URIs** (``service_uri``): scheme, canonical host and port, decoded path; userinfo and
  query dropped from the compared form (they cannot change where a request goes).
- **Option maps** (``network_options``): free-form library settings (pyiceberg catalog
  properties, librdkafka settings, object-store options). Keys that look like network settings
  (``*url*``, ``*uri*``, ``*endpoint*``, ``*host*``, ``*proxy*``) must be known to the kind, which
  says how to check their values; an unknown one is refused.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import posixpath
import re
import socket
import stat
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, unquote, urlsplit

from flight_gateway.protocol.errors import InvalidArgument


@dataclass(frozen=True)
class Reach:
    """Something a source's config makes the gateway touch, checked against the operator's
    allow-lists (``reach`` in the gateway config) before any connection is made or file opened.

    ``what`` is ``"path"`` (local path or storage URI: file roots, warehouses, table locations,
    files named in metadata), ``"host"`` (``host:port`` of a network service: brokers,
    databases) or ``"uri"`` (a service URI: catalog, token and schema-registry endpoints, Flight
    locations). ``value`` is in the form the library will use (``planners.locations`` builds
    it). ``key`` names the config key (or, with a space in it, the kind of file) for error
    messages; the value itself is never shown (it may come from a secret).
    """

    what: str
    key: str
    value: str


@runtime_checkable
class Guard(Protocol):
    """Checks locations a kind finds while planning or reading (files named in table metadata)
    against the operator's allow-lists; raises PERMISSION_DENIED. ``key`` identifies the guard
    in ``planners.locations.GUARDS`` for libraries that can only carry a string."""

    @property
    def key(self) -> str: ...

    def check(self, source: str | None, reaches: Sequence[Reach]) -> None: ...


class _AllowAll:
    """The guard outside a gateway (pipelines, tests of a kind alone): no allow-list."""

    key = ""

    def check(self, source: str | None, reaches: Sequence[Reach]) -> None:
        return None


ALLOW_ALL: Guard = _AllowAll()


DEFAULT_PORTS = {"http": 80, "https": 443, "grpc": 80, "grpc+tcp": 80, "grpc+tls": 443}
#: Object stores whose netloc is a bucket (userinfo there is credentials, never a location).
BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs"})
#: Query parameters pyarrow's ``S3FileSystem.from_uri`` honours that are safe once checked.
_S3_QUERY = frozenset({"region", "scheme", "endpoint_override"})
# A word of the key (after a separator or at its start): "oauth2-server-uri", "hostaddr",
# "AWS_ENDPOINT_URL", "socks5.proxy" — not "security.protocol".
_NETWORK_KEY = re.compile(r"(^|[^a-z0-9])(url|uri|endpoint|host|proxy)", re.IGNORECASE)


def _refuse(key: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"config {key!r}: {why}")


# ---------------------------------------------------------------------------- hosts


def canonical_host(host: str) -> str:
    """``host`` as a resolver reads it: lower case, no trailing dot, numeric forms canonical."""
    h = host.strip().lower().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fx.]+", h) and not re.fullmatch(r"[a-f.]+", h):
        try:  # inet_aton reads 127.1, 0x7f.1 and 2130706433 the way getaddrinfo does
            return socket.inet_ntoa(socket.inet_aton(h))
        except OSError:
            pass
    return h


def host_port(host: str, port: int | str | None) -> str:
    """``host:port`` (IPv6 in brackets) or the bare host when no port is known."""
    h = canonical_host(host)
    shown = f"[{h}]" if ":" in h else h
    if port in (None, ""):
        return shown
    if not str(port).strip().isdigit():
        raise InvalidArgument(f"port {port!r} is not a number")
    return f"{shown}:{int(port)}"


def split_host_port(value: str, key: str, default_port: int | None = None) -> str:
    """A ``host[:port]`` entry (a broker, an endpoint) in canonical form."""
    text = value.strip()
    parts = urlsplit(text) if "//" in text else urlsplit(f"//{text}")
    try:
        port = parts.port
    except ValueError as e:
        raise _refuse(key, "has a port that is not a number") from e
    if not parts.hostname:
        raise _refuse(key, "names no host")
    return host_port(parts.hostname, port if port is not None else default_port)


def host(key: str, value: str, default_port: int | None = None) -> Reach:
    return Reach("host", key, split_host_port(value, key, default_port))


# ---------------------------------------------------------------------------- service URIs


def service_uri(key: str, value: str) -> Reach:
    """A service endpoint (REST catalog, token endpoint, schema registry, Flight location)."""
    parts = urlsplit(value.strip())
    scheme = parts.scheme.lower()
    if not scheme or not parts.hostname:
        raise _refuse(key, "is not a URI with a host")
    try:
        port = parts.port
    except ValueError as e:
        raise _refuse(key, "has a port that is not a number") from e
    path = _clean_path(unquote(parts.path), key)
    where = host_port(parts.hostname, port if port is not None else DEFAULT_PORTS.get(scheme))
    return Reach("uri", key, f"{scheme}://{where}{path}")


def _clean_path(path: str, key: str) -> str:
    if ".." in path.split("/"):
        raise _refuse(key, "has a '..' segment")
    if not path:
        return ""
    norm = posixpath.normpath(path)
    return "" if norm in (".", "/") else norm


# ---------------------------------------------------------------------------- storage


def is_uri(value: str) -> bool:
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", value)) and not os.path.isabs(value)


def local_real(path: str) -> str:
    """The real file a local path names, resolved as the kernel does: each symlink before the
    ``..`` that follows it (``abspath`` first would cancel ``link/..`` lexically).

    The C library's ``realpath`` where there is one, ``os.path.realpath`` otherwise and for what
    the C one refuses (a missing file, a symlink loop: Python's resolves as far as it can).
    Python's makes one ``lstat`` per path component and hands the interpreter lock over at each;
    under load the gateway's threads wait for the lock at every hand-over, and a read checks
    every file it opens. Profiled under 16 writers and 64 readers, reads spent 18 % of their
    time inside ``os.path.realpath``: the C call releases the lock once per path."""
    if _c_realpath is None or "\x00" in path:  # a NUL would cut the C string short
        return os.path.realpath(path)
    buf = ctypes.create_string_buffer(_PATH_MAX)
    if _c_realpath(os.fsencode(path), buf) is None:
        return os.path.realpath(path)
    return os.fsdecode(buf.value)


_PATH_MAX = 4096  # Linux's PATH_MAX: the size realpath(3) writes into at most


def _find_c_realpath() -> Any:
    if not sys.platform.startswith("linux"):
        return None  # PATH_MAX differs elsewhere; Python's own is right everywhere
    try:
        fn = ctypes.CDLL(None).realpath
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    fn.restype = ctypes.c_char_p
    return fn


_c_realpath = _find_c_realpath()


def storage(key: str, value: str) -> list[Reach]:
    """Every reading of a storage location (see the module docstring); each must be allowed."""
    local = _local_paths(key, value)
    if local is not None:
        return [Reach("path", key, r) for r in sorted({local_real(p) for p in local})]
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if parts.fragment:
        raise _refuse(key, "a fragment in a storage URI is not allowed")
    out = _object_store(key, scheme, parts.netloc, parts.path)
    return out + _store_query(key, scheme, parts.query)


def _object_store(key: str, scheme: str, netloc: str, path: str) -> list[Reach]:
    if scheme in BUCKET_SCHEMES:
        netloc = netloc.rpartition("@")[2]  # credentials in userinfo are not part of where
    netloc = netloc.lower()
    if not netloc:
        raise _refuse(key, "names no bucket or host")
    readings = {_clean_path(p, key) for p in (path, unquote(path))}
    return [Reach("path", key, f"{scheme}://{netloc}{p}") for p in sorted(readings)]


def _store_query(key: str, scheme: str, query: str) -> list[Reach]:
    if not query:
        return []
    params = parse_qsl(query, keep_blank_values=True)
    unknown = sorted({k for k, _ in params if scheme not in ("s3", "s3a") or k not in _S3_QUERY})
    if unknown:
        raise _refuse(key, f"query parameters {unknown} are not allowed in a storage URI")
    out = []
    values = dict(params)
    if values.get("scheme", "https") not in ("http", "https"):
        raise _refuse(key, "scheme must be http or https")
    if "endpoint_override" in values:
        out.append(
            host(
                f"{key}.endpoint_override",
                values["endpoint_override"],
                DEFAULT_PORTS[values.get("scheme", "https")],
            )
        )
    return out


def _local_paths(key: str, value: str) -> list[str] | None:
    """The local paths (not resolved) ``storage`` reads ``value`` as, or None when it is not
    local; refuses what is no location at all and a ``file:`` URI with more than a path."""
    if not isinstance(value, str) or not value:
        raise _refuse(key, "must be a non-empty path or URI")
    if "\x00" in value:
        raise _refuse(key, "contains a NUL character")
    if not is_uri(value):
        return [value]
    parts = urlsplit(value)
    if parts.scheme.lower() != "file":
        return None
    if parts.query or parts.fragment:
        raise _refuse(key, "a query or fragment in a file: URI is not allowed")
    if parts.netloc not in ("", "localhost"):
        raise _refuse(key, "a file: URI may not name a host")
    return list(dict.fromkeys((parts.path, unquote(parts.path))))


def files(key: str, paths: Iterable[str]) -> list[Reach]:
    """The readings of every file a read opens (data, delete, manifest, log files): each as
    ``storage`` reads it, the local ones resolved per directory (``local_reals``). An Iceberg
    read checks every data file of its snapshot; resolving each whole path (twice for a
    ``file:`` URI) was 61 % of Iceberg reads' samples under 64 readers and 16 writers."""
    out: list[Reach] = []
    local: list[str] = []
    for p in paths:
        raw = _local_paths(key, p)
        if raw is None:
            out += storage(key, p)
        else:
            local += raw
    return out + [Reach("path", key, r) for r in dict.fromkeys(local_reals(local))]


#: From this many files in one directory on, its listing is read once instead of one ``lstat``
#: per file.
_LIST_FROM = 32


def local_reals(paths: Sequence[str]) -> list[str]:
    """Each local path's real file, resolved per directory: each directory once (its links and
    ``..``), then each name in it is a plain file (its real path is the directory's plus the
    name) unless it is a link itself, which is resolved alone. A read of a version listing
    hundreds of files made hundreds of whole-path resolutions (36-40 % of GetFlightInfo and
    DoGet under load); ``local_real`` of each gives the same answers."""
    by_dir: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        by_dir.setdefault(os.path.dirname(p), []).append(i)
    reals = list(paths)
    for directory, members in by_dir.items():
        real_dir = local_real(directory or ".")
        plain = _plain_names(directory, [os.path.basename(paths[i]) for i in members])
        for i in members:
            name = os.path.basename(paths[i])
            reals[i] = (os.path.join(real_dir, name) if name in plain
                        else local_real(paths[i]))  # fmt: skip
    return reals


def _plain_names(directory: str, names: list[str]) -> set[str]:
    """The names of ``names`` that are regular files (not links) in ``directory``."""
    wanted = {n for n in names if n not in ("", ".", "..")}
    if len(wanted) >= _LIST_FROM:
        try:
            with os.scandir(directory or ".") as entries:
                return {
                    e.name for e in entries if e.name in wanted and e.is_file(follow_symlinks=False)
                }
        except OSError:
            return set()
    plain = set()
    for n in wanted:
        try:
            if stat.S_ISREG(os.lstat(os.path.join(directory, n)).st_mode):
                plain.add(n)
        except OSError:
            continue  # missing: resolved alone, as before
    return plain


# ---------------------------------------------------------------------------- option maps

#: Options of the Rust ``object_store`` crate (delta-rs, hudi-rs) naming a network endpoint,
#: checked as service URIs (``network_options``).
OBJECT_STORE_ENDPOINTS = {
    k: "uri"
    for k in (
        "aws_endpoint_url",
        "aws_endpoint",
        "endpoint",
        "endpoint_url",
        "azure_storage_endpoint",
    )
}


def looks_like_network(key: str) -> bool:
    return bool(_NETWORK_KEY.search(key))


def network_options(
    prefix: str,
    options: Mapping[str, object],
    known: Mapping[str, str],
) -> list[Reach]:
    """Reaches of a free-form settings map. ``known`` maps a (lower-case) key to how its value
    is checked: ``"uri"`` (a service URI), ``"uris"`` (comma-separated service URIs),
    ``"host"`` (``host:port``), ``"storage"`` (a path or storage URI) or ``"safe"`` (not a
    location, though its name looks like one). A key that looks like a network setting and is
    not known is refused: deny by default."""
    out: list[Reach] = []
    for raw_key, raw in options.items():
        k = str(raw_key)
        how = known.get(k.lower())
        key = f"{prefix}.{k}"
        if how is None:
            if looks_like_network(k):
                raise _refuse(key, "is a network setting this gateway cannot check; not allowed")
            continue
        value = str(raw)
        if how == "uri":
            out.append(service_uri(key, value))
        elif how == "uris":
            out += [service_uri(key, v) for v in value.split(",") if v.strip()]
        elif how == "host":
            out.append(host(key, value))
        elif how == "storage":
            out += storage(key, value)
    return out


_PLACE_KEY = re.compile(r"(^|[^a-z0-9])(path|root|location|warehouse|dir|file)", re.IGNORECASE)


def default_reaches(config: Mapping[str, object]) -> list[Reach]:
    """What a kind that does not list its reaches (``SourceKind.reaches``) is assumed to touch:
    every top-level string under a key that names a place (``path``, ``root``, ``*_location``,
    ``warehouse``, ``*_dir``, ``file``) as storage; keys that look like network settings as
    service URIs (``*url*``, ``*uri*``, ``*endpoint*``) or hosts (``*host*``); anything else
    network-like is refused."""
    out: list[Reach] = []
    for k, v in config.items():
        if not isinstance(v, str) or not v:
            continue
        if looks_like_network(k):
            low = k.lower()
            if "host" in low:
                out.append(host(k, v))
            elif "proxy" not in low and "://" in v:
                out.append(service_uri(k, v))
            else:
                raise _refuse(k, "is a network setting this kind does not describe; not allowed")
        elif _PLACE_KEY.search(k):
            out += storage(k, v)
    return out


# ---------------------------------------------------------------------------- guards by key

#: Guards a library can only name by a string (pyiceberg builds its FileIO from properties).
#: A key is one gateway policy and kind: few per process, re-registered on every request.
_GUARDS: dict[str, Guard] = {}
_GUARDS_LOCK = threading.Lock()


def register_guard(guard: Guard) -> str:
    """Every plan, read and append registers its guard: a key seen before is stored again
    without the lock (a dict's store and lookup are atomic under the interpreter lock; the
    lock only bounds the size). Under 64 readers and 16 writers the lock was the gateway's
    most waited-on point (a fifth of all its threads' samples, a third of a DoPut group
    leader's time under its lease): a holder preempted for the interpreter lock inside it
    kept every other request out."""
    key = guard.key
    if key in _GUARDS:
        _GUARDS[key] = guard
        return key
    with _GUARDS_LOCK:
        if len(_GUARDS) > 4096:
            _GUARDS.clear()
        _GUARDS[key] = guard
    return key


def guard_for(key: str) -> Guard:
    guard = _GUARDS.get(key)  # atomic (``register_guard``)
    if guard is None:  # never allow by accident: the gateway that made the key is gone
        raise InvalidArgument("file access guard is gone; retry the read")
    return guard
