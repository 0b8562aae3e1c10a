"""Faces: the protocols the core is served in. ``flight`` (native Arrow Flight), ``flightsql``
(Arrow Flight SQL, carried by the Flight face), ``iceberg_rest`` (an Iceberg REST catalog).
Each imports the core and the protocol, never another face; ``flight_gateway.app`` mounts them.
"""
