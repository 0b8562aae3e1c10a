"""Fuzzing the live gateway: descriptors, tickets, action bodies, filters and uploads.

Every call must either succeed or fail with a status a caller can act on — INVALID_ARGUMENT,
NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED, UNIMPLEMENTED, or the documented
``[FAILED_PRECONDITION]``/``[ALREADY_EXISTS]``/``[RESOURCE_EXHAUSTED]`` form — never INTERNAL or
an uncoded UNKNOWN; a rejected call writes nothing; the server keeps serving.

``HARNESS_FUZZ_EXAMPLES`` sets examples per test (CI runs a short pass; see docs/security.md for
a long run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flight_gateway.protocol import ACTIONS
from tests.gateway.helpers import running_gateway, write_parquet

EXAMPLES = int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
CODED = ("[FAILED_PRECONDITION]", "[ALREADY_EXISTS]", "[RESOURCE_EXHAUSTED]")
OK_ERRORS = (
    pa.ArrowInvalid,  # INVALID_ARGUMENT
    pa.ArrowKeyError,  # NOT_FOUND
    pa.ArrowNotImplementedError,  # UNIMPLEMENTED
    fl.FlightUnauthenticatedError,
    fl.FlightUnauthorizedError,
)

KEYS = [
    "table",
    "columns",
    "filter",
    "version",
    "as_of",
    "limit",
    "dedupe",
    "sources",
    "since",
    "commit_id",
    "source",
    "lock_id",
    "fencing_token",
    "updates",
    "add_sources",
    "remove_sources",
    "external_state",
    "properties",
    "schema_changes",
    "summary",
    "schema",
    "arrow_schema",
    "partition_by",
    "primary_key",
    "changes",
    "keep_last",
    "before",
    "owner",
    "ttl_s",
    "wait_s",
    "write_id",
    "paths",
    "overwrite",
    "relocation",
    "state",
    "name",
    "kind",
    "config",
    "op",
    "type",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["t", "f", "logs", "id", "v", "files", "kafka", "int64", "string", "*", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=12,
)
bodies = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=7)
filter_atoms = st.sampled_from(
    [
        "id",
        "v",
        "x",
        "'a'",
        "1",
        "2.5",
        "-3",
        "NULL",
        "TRUE",
        "(",
        ")",
        "AND",
        "OR",
        "NOT",
        "=",
        "<>",
        "<",
        ">=",
        "IN",
        "BETWEEN",
        "IS",
        "LIKE",
        "'%'",
        ",",
        "DATE '2024-01-01'",
        ";",
        "SELECT",
        "*",
        "--",
        "/*",
        '"v"',
        "1e400",
        "9999999999999999999999",
    ]
)
filters = st.lists(filter_atoms, max_size=12).map(" ".join) | st.text(max_size=40)


def json_text(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def check(call: Callable[[], Any]) -> bool:
    """Run a fuzzed call; True when it was rejected (with an acceptable status)."""
    try:
        result = call()
        if isinstance(result, Iterator):
            list(result)
        return False
    except OK_ERRORS:
        return True
    except fl.FlightServerError as e:
        assert any(c in str(e) for c in CODED), f"uncoded server error: {e}"
        return True
    except fl.FlightError as e:
        pytest.fail(f"{type(e).__name__}: {e}")
    return False


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "data").mkdir()
    write_parquet(tmp / "data" / "a.parquet", pa.table({"id": [1, 2, 3], "v": ["x", "y", None]}))
    tokens = {"admin": {"name": "admin", "admin": ["*"]}, "reader": {"name": "r", "read": ["t"]}}
    with running_gateway(
        f"sqlite:///{tmp / 'c.db'}",
        tokens=tokens,
        allow_anonymous=True,
        reach={"paths": [str(tmp / "data")]},
    ) as (server, catalog):
        admin = fl.connect(f"grpc://127.0.0.1:{server.port}")
        options = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer admin")])
        for body in (
            {
                "table": "t",
                "schema": [{"name": "id", "type": "int64"}, {"name": "v", "type": "string"}],
                "primary_key": ["id"],
            },
            {
                "table": "t",
                "commit_id": "c0",
                "add_sources": [
                    {
                        "name": "f",
                        "kind": "files",
                        "config": {"root": str(tmp / "data")},
                        "state": {"files": ["a.parquet"]},
                    }
                ],
            },
        ):
            name = "harness.create_table" if "schema" in body else "harness.commit"
            list(admin.do_action(fl.Action(name, json_text(body)), options))
        yield {"client": admin, "options": options, "catalog": catalog, "server": server}
        admin.close()


def _state(g: dict[str, Any]) -> list[tuple[str, int]]:
    cat = g["catalog"]
    return [(t, cat.current_version(t)) for t in cat.list_tables()]


def _serving(g: dict[str, Any]) -> None:
    info = g["client"].get_flight_info(fl.FlightDescriptor.for_path("t"), g["options"])
    assert g["client"].do_get(info.endpoints[0].ticket, g["options"]).read_all().num_rows == 3


@FUZZ
@given(body=bodies, extra=st.dictionaries(st.text(max_size=8), json_values, max_size=2))
def test_read_descriptors(gateway: dict[str, Any], body: dict, extra: dict) -> None:
    c, o = gateway["client"], gateway["options"]
    d = fl.FlightDescriptor.for_command(json_text({**body, **extra}))
    check(lambda: c.get_flight_info(d, o))
    check(lambda: c.get_schema(d, o))
    _serving(gateway)


@FUZZ
@given(raw=st.binary(max_size=200), path=st.lists(st.text(max_size=10), max_size=3))
def test_raw_descriptors(gateway: dict[str, Any], raw: bytes, path: list[str]) -> None:
    c, o = gateway["client"], gateway["options"]
    check(lambda: c.get_flight_info(fl.FlightDescriptor.for_command(raw), o))
    check(lambda: c.get_flight_info(fl.FlightDescriptor.for_path(*path), o))
    _serving(gateway)


@FUZZ
@given(flt=filters, columns=st.none() | st.lists(st.sampled_from(["id", "v", "x", ""]), max_size=3))
def test_filters(gateway: dict[str, Any], flt: str, columns: list[str] | None) -> None:
    c, o = gateway["client"], gateway["options"]
    d = fl.FlightDescriptor.for_command(
        json_text({"table": "t", "filter": flt, "columns": columns})
    )

    def read() -> Any:
        info = c.get_flight_info(d, o)
        return [c.do_get(ep.ticket, o).read_all() for ep in info.endpoints]

    check(read)
    _serving(gateway)


@FUZZ
@given(cut=st.integers(0, 400), flip=st.integers(0, 400), junk=st.binary(max_size=50))
def test_tickets(gateway: dict[str, Any], cut: int, flip: int, junk: bytes) -> None:
    c, o = gateway["client"], gateway["options"]
    ticket = c.get_flight_info(fl.FlightDescriptor.for_path("t"), o).endpoints[0].ticket.ticket
    mutated = bytearray(ticket[: max(cut, 1)] + junk)
    if mutated:
        mutated[flip % len(mutated)] ^= 0x5A
    for t in (bytes(mutated), junk):
        assert check(lambda t=t: c.do_get(fl.Ticket(t), o).read_all()) or t == ticket
    _serving(gateway)


@FUZZ
@given(
    action=st.sampled_from([*ACTIONS, "harness.nope", "CreatePreparedStatement"]),
    body=bodies,
    reader=st.booleans(),
)
def test_action_bodies(gateway: dict[str, Any], action: str, body: dict, reader: bool) -> None:
    c = gateway["client"]
    o = (
        fl.FlightCallOptions(headers=[(b"authorization", b"Bearer reader")])
        if reader
        else gateway["options"]
    )
    if action == "harness.drop_table":
        body = {**body, "table": "not-t"}  # keep the fixture's table
    before = _state(gateway)
    if check(lambda: c.do_action(fl.Action(action, json_text(body)), o)):
        assert _state(gateway) == before, f"rejected {action} changed the catalog"
    _serving(gateway)


upload_columns = st.dictionaries(
    st.sampled_from(["id", "v", "x", "_source"]),
    st.sampled_from(
        [
            pa.int64(),
            pa.int8(),
            pa.string(),
            pa.float64(),
            pa.bool_(),
            pa.binary(),
            pa.timestamp("us"),
            pa.null(),
        ]
    ),
    max_size=3,
)


@FUZZ
@given(cols=upload_columns, rows=st.integers(0, 20), cmd=bodies, reader=st.booleans())
def test_uploads(gateway: dict[str, Any], cols: dict, rows: int, cmd: dict, reader: bool) -> None:
    c = gateway["client"]
    o = (
        fl.FlightCallOptions(headers=[(b"authorization", b"Bearer reader")])
        if reader
        else gateway["options"]
    )
    table = (
        pa.table(
            {
                n: pa.nulls(rows, t) if t == pa.null() else pa.array([None] * rows, t)
                for n, t in cols.items()
            }
        )
        if cols
        else pa.table({"id": pa.array([], pa.int64())})
    )
    descriptor = fl.FlightDescriptor.for_command(json_text({"table": "t", **cmd}))
    before = _state(gateway)

    def put() -> None:
        writer, reply = c.do_put(descriptor, table.schema, o)
        writer.write_table(table)
        writer.done_writing()
        reply.read()
        writer.close()

    if check(put):
        assert _state(gateway) == before, "a rejected upload changed the catalog"
    _serving(gateway)
