"""What is in force at a table version: the one rule every reader and writer of states uses.

A source's state at version ``v`` is its latest state row at or before ``v``; the same holds
for versioned key/values (properties, external state). ``describe`` reads with it, a commit
checks compare-and-set against it at the current version, and retention keeps, for every
source and key, the row in force at the new oldest version. The Postgres commit function
(``commit.postgres``) embeds the SQL this module generates, so that rule is written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, ScalarSelect, Select, Table, and_, func, or_, select

from flight_gateway.catalog.db import kv, source_states, sources


def latest_at_or_before(table: Table, key: Sequence[str], version: Any) -> ScalarSelect[Any]:
    """The version of the row of ``table`` in force at ``version`` for the enclosing row's key:
    the greatest version at or before it (a correlated subquery; one index seek)."""
    other = table.alias(f"{table.name}_in_force")
    return (
        select(func.max(other.c.version))
        .where(*(other.c[k] == table.c[k] for k in key), other.c.version <= version)
        .scalar_subquery()
    )


def state_in_force(version: Any) -> ScalarSelect[Any]:
    """Per source: the version of its state row in force at ``version``."""
    return latest_at_or_before(source_states, ["source_id"], version)


def kv_in_force(version: Any) -> ScalarSelect[Any]:
    """Per (table, namespace, key): the version of its value in force at ``version``."""
    return latest_at_or_before(kv, ["table_id", "ns", "key"], version)


_states_in_force = source_states.alias("harness_source_states_at")


def alive_at(version: Any) -> ColumnElement[bool]:
    """Sources that belong to the table at ``version``."""
    return and_(
        sources.c.added_version <= version,
        or_(sources.c.removed_version.is_(None), sources.c.removed_version > version),
    )


def sources_at(table_id: Any, version: Any) -> Select[Any]:
    """Every source of the table at ``version`` joined with its state in force then."""
    return (
        select(
            sources.c.id,
            sources.c.name,
            sources.c.kind,
            sources.c.config,
            sources.c.partition,
            sources.c.added_version,
            source_states.c.state,
            source_states.c.state_version,
        )
        .join(source_states, source_states.c.source_id == sources.c.id)
        .where(
            sources.c.table_id == table_id,
            alive_at(version),
            # Correlated on the source row (one index seek per source), not on each state
            # row of the join (one seek per state row ever written: O(history)).
            source_states.c.version
            == select(func.max(_states_in_force.c.version))
            .where(
                _states_in_force.c.source_id == sources.c.id,
                _states_in_force.c.version <= version,
            )
            .scalar_subquery(),
        )
        .order_by(sources.c.id)
    )


def kv_at(table_id: Any, version: Any) -> Select[Any]:
    """Every key/value of the table in force at ``version`` (null values included)."""
    # Driven by the table's distinct keys (a cheap index-only scan) and one seek per key, not
    # one correlated seek per row ever written (O(history)).
    keys = select(kv.c.ns, kv.c.key).where(kv.c.table_id == table_id).distinct().subquery("keys")
    latest = kv.alias("harness_kv_at")
    in_force = (
        select(func.max(latest.c.version))
        .where(
            latest.c.table_id == table_id,
            latest.c.ns == keys.c.ns,
            latest.c.key == keys.c.key,
            latest.c.version <= version,
        )
        .scalar_subquery()
    )
    return (
        select(kv.c.ns, kv.c.key, kv.c.value)
        .select_from(keys)
        .join(kv, and_(kv.c.table_id == table_id, kv.c.ns == keys.c.ns, kv.c.key == keys.c.key))
        .where(kv.c.version == in_force)
    )
