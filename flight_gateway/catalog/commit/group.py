"""Group commit: concurrent commits to one table from threads of this process share one catalog
transaction.

A thread that commits while no group is being applied to its table becomes the leader: it
takes every commit queued for the table so far (its own first) and applies them together;
meanwhile newcomers queue. When the leader is done it hands each commit its own outcome and
makes the first queued thread the next leader, so every thread applies at most one group and
commits are applied in arrival order. There is no timer and no background thread: a lone
writer pays nothing, and groups grow exactly as fast as commits arrive while the catalog is
busy. Other processes (gateway replicas) group their own commits; the table's row lock in the
catalog orders their groups.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Req = TypeVar("Req")
Out = TypeVar("Out")


class _Waiter(Generic[Req, Out]):
    __slots__ = ("event", "lead", "outcome", "request")

    def __init__(self, request: Req) -> None:
        self.request = request
        self.outcome: Out | BaseException | None = None
        self.lead = False
        self.event = threading.Event()


class _Queue(Generic[Req, Out]):
    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.waiting: list[_Waiter[Req, Out]] = []
        #: A leader is applying a group. Invariant: not busy => nothing waiting.
        self.busy = False


@dataclass(frozen=True)
class GroupStats:
    groups: int
    commits: int
    largest: int


class GroupCommitter(Generic[Req, Out]):
    """Runs ``apply(key, requests) -> outcomes`` for groups of concurrent requests per key."""

    def __init__(
        self, apply: Callable[[str, Sequence[Req]], Sequence[Out | BaseException]], max_group: int
    ) -> None:
        self._apply = apply
        self._max_group = max_group
        self._mutex = threading.Lock()
        self._queues: dict[str, _Queue[Req, Out]] = {}
        self._groups = self._commits = self._largest = 0

    def stats(self) -> GroupStats:
        with self._mutex:
            return GroupStats(self._groups, self._commits, self._largest)

    def queued(self, key: str) -> int:
        """Requests for ``key`` waiting for a leader (the group being applied not counted)."""
        with self._mutex:
            q = self._queues.get(key)
            return 0 if q is None else len(q.waiting)

    def submit(self, key: str, request: Req) -> Out | BaseException:
        """Queue ``request``; returns its outcome (an exception is returned, not raised)."""
        me: _Waiter[Req, Out] = _Waiter(request)
        with self._mutex:
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _Queue()
            q.waiting.append(me)
            leader = not q.busy
            q.busy = True
        if not leader:
            me.event.wait()
            if not me.lead:
                return me.outcome  # type: ignore[return-value]
        self._lead(key, q)
        return me.outcome  # type: ignore[return-value]

    def _lead(self, key: str, q: _Queue[Req, Out]) -> None:
        with self._mutex:
            group = q.waiting[: self._max_group]  # the leader is first
            del q.waiting[: self._max_group]
            self._groups += 1
            self._commits += len(group)
            self._largest = max(self._largest, len(group))
        outcomes: list[Out | BaseException]
        try:
            outcomes = list(self._apply(key, [w.request for w in group]))
            if len(outcomes) != len(group):
                raise RuntimeError(f"{len(outcomes)} outcomes for a group of {len(group)}")
        except BaseException as e:  # the whole group failed: every member learns why
            outcomes = [e] * len(group)
        # However the group ended, the next leader must be chosen or queued commits hang.
        with self._mutex:
            if q.waiting:
                nxt = q.waiting[0]
                nxt.lead = True
                nxt.event.set()
            else:
                q.busy = False
                del self._queues[key]
        for w, o in zip(group, outcomes, strict=True):
            w.outcome = o
            w.event.set()
