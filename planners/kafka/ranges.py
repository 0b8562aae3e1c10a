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

from flight_gateway.protocol.errors import InvalidArgument

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


#: Offsets per aligned chunk of a materialized range (``pieces``).
CHUNK = 1 << 18


def pieces(
    name: str, state: Mapping[str, Any], stored: Iterable[Mapping[str, Any]], chunk: int = CHUNK
) -> list[dict[str, Any]]:
    """``state``'s range cut into pieces to materialize (``planners.layout.Slices``): never
    across a multiple of ``chunk``; a piece already stored (same range, same skips inside) is
    reused, the longest first, so a range that grew by some messages needs one new piece with
    just those. A chunk the range covers whole is one piece (made once, then preferred over the
    smaller pieces earlier versions left in it)."""
    low, high = bounds(name, state)
    skip = skips(name, state)

    def piece(a: int, b: int) -> dict[str, Any]:
        inside = [[max(x, a), min(y, b)] for x, y in skip if x < b and y > a]
        return {"low": a, "high": b, **({"skip": inside} if inside else {})}

    have: dict[int, set[int]] = {}
    for s in stored:
        a, b = s.get("low"), s.get("high")
        if not (isinstance(a, int) and isinstance(b, int)):
            continue
        if _offset(a) and _offset(b) and a < b and dict(s) == piece(a, b):
            have.setdefault(a, set()).add(b)
    out, at = [], low
    while at < high:
        boundary = (at // chunk + 1) * chunk
        end = min(high, boundary)
        if not (at % chunk == 0 and end == boundary):  # not a whole chunk: reuse what fits
            fits = [b for b in have.get(at, ()) if b <= end]
            # the longest stored piece from here, else up to where one starts (to reuse it)
            end = max(fits) if fits else min([a for a in have if at < a < end] + [end])
        out.append(piece(at, end))
        at = end
    return out
