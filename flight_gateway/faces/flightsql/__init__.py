"""Flight SQL (arrow.flight.protocol.sql) on the gateway: see ``service``."""
