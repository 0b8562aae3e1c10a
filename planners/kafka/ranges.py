"""Offset ranges of a Kafka source state: ``{"low", "high", "skip"?}``.

``skip`` lists sorted, disjoint ``[a, b)`` ranges inside ``[low, high)`` that no commit owns:
messages of a DoPut that failed or was abandoned after producing, or a fenced writer's late
deliveries. An append that moves ``high`` past such messages records them here (it only ever
adds ranges at or above the ``high`` it started from, so a pinned version or a stream never
loses a row it could see), and every reader reads ``[low, high)`` minus them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flight_gateway.errors import InvalidArgument

Range = tuple[int, int]


def _offset(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def bounds(name: str, state: Mapping[str, Any]) -> Range:
    low, high = state.get("low", 0), state.get("high", 0)
    if not (_offset(low) and _offset(high)) or low < 0 or high < low:
        raise InvalidArgument(f"source {name!r}: state needs 0 <= low <= high, got {dict(state)}")
    return low, high


def skips(name: str, state: Mapping[str, Any]) -> list[Range]:
    """The state's skip ranges, checked: sorted, disjoint, non-empty, at most ``high``."""
    _, high = bounds(name, state)
    raw = state.get("skip") or []
    if not isinstance(raw, list):
        raise InvalidArgument(f"source {name!r}: 'skip' must be a list of [a, b) offset ranges")
    out: list[Range] = []
    for r in raw:
        if (
            not isinstance(r, (list, tuple))
            or len(r) != 2
            or not all(_offset(x) for x in r)
            or not 0 <= r[0] < r[1] <= high
            or (out and r[0] < out[-1][1])
        ):
            raise InvalidArgument(
                f"source {name!r}: 'skip' needs sorted, disjoint [a, b) ranges up to high, "
                f"got {r!r}"
            )
        out.append((r[0], r[1]))
    return out


def visible(low: int, high: int, skip: Iterable[Range]) -> list[Range]:
    """``[low, high)`` minus the ``skip`` ranges, in order."""
    out, at = [], low
    for a, b in skip:
        if b <= at or a >= high:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < high:
        out.append((at, high))
    return out


def runs(offsets: Iterable[int]) -> list[Range]:
    """Offsets -> sorted ``[a, b)`` runs of consecutive ones."""
    out: list[list[int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1])
    return [(a, b) for a, b in out]


def merge(ranges: Iterable[Range]) -> list[Range]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def with_range(
    state: Mapping[str, Any], low: int, high: int, add_skip: Sequence[Range] = ()
) -> dict[str, Any]:
    """``state`` moved to ``[low, high)``: skip ranges below ``low`` dropped, ``add_skip``
    added, ``skip`` absent when empty."""
    kept = [(a, b) for a, b in [*(tuple(r) for r in state.get("skip") or ()), *add_skip]]
    clipped = [(max(a, low), min(b, high)) for a, b in merge(kept) if b > low and a < high]
    out = {**state, "low": low, "high": high}
    out.pop("skip", None)
    if clipped:
        out["skip"] = [[a, b] for a, b in clipped]
    return out
