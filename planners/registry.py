"""Source kinds by name, found through entry points: registered once, imported on first use.

A kind is an entry point of the ``dataharness.sources`` group, ``name = "package.module:Class
[extra]"``: the project's own in its ``pyproject.toml`` like any third-party package's, the
optional extra naming what installs the kind's client library (the hint when its import
fails). Nothing is imported until a kind is used, so unused backends never are. When two
distributions register one name, the project's own wins (a warning names the other).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from flight_gateway.protocol.errors import InvalidArgument, Unavailable
from planners.kind import HoldsResources, SourceKind

log = logging.getLogger(__name__)
GROUP = "dataharness.sources"
PROJECT = "dataharness-flight-gateway"

_instances: dict[str, SourceKind] = {}
_lock = threading.Lock()


def _dist(ep: importlib.metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else ""


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed kinds, scanned afresh (a package installed while the gateway runs is found)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        kept = found.get(ep.name)
        if kept is not None and kept.value != ep.value:
            ours, other = (ep, kept) if _dist(ep) == PROJECT else (kept, ep)
            log.warning("ignoring entry point %s = %s of %s: the name is taken",
                        other.name, other.value, _dist(other) or "?")  # fmt: skip
            found[ep.name] = ours
            continue
        found.setdefault(ep.name, ep)
    return found


def available() -> list[str]:
    """Names of every kind that can be loaded (without importing any of them)."""
    return sorted(_entry_points())


def _load(name: str) -> SourceKind:
    ep = _entry_points().get(name)
    if ep is None:
        raise InvalidArgument(f"unknown source kind {name!r} (known: {available()})")
    if ep.extras and _dist(ep) == PROJECT:
        hint = f"pip install '{PROJECT}[{','.join(ep.extras)}]'"
    else:
        hint = f"reinstall {_dist(ep) or 'the package that provides it'}"
    target = ep.value.split("[")[0].strip()
    module_name, _, cls_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except ImportError as e:
        raise Unavailable(f"source kind {name!r} cannot be imported: {hint} ({e})") from e
    except AttributeError as e:
        raise Unavailable(f"source kind {name!r}: {target} does not exist ({e})") from e
    if not (isinstance(cls, type) and issubclass(cls, SourceKind)):
        raise Unavailable(f"source kind {name!r}: {target} is not a SourceKind subclass")
    kind = cls()
    kind.name = name
    return kind


def get_kind(name: str) -> SourceKind:
    """The kind called ``name`` (one shared instance), importing it on first use; once its
    ``warm`` (``warm``) is done if it is under way."""
    pending = _warming.get(name)
    if pending is not None and not pending.is_set():
        pending.wait(WARM_WAIT_S)
    return _instance(name)


def _instance(name: str) -> SourceKind:
    with _lock:
        kind = _instances.get(name)
        if kind is None:
            kind = _instances[name] = _load(name)
        return kind


#: Kinds whose ``warm`` is under way or done (set when done).
_warming: dict[str, threading.Event] = {}
#: How long a use of a kind waits for its warm-up, at most.
WARM_WAIT_S = 30.0


def warm(names: Iterable[str], *, wait: bool = False) -> None:
    """Each kind's ``warm``, one after another in a thread of its own, off the requests'
    path: what its first read in this process would pay once is made ahead (``wait``: in
    this thread, returning when done). A use of a kind
    meanwhile (``get_kind``) waits for its warm-up rather than importing the same library
    beside it: two threads importing one package's modules can meet in its circular imports
    (``_DeadlockError``, a partly initialised module). The kinds are loaded first, and those
    with nothing to warm released at once. An unknown kind or a failure is only logged."""
    pending: list[tuple[str, threading.Event]] = []
    with _lock:
        for name in sorted(set(names)):
            if name in _warming and not _warming[name].is_set():
                continue  # being warmed already
            _warming[name] = threading.Event()
            pending.append((name, _warming[name]))
    if not pending:
        return

    def run() -> None:
        loaded = []
        for name, done in pending:
            try:
                kind = _instance(name)
            except Exception as e:  # a read reports it
                log.warning("warming source kind %r failed: %s", name, e)
                done.set()
                continue
            if type(kind).warm is SourceKind.warm and not kind.warm_imports:
                done.set()  # nothing to warm
            else:
                loaded.append((name, kind, done))
        for name, kind, done in loaded:
            try:
                kind.warm()
            except Exception as e:  # a read makes it again, and reports what fails then
                log.warning("warming source kind %r failed: %s", name, e)
            finally:
                done.set()

    if wait:
        run()
    else:
        threading.Thread(target=run, daemon=True, name="warm-kinds").start()


_configured: set[str] = set()


def configure_resources(settings: Mapping[str, Mapping[str, Any]]) -> None:
    """Each kind's process-wide resources from the gateway config (``limits.kinds``): kinds
    named there are loaded and configured, kinds configured before and not named now go back to
    their defaults. A setting for a kind without resources is a ValueError."""
    for name in sorted(set(settings) | _configured):
        kind = get_kind(name)
        if not isinstance(kind, HoldsResources):
            raise ValueError(f"limits.kinds.{name}: the {name!r} kind has no resources to bound")
        kind.configure_resources(settings.get(name) or {})
        _configured.add(name)


def resources() -> dict[str, Mapping[str, float]]:
    """What each loaded kind that holds resources holds now (nothing is imported for this)."""
    with _lock:
        loaded = dict(_instances)
    return {n: k.resources() for n, k in sorted(loaded.items()) if isinstance(k, HoldsResources)}
