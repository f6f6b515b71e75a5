"""Hostile stored bytes: code-execution payloads, corrupted, truncated and swapped blobs.

Every payload is fed (a) to the serializer, (b) into every blob column of a stored thread on
SQLite and PostgreSQL (channel deltas, snapshots, pending writes, frontier, metadata), (c) into
a ``RunState`` JSON document and (d) into a queued run's input. Each must raise the precise
error (:class:`~graphexec.DeserializationError`, or :class:`~graphexec.InvalidResumeError` for
a RunState) -- never return ``None`` or garbage -- while the audit-hook guard sees no process
spawn, ``exec``/``compile``, ``pickle.find_class``, new import or canary write. Rows that
decode to inert plain data (constructor-style JSON envelopes) must come back as exactly that
data.
"""

from __future__ import annotations

import asyncio
import base64
import json
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgpack  # type: ignore[import-untyped]
import pytest
from rel_backends import backend_params, make_backend
from rel_support import GUARD, STATS

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    DeserializationError,
    GraphExecError,
    InvalidResumeError,
    RunState,
    Send,
    Serializer,
    StateGraph,
    interrupt,
)
from graphexec._serde import EXT_DATETIME, EXT_REGISTERED, EXT_TUPLE


def _ext(code: int, payload: bytes = b"") -> msgpack.ExtType:
    return msgpack.ExtType(code, payload)


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def code_payloads(canary: Path) -> dict[str, bytes]:
    """Bytes that would run ``touch <canary>`` in a deserializer that imports names."""
    cmd = f"touch {canary}"
    out: dict[str, bytes] = {}
    for target in (
        "os.system",
        "posix.system",
        "builtins.eval",
        "builtins.exec",
        "subprocess.Popen",
        "subprocess.run",
        "importlib.import_module",
        "graphexec._serde.Serializer",
        "pydantic.BaseModel",
    ):
        out[f"registered-marker naming {target}"] = _pack([_ext(EXT_REGISTERED), target, [cmd]])
        out[f"registered-marker naming {target} (kwargs)"] = _pack(
            [_ext(EXT_REGISTERED), target, {"args": [cmd], "shell": True}]
        )
    # LangGraph's msgpack extension codes 0..6 (constructor, method, pydantic, numpy): the payload
    # is (module, name, args); graphexec gives these codes other meanings or none.
    for code in range(7):
        out[f"langgraph-style ext {code} -> os.system"] = _pack(
            _ext(code, _pack(["os", "system", [cmd]]))
        )
        out[f"langgraph-style ext {code} -> subprocess.Popen"] = _pack(
            _ext(code, _pack(["subprocess", "Popen", [["touch", str(canary)]], {}]))
        )
    for code in (14, 42, 100, 127, -2, -128):  # raw ext8 (msgpack.ExtType refuses code < 0)
        payload = _pack(["os", "system", [cmd]])
        raw = b"\xc7" + bytes([len(payload)]) + code.to_bytes(1, "big", signed=True) + payload
        out[f"unknown ext code {code}"] = raw
    out["marker with a payload"] = _pack([_ext(EXT_TUPLE, b"os.system"), 1])
    out["marker not at the head of an array"] = _pack([1, _ext(EXT_TUPLE)])
    out["registered marker with a non-str name"] = _pack([_ext(EXT_REGISTERED), 7, {}])
    out["datetime marker with a tzinfo naming os.system"] = _pack(
        [_ext(EXT_DATETIME), 2024, 1, 1, 0, 0, 0, 0, 0, [_ext(EXT_REGISTERED), "os.system", cmd]]
    )
    out["zoneinfo key escaping the tz database"] = _pack(_ext(12, b"../../../../etc/passwd"))
    out["zoneinfo key naming a module"] = _pack(_ext(12, b"os/system"))
    # pickle opcodes (protocol 0 and 2): GLOBAL os.system, then REDUCE
    out["pickle protocol 0 GLOBAL os.system"] = f"cos\nsystem\n(S'{cmd}'\ntR.".encode()
    out["pickle protocol 2 GLOBAL os.system"] = (
        b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd.encode() + b"\x85R."
    )
    out["pickle protocol 4 STACK_GLOBAL builtins.eval"] = (
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x8c\x04eval\x93"
        b"\x8c\x04'x'\x85R."
    )
    return out


