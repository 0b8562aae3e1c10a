"""pyiceberg file IO that checks every file against the gateway's allow-lists before opening it.

pyiceberg opens table metadata, manifest lists, manifests, data and delete files through its
``FileIO`` (``new_input``), and writes through ``new_output``. Their locations come from the
catalog and from metadata that table writers control, so each is checked (``planners.locations``)
before it is opened: an outside file fails with PERMISSION_DENIED and is never read. pyiceberg
builds a FileIO from catalog properties only, so the guard travels as a key
(``harness.guard``) into ``planners.locations``' registry; the Iceberg kind sets ``py-io-impl``
to this class itself (table writers may not set ``py-*`` properties).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO

from planners import locations

GUARD_PROPERTY = "harness.guard"
IO_IMPL = f"{__name__}.GuardedFileIO"


class GuardedFileIO(PyArrowFileIO):
    def __init__(self, properties: Any = None) -> None:
        props = dict(properties or {})
        super().__init__(props)
        self._guard_key = str(props.get(GUARD_PROPERTY, ""))

    def _check(self, what: str, location: str) -> None:
        guard = locations.guard_for(self._guard_key)
        guard.check(None, locations.storage(what, location))

    def new_input(self, location: str) -> Any:
        self._check("file named in Iceberg metadata", location)
        return super().new_input(location)

    def new_output(self, location: str) -> Any:
        self._check("file written to an Iceberg table", location)
        return super().new_output(location)

    def delete(self, location: Any) -> None:
        self._check(
            "file deleted from an Iceberg table", str(getattr(location, "location", location))
        )
        super().delete(location)
