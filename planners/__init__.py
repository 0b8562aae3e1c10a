"""Source kinds and predicates: the harness's composition layer.

- ``planners.kind``: the interface every source kind implements and its optional capabilities.
- ``planners.common``: helpers kinds share (conforming batches to harness columns, grouping).
- ``planners.registry``: kinds by name, found through the ``dataharness.sources`` entry points
  and imported lazily, so importing the gateway imports neither Kafka, DuckDB nor pyiceberg.
- ``planners.execute``: one task end to end (the kind's read, residual filter, projection).
- one module per built-in kind: ``files``, ``iceberg``, ``ducklake``, ``flight``, ``kafka``,
  ``postgres``; ``predicates`` for the filter AST and its translations.

Planners never import the server or the clients.
"""
