"""The Iceberg REST catalog face (read side) over pinned harness versions: ``catalog`` answers
the protocol's routes, ``metadata`` writes Iceberg metadata over a version's files (cold files
in place, hot slices made once: ``flight_gateway.core.layout``), ``server`` is the bounded HTTP
server."""