def corrupt_payloads() -> dict[str, bytes]:
    good = Serializer().dumps({"log": ["a", "b"], "when": (1, 2.5, None)})
    return {
        "empty": b"",
        "truncated by one byte": good[:-1],
        "truncated to half": good[: len(good) // 2],
        "trailing garbage": good + b"\x00garbage",
        "two documents": good + good,
        "random bytes": bytes(range(256)) * 2,
        "array declaring 2**32-1 items": b"\xdd\xff\xff\xff\xff",
        "map declaring 2**32-1 pairs": b"\xdf\xff\xff\xff\xff",
        "bin declaring 4 GiB": b"\xc6\xff\xff\xff\xff\x00",
        "str declaring 4 GiB": b"\xdb\xff\xff\xff\xff",
        "nesting bomb 100k deep": b"\x91" * 100_000 + b"\xc0",
        "invalid utf-8 in a str": b"\xa2\xff\xfe",
        "reserved byte 0xc1": b"\xc1",
        "bigint ext with an empty payload then junk": _pack(_ext(1, b"")) + b"\xc1",
        "bigint ext holding a native int": _pack(_ext(1, b"\x05")),
        "bigint ext with a redundant sign byte": _pack(
            _ext(1, b"\x00" + (2**70).to_bytes(9, "big"))
        ),
        "uuid ext of 3 bytes": _pack(_ext(9, b"abc")),
        "date ext of 9 bytes": _pack(_ext(6, b"123456789")),
        "decimal ext not a number": _pack(_ext(10, b"os.system('x')")),
        "timedelta ext truncated": _pack(_ext(8, b"\x00\x01")),
    }


# Plain data that looks like a constructor to other frameworks: must stay inert plain data.
INERT: dict[str, Any] = {
    "langchain lc constructor envelope": {
        "lc": 1,
        "type": "constructor",
        "id": ["os", "system"],
        "kwargs": {"command": "touch canary"},
    },
    "jsonpickle py/reduce envelope": {"py/reduce": [{"py/function": "os.system"}, ["touch x"]]},
    "pydantic-style __class__ envelope": {"__class__": "subprocess.Popen", "args": ["touch"]},
    "graphexec RunState $msgpack lookalike": {"$type": "os.system", "$args": ["touch"]},
}


_PLAIN = (type(None), bool, int, float, str, bytes, list, dict, tuple, set, frozenset)


def inert(value: Any) -> bool:
    """Only plain built-in data (what a refused-or-neutralised payload may decode to)."""
    if type(value) in (list, tuple, set, frozenset):
        return all(inert(v) for v in value)
    if type(value) is dict:
        return all(inert(k) and inert(v) for k, v in value.items())
    return type(value) in _PLAIN


NEUTRALISED = {"langgraph-style ext 1 -> os.system", "langgraph-style ext 1 -> subprocess.Popen"}
"""graphexec's extension 1 is a big int: these decode to a (harmless) number."""


def refused(canary: Path) -> dict[str, bytes]:
    payloads = code_payloads(canary) | corrupt_payloads()
    return {k: v for k, v in payloads.items() if k not in NEUTRALISED}


def test_code_payloads_never_run_code(canary: Path) -> None:
    serde = Serializer()
    payloads = refused(canary)
    with GUARD.armed(canary):
        for name, blob in payloads.items():
            with pytest.raises(DeserializationError) as info:
                serde.loads(blob, channel="notes")
            assert info.value.channel == "notes", name
            STATS.add("hostile", kind="hostile bytes (serializer)")
        for name in NEUTRALISED:
            value = serde.loads(code_payloads(canary)[name])
            assert type(value) is int and inert(value), name
            STATS.add("hostile", kind="hostile bytes (serializer)")
    assert len(payloads) >= 60


def test_real_big_ints_still_round_trip() -> None:
    serde = Serializer()
    for value in (2**64, -(2**63) - 1, 2**70, -(2**200), 2**64 - 1, -(2**63)):
        assert serde.loads(serde.dumps(value)) == value


@pytest.mark.parametrize("row", sorted(INERT))
def test_constructor_style_envelopes_stay_plain_data(canary: Path, row: str) -> None:
    serde = Serializer()
    blob = _pack(INERT[row])
    with GUARD.armed(canary):
        value = serde.loads(blob)
    assert value == INERT[row] and type(value) is dict
    STATS.add("hostile", kind="hostile bytes (serializer)")


# -- through storage ----


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]
    summary: str


