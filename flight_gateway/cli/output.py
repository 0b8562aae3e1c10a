"""Printing for the CLI: JSON for scripts, plain text for people, a progress line on a TTY."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO


def emit(value: Any, as_json: bool, text: str | None = None, out: TextIO | None = None) -> None:
    """``value`` as JSON (``--json``) or ``text`` (default: JSON too, indented)."""
    out = out or sys.stdout
    if as_json or text is None:
        out.write(json.dumps(value, indent=None if as_json else 2, default=str) + "\n")
    else:
        out.write(text if text.endswith("\n") else text + "\n")


def table_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


class Progress:
    """Rows, bytes and endpoints read so far, redrawn on stderr at most every 0.1 s, and only
    when stderr is a terminal (piped output and logs stay clean)."""

    def __init__(self, endpoints: int, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.endpoints, self.done, self.rows, self.bytes = endpoints, 0, 0, 0
        self._last = 0.0

    def batch(self, rows: int, nbytes: int) -> None:
        self.rows += rows
        self.bytes += nbytes
        self._draw()

    def endpoint_done(self) -> None:
        self.done += 1
        self._draw(force=True)

    def close(self) -> None:
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.1):
            return
        self._last = now
        self.stream.write(
            f"\r{self.rows:,} rows, {self.bytes / 1e6:,.1f} MB, "
            f"{self.done}/{self.endpoints} endpoints"
        )
        self.stream.flush()
