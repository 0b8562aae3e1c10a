"""The read side of the Iceberg REST catalog over harness tables (``rest.server``), backed by
gateway-owned Iceberg tables holding pinned harness versions (``rest.shadow``)."""
