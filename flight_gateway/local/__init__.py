"""Services for development, tests, benchmarks and examples, started on this machine: a
Kafka-protocol broker (``kafka``: Tansu) and PostgreSQL servers (``postgres``). Production uses
real ones; nothing else of the gateway depends on these modules."""
