"""Pinned versions as files (DESIGN §16-§17): cold files in place, hot slices made once."""

from flight_gateway.core.layout.store import SliceStore
from flight_gateway.core.layout.version import Layouts, SourceFiles, VersionLayout

__all__ = ["Layouts", "SliceStore", "SourceFiles", "VersionLayout"]
