"""DataHarness Flight gateway: one logical table over many physical sources, read at one version.

Layers (import direction is one way, top to bottom):
``protocol`` (wire messages) -> ``catalog`` (SQLAlchemy) -> ``server`` (Flight handlers).
Importing this package imports neither Spark, Kafka nor DuckDB.
"""

__version__ = "0.1.0"
