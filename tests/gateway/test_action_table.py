"""Every ``harness.*`` action's body is checked against one table (``protocol/actions.py``):
a misspelt field, a missing one or one of the wrong type is INVALID_ARGUMENT naming it, for any
action; the core has a handler for each, clients know from it which are safe to repeat."""

from __future__ import annotations

import pytest

from clients import HarnessClient
from clients.failover import IDEMPOTENT_ACTIONS
from flight_gateway.core.actions import HANDLERS
from flight_gateway.protocol.actions import BY_NAME
from flight_gateway.protocol.errors import InvalidArgument


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("harness.describe", {"table": "t", "versoin": 1}, "unknown field(s) ['versoin']"),
        ("harness.describe", {"table": 5}, "table must be a string, got an integer"),
        (
            "harness.history",
            {"table": "t", "limit": "10"},
            "limit must be an integer, got a string",
        ),
        ("harness.commit", {"table": "t"}, "harness.commit needs 'commit_id'"),
        (
            "harness.move",
            {"table": "t", "hot": "a", "cold": "b", "mode": 1},
            "mode must be a string, got an integer",
        ),
        (
            "harness.lock",
            {"table": "t", "sources": ["a"], "ttl_s": True},
            "ttl_s must be an integer or a number, got true or false",
        ),
    ],
)
def test_bodies_are_checked_against_the_table(
    client: HarnessClient, name: str, body: dict, message: str
) -> None:
    with pytest.raises(
        InvalidArgument,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        client.action(name, body)


def test_one_handler_per_action_and_repeats_from_the_table() -> None:
    assert set(HANDLERS) | {"harness.public_key"} == set(BY_NAME)
    assert {n for n, a in BY_NAME.items() if a.idempotent} == IDEMPOTENT_ACTIONS
    assert "harness.move" in IDEMPOTENT_ACTIONS and "harness.create_table" not in IDEMPOTENT_ACTIONS