def notes_graph(cp: BaseCheckpointer, *, fail: bool = False) -> CompiledGraph[Any]:
    async def part(i: int) -> dict[str, Any]:
        if fail and i == 1:
            await asyncio.sleep(0.02)
            raise RuntimeError("tool down")
        return {"notes": [f"part {i}"]}

    def summarize(state: Notes) -> dict[str, Any]:
        return {"summary": f"{len(state['notes'])} notes"}

    b = StateGraph(Notes)
    b.add_node("part", part)
    b.add_node("summarize", summarize)
    b.add_conditional_edges(START, lambda s: [Send("part", i) for i in range(2)])
    b.add_edge("part", "summarize")
    b.add_edge("summarize", END)
    return b.compile(checkpointer=cp)


# (where, SQL selecting the row's key, SQL writing the blob); %s: thread, blob, key
SURFACES: dict[str, tuple[str, str]] = {
    "channel delta (set)": (
        "SELECT cp_seq FROM graphexec_channels WHERE role = 'd' AND op = 'set' AND cp_seq IN "
        "(SELECT cp_seq FROM graphexec_checkpoints WHERE thread_id = %s) ORDER BY cp_seq DESC",
        "UPDATE graphexec_channels SET data = %s WHERE role = 'd' AND op = 'set' AND cp_seq = %s",
    ),
    "channel delta (fold)": (
        "SELECT cp_seq FROM graphexec_channels WHERE role = 'd' AND op = 'fold' AND cp_seq IN "
        "(SELECT cp_seq FROM graphexec_checkpoints WHERE thread_id = %s) ORDER BY cp_seq DESC",
        "UPDATE graphexec_channels SET data = %s WHERE role = 'd' AND op = 'fold' AND cp_seq = %s",
    ),
    "snapshot": (
        "SELECT cp_seq FROM graphexec_channels WHERE role = 's' AND op = 'set' AND cp_seq IN "
        "(SELECT cp_seq FROM graphexec_checkpoints WHERE thread_id = %s) ORDER BY cp_seq",
        "UPDATE graphexec_channels SET data = %s WHERE role = 's' AND op = 'set' AND cp_seq = %s",
    ),
    "frontier": (
        "SELECT max(cp_seq) FROM graphexec_checkpoints WHERE thread_id = %s",
        "UPDATE graphexec_checkpoints SET frontier = %s WHERE cp_seq = %s",
    ),
    "metadata": (
        "SELECT max(cp_seq) FROM graphexec_checkpoints WHERE thread_id = %s",
        "UPDATE graphexec_checkpoints SET metadata = %s WHERE cp_seq = %s",
    ),
    "pending write": (
        "SELECT w.cp_seq FROM graphexec_writes AS w JOIN graphexec_checkpoints AS c "
        "ON c.cp_seq = w.cp_seq WHERE c.thread_id = %s",
        "UPDATE graphexec_writes SET data = %s WHERE cp_seq = %s",
    ),
}


