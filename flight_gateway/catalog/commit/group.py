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

A leader may first wait for something its group needs (``late_apply``: DoPut waits for its
sources' write lease) and take its group only then, so requests that arrive meanwhile join it.
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


#: ``late_apply(key, leader's request, take) -> outcomes``: ``take()`` claims the group (the
#: leader's request first) when the leader is ready for it; one outcome per request taken.
LateApply = Callable[[str, Req, Callable[[], list[Req]]], Sequence[Out | BaseException]]


class GroupCommitter(Generic[Req, Out]):
    """Runs ``apply(key, requests) -> outcomes`` for groups of concurrent requests per key (or
    ``late_apply``, which takes its group itself)."""

    def __init__(
        self,
        apply: Callable[[str, Sequence[Req]], Sequence[Out | BaseException]] | None,
        max_group: int,
        *,
        late_apply: LateApply[Req, Out] | None = None,
    ) -> None:
        if (apply is None) == (late_apply is None):
            raise ValueError("give apply or late_apply")
        self._late: LateApply[Req, Out] = late_apply or (
            lambda key, _first, take: apply(key, take())  # type: ignore[misc]
        )
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
        group: list[_Waiter[Req, Out]] = []

        def take() -> list[Req]:
            if not group:
                with self._mutex:
                    group.extend(q.waiting[: self._max_group])  # the leader is first
                    del q.waiting[: self._max_group]
                    self._groups += 1
                    self._commits += len(group)
                    self._largest = max(self._largest, len(group))
            return [w.request for w in group]

        with self._mutex:
            first = q.waiting[0].request  # the leader's: nobody else takes from the queue
        outcomes: list[Out | BaseException]
        try:
            outcomes = list(self._late(key, first, take))
            if len(outcomes) != len(group):
                raise RuntimeError(f"{len(outcomes)} outcomes for a group of {len(group)}")
        except BaseException as e:  # the whole group failed (or never had what it waited
            take()  # for, which everyone queued waited for too): every member learns why
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
