"""The core: what every face serves, and nothing of any face (no Flight, gRPC or HTTP types).

Context and policies (``context``, ``config``, ``limits``, ``auth``, ``reach``, ``secrets``,
``slots``), sources bound to their kinds (``sources``), the read service (``read``: pin, plan,
sign, open, and ``scan`` for faces without tickets), the write services (``write``: DoPut
ingest, merges, engine writes, locks, leases, schema changes), the harness actions
(``actions``), maintenance and metrics. Faces (``flight_gateway.faces``) are adapters over it;
``flight_gateway.app`` assembles them. docs/architecture.md.
"""