async def _read_everything(graph: CompiledGraph[Any], thread: str) -> None:
    """Every read path a user or a worker takes on a thread."""
    await graph.aget_state(thread)
    await graph.aget_state_history(thread)
    await graph.ainvoke(None, thread_id=thread)


@pytest.mark.parametrize("kind", backend_params())
async def test_hostile_blobs_in_every_stored_column_are_refused(
    kind: str, tmp_path: Path, canary: Path
) -> None:
    payloads = refused(canary)
    async with make_backend(kind, tmp_path) as backend, backend.open() as cp:
        graph = notes_graph(cp)
        await graph.ainvoke({"notes": [], "summary": ""}, thread_id="control")
        surfaces_tried = 0
        for i, (surface, (select, update)) in enumerate(sorted(SURFACES.items())):
            thread = f"t{i}"
            if surface == "pending write":  # part 0's writes are saved, part 1 failed
                failed = await notes_graph(cp, fail=True).arun(
                    {"notes": [], "summary": ""}, thread_id=thread
                )
                assert failed.status == "failed"
            else:
                await graph.ainvoke({"notes": [], "summary": ""}, thread_id=thread)
            keys = backend.raw_sql(select, (thread,))
            assert keys and keys[0][0] is not None, f"{surface}: no row to tamper with"
            surfaces_tried += 1
            for blob in payloads.values():
                backend.raw_sql(update, (blob, keys[0][0]))
                with GUARD.armed(canary), pytest.raises(DeserializationError):
                    await _read_everything(graph, thread)
                STATS.add("hostile", kind=f"hostile bytes (stored, {kind})")
        assert surfaces_tried == len(SURFACES)
        state = await graph.aget_state("control")  # other threads are unharmed
        assert state is not None and state.values["summary"] == "2 notes"
        assert backend.integrity_problems() == []


# -- RunState documents ----


class Review(TypedDict):
    draft: str
    answer: str


def review_graph(cp: BaseCheckpointer) -> CompiledGraph[Any]:
    def ask(state: Review) -> dict[str, Any]:
        return {"answer": str(interrupt({"draft": state["draft"]}))}

    b = StateGraph(Review)
    b.add_node("ask", ask)
    b.add_node("publish", lambda s: {"draft": s["draft"] + "!"}, needs_approval=True)
    b.add_edge(START, "ask")
    b.add_edge("ask", "publish")
    b.add_edge("publish", END)
    return b.compile(checkpointer=cp)


