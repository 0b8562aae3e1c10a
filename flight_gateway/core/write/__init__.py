"""Writes: DoPut ingest (``ingest``), merges by key (``merge``), engine writes (``writes``),
locks (``locks``) and the leases writes hold (``lease``), schema changes (``evolve``)."""
