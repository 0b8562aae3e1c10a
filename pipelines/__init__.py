"""Data movement between tiers: library movers (``pipelines.movers``) and, later, Spark jobs."""