def _mutations(canary: Path) -> dict[str, Callable[[dict[str, Any]], Any]]:
    hostile = base64.b64encode(code_payloads(canary)["registered-marker naming os.system"])
    pickled = base64.b64encode(code_payloads(canary)["pickle protocol 0 GLOBAL os.system"])

    def at(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
        def mutate(doc: dict[str, Any]) -> Any:
            target: Any = doc
            *parents, last = path.split("/")
            for p in parents:
                target = target[int(p)] if isinstance(target, list) else target[p]
            if isinstance(target, list):
                target[int(last)] = value
            elif value is _DELETE:
                del target[last]
            else:
                target[last] = value
            return doc

        return mutate

    return {
        "msgpack value naming os.system": at(
            "body/interruptions/0/value", {"$msgpack": hostile.decode()}
        ),
        "pickle bytes as a msgpack value": at(
            "body/interruptions/0/value", {"$msgpack": pickled.decode()}
        ),
        "msgpack value not base64": at("body/interruptions/0/value", {"$msgpack": "%%%"}),
        "body is a list": at("body", []),
        "body is a string": at("body", "os.system"),
        "graph key missing": at("body/graph", _DELETE),
        "graph version missing": at("body/graph_version", _DELETE),
        "answers is a list": at("body/answers", [["x", {}]]),
        "interruptions is a number": at("body/interruptions", 7),
        "interruption is a string": at("body/interruptions/0", "os.system"),
        "created_at not a date": at("body/interruptions/0/created_at", "yesterday"),
        "thread_id is a number": at("body/thread_id", 12),
        "checkpoint_id is a dict": at("body/checkpoint_id", {"$msgpack": hostile.decode()}),
        "unknown format": at("body/format", "graphexec.RunState/999"),
    }


_DELETE = object()


@pytest.fixture
def memory_store() -> BaseCheckpointer:
    from graphexec import InMemoryCheckpointer

    return InMemoryCheckpointer()


async def test_hostile_runstate_documents_are_refused(
    memory_store: BaseCheckpointer, canary: Path
) -> None:
    graph = review_graph(memory_store)
    result = await graph.arun({"draft": "notes", "answer": ""}, thread_id="r")
    assert result.status == "interrupted"
    text = result.to_state().to_json(unsigned=True)  # the parser's refusals, past the signature
    mutations = _mutations(canary)
    for name, mutate in mutations.items():
        doc = mutate(json.loads(text))
        with GUARD.armed(canary), pytest.raises(InvalidResumeError) as info:
            RunState.from_json(json.dumps(doc), graph, allow_unsigned=True)
        assert "RunState" in str(info.value), name
        STATS.add("hostile", kind="hostile RunState documents")
    for name, envelope in INERT.items():  # inert data is carried as data, never constructed
        doc = json.loads(text)
        doc["body"]["interruptions"][0]["value"] = envelope
        with GUARD.armed(canary):
            state = RunState.from_json(json.dumps(doc), graph, allow_unsigned=True)
        assert state.interruptions[0].value == envelope, name
        STATS.add("hostile", kind="hostile RunState documents")
    done = await graph.arun(Command(resume="yes"), thread_id="r")  # the thread is unharmed
    assert done.status == "interrupted" and done.interruptions[0].kind == "approval"


# -- queued run inputs ----


@pytest.mark.postgres
async def test_a_hostile_queued_input_fails_the_run_and_runs_nothing(
    tmp_path: Path, canary: Path
) -> None:
    from pg import admin_connection, fresh_schema, schema_dsn

    import checkpointers.postgres
    from checkpointers.queue import RunQueue, Worker

    async with fresh_schema() as schema:
        dsn = schema_dsn(schema)
        with admin_connection() as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        queue = RunQueue(dsn)
        await queue.setup()
        worker: Worker | None = None
        store = checkpointers.postgres.PostgresCheckpointer(dsn)
        try:
            graph = review_graph(store)  # compiled before the guard: compiling evaluates hints
            rows = code_payloads(canary) | {
                "not a run input": _pack([1, 2, 3]),
                "command without fields": Serializer().dumps({"command": {"goto": "x"}}),
                "input and command": Serializer().dumps({"input": {}, "command": {}}),
            }
            ids = []
            for i, blob in enumerate(rows.values()):
                rid = await queue.enqueue(
                    "review", {"draft": "d", "answer": ""}, thread_id=f"q{i}", run_id=f"run{i}"
                )
                await queue._exec(
                    "tamper", "UPDATE graphexec_runs SET input = %s WHERE run_id = %s", (blob, rid)
                )
                ids.append(rid)
            worker = Worker(dsn, {"review": graph}, concurrency=2, poll_interval=0.05)
            with GUARD.armed(canary):
                await asyncio.wait_for(worker.run(max_runs=len(ids)), timeout=60)
            for rid in ids:
                run = await queue.get(rid)
                assert run is not None and run.status == "failed", run
                assert run.error is not None and "DeserializationError" in run.error, run.error
                STATS.add("hostile", kind="hostile queued inputs")
        finally:
            await queue.aclose()
            await store.aclose()
            if worker is not None:
                await worker.queue.aclose()


def test_error_types_are_graphexec_errors() -> None:
    assert issubclass(DeserializationError, GraphExecError)
    assert issubclass(InvalidResumeError, GraphExecError)
