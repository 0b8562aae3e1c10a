"""The native Arrow Flight face: ``server`` (the FlightServerBase), ``auth`` (bearer tokens and
client certificates as Flight middleware), ``errors`` (harness errors as Flight statuses), and
``tracing`` (a server span per call)."""
