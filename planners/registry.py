"""Source kind -> planner, imported on first use so unused backends are never imported."""

from __future__ import annotations

import importlib
import threading

from flight_gateway.errors import InvalidArgument, Unavailable
from planners.base import Planner

# kind: (module, class, extra that installs its dependencies)
AVAILABLE_PLANNERS: dict[str, tuple[str, str, str]] = {
    "files": ("planners.files", "FilesPlanner", "core"),
    "iceberg": ("planners.iceberg", "IcebergPlanner", "iceberg"),
    "ducklake": ("planners.ducklake", "DuckLakePlanner", "ducklake"),
    "flight": ("planners.flight", "FlightPlanner", "core"),
    "kafka": ("planners.kafka", "KafkaPlanner", "kafka"),
    "postgres": ("planners.postgres", "PostgresPlanner", "postgres"),
}

_instances: dict[str, Planner] = {}
_lock = threading.Lock()


def get_planner(kind: str) -> Planner:
    with _lock:
        if kind in _instances:
            return _instances[kind]
        if kind not in AVAILABLE_PLANNERS:
            raise InvalidArgument(
                f"unknown source kind {kind!r} (known: {sorted(AVAILABLE_PLANNERS)})"
            )
        module_name, cls_name, extra = AVAILABLE_PLANNERS[kind]
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise Unavailable(
                f"source kind {kind!r} needs the [{extra}] extra: "
                f"pip install 'dataharness-flight-gateway[{extra}]' ({e})"
            ) from e
        planner: Planner = getattr(module, cls_name)()
        _instances[kind] = planner
        return planner
