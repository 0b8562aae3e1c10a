"""Data movement between tiers: ``Mover`` (one ``harness.move`` per call), ingest helpers,
compaction and Spark jobs."""
