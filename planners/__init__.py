"""Scan planning per source kind.

``planners.registry`` maps a source kind to its planner, imported lazily so that importing the
gateway does not import Kafka, DuckDB or pyiceberg. Planners never import the server.
"""
