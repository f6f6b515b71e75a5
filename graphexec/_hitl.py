"""Human in the loop: ``interrupt()``, answers, and the portable ``RunState``.

How resuming works (read this before using ``interrupt``):

- ``interrupt(value)`` pauses the node. The run returns ``status="interrupted"`` with an
  :class:`~graphexec.Interruption` whose ``id`` is stable: it is derived from the task and from
  the interrupt's key (``interrupt(value, key="address")``, or the call's position in the node
  when no key is given).
- ``Command(resume=answer)`` (one pending interrupt) or ``Command(resume={id: answer, ...})``
  answers. The answers are saved with the task before anything runs, then the interrupted node
  runs again **from its top**; each ``interrupt()`` call that has an answer returns it instead of
  pausing. Code before ``interrupt()`` therefore runs again — wrap side effects in
  ``ctx.effect(name, fn)`` so they happen once (again only after a crash inside the effect,
  with the same ``ctx.idempotency_key``).
- Answers are matched by id, never by position among pending interrupts. An id is
  ``"intr-"`` followed by 24 lowercase hex digits; a ``Command(resume={...})`` whose keys all
  have that form is read as answers by id, and unknown or already answered ids raise
  :class:`~graphexec.errors.InvalidResumeError`; so does a resume of a thread with nothing
  pending.
- Each answer must fit its interruption's kind: an approval takes ``True`` / ``False`` or an
  explicit ``approve`` / ``reject`` decision, and only an explicit approve runs the gated node.
  Anything else is refused before it is recorded.
- An answer the node could not use (the update the node returned with it fails the state
  schema or the serializer) is withdrawn when the run fails: the interrupt is pending again
  and the thread takes a new ``Command(resume=...)``; ``run(None)`` asks again instead of
  replaying it. After any other failure (an exception from the node's own code) the answer is
  kept and ``run(None)`` retries with it.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from graphexec._types import Interruption
from graphexec.errors import (
    DeserializationError,
    GraphExecError,
    GraphInterrupt,
    InvalidResumeError,
)

if TYPE_CHECKING:
    from graphexec._graph import CompiledGraph

__all__ = ["Answer", "RunState", "TaskScope", "interrupt", "interrupt_id"]

_FORMAT = "graphexec.RunState/1"
INTERRUPT_PREFIX = "intr-"

Decision = Literal["resume", "approve", "reject", "continue"]

# Which decisions answer which kind of interruption. Anything else is refused: an approval
# gate runs its node only on an explicit "approve" (never on a typo such as "deny").
DECISIONS: Mapping[str, frozenset[str]] = {
    "approval": frozenset({"approve", "reject"}),
    "input": frozenset({"resume"}),
    "breakpoint": frozenset({"continue", "resume"}),
}


def check_answer(intr: Interruption, answer: Answer, *, thread_id: str | None) -> Answer:
    """Refuse an answer whose decision or fields do not fit ``intr``'s kind.

    Raises:
        InvalidResumeError: the decision is not one the kind takes, or ``edited`` / ``reason``
            / ``by`` have the wrong type.
    """
    allowed = DECISIONS.get(intr.kind, frozenset())
    decision = answer.decision
    if type(decision) is not str or decision not in allowed:
        raise InvalidResumeError(
            f"interruption {intr.id} of node {intr.node!r} is a {intr.kind!r} interrupt; its "
            f"answer's decision must be one of {sorted(allowed)}, not {decision!r}",
            thread_id=thread_id,
        )
    if answer.edited is not None and (
        decision != "approve"
        or not isinstance(answer.edited, Mapping)
        or not all(type(k) is str for k in answer.edited)
    ):
        raise InvalidResumeError(
            f"interruption {intr.id} of node {intr.node!r}: 'edited' goes with an approve and "
            f"is a mapping of state keys to values, not {type(answer.edited).__name__}",
            thread_id=thread_id,
        )
    for name in ("reason", "by"):
        value = getattr(answer, name)
        if value is not None and type(value) is not str:
            raise InvalidResumeError(
                f"interruption {intr.id} of node {intr.node!r}: {name!r} is text, not "
                f"{type(value).__name__}",
                thread_id=thread_id,
            )
    return answer


def interrupt_id(ns: str, task_id: str, key: str) -> str:
    """The stable id of an interrupt: task + key (+ namespace)."""
    digest = hashlib.sha256(f"{ns}\x00{task_id}\x00{key}".encode()).hexdigest()[:24]
    return INTERRUPT_PREFIX + digest


@dataclass(frozen=True, slots=True)
class Answer:
    """A human's answer to one interrupt, as recorded with the task and in metadata.

    Attributes:
        decision: ``resume`` (a value for ``interrupt()``), ``approve`` / ``reject`` (an
            approval), or ``continue`` (past a breakpoint).
        value: The resume value.
        edited: For ``approve``: state values to apply before the node runs.
        reason: For ``reject``: why.
        by: Who decided (free text, e.g. a user id).
        at: When the answer was given.
    """

    decision: Decision
    value: Any = None
    edited: Mapping[str, Any] | None = None
    reason: str | None = None
    by: str | None = None
    at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def to_data(self) -> dict[str, Any]:
        """A plain dict (serializable with the graph's serializer)."""
        return {
            "decision": self.decision,
            "value": self.value,
            "edited": None if self.edited is None else dict(self.edited),
            "reason": self.reason,
            "by": self.by,
            "at": self.at,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Answer:
        """Inverse of :meth:`to_data`."""
        return cls(
            decision=data["decision"],
            value=data.get("value"),
            edited=data.get("edited"),
            reason=data.get("reason"),
            by=data.get("by"),
            at=data["at"],
        )


@dataclass(slots=True)
class TaskScope:
    """What ``interrupt()`` needs to know about the task it is called in."""

    ns: str
    task_id: str
    node: str
    answers: Mapping[str, Answer]
    calls: int = 0


current_scope: contextvars.ContextVar[TaskScope | None] = contextvars.ContextVar(
    "graphexec_task_scope", default=None
)


def interrupt(value: Any, *, key: str | None = None) -> Any:
    """Pause the running node and ask a human; return their answer once resumed.

    Args:
        value: What to show the human (a question, a draft, a form). Must be serializable.
        key: A name for this interrupt within the node. Give one when a node interrupts more
            than once along paths that may change between runs, so answers stay attached to the
            right question; by default the call's position in the node is used.

    The interrupt's id (``Interruption.id``) is ``"intr-"`` followed by 24 lowercase hex
    digits, derived from the task and ``key``; answer it by id with
    ``Command(resume={id: answer})``.

    Returns:
        The answer given with ``Command(resume=...)`` or ``RunState.resume(...)``.

    Raises:
        GraphExecError: when called outside a running node.
    """
    scope = current_scope.get()
    if scope is None:
        raise GraphExecError("interrupt() can only be called inside a node while a graph runs")
    name = key if key is not None else f"#{scope.calls}"
    scope.calls += 1
    iid = interrupt_id(scope.ns, scope.task_id, name)
    answer = scope.answers.get(iid)
    if answer is not None:
        return answer.value
    raise GraphInterrupt([Interruption(iid, scope.node, "input", value, datetime.now(UTC))])


def to_answer(intr: Interruption, raw: Any, *, thread_id: str | None = None) -> Answer:
    """Turn a user's ``Command(resume=...)`` value into an :class:`Answer` for ``intr``.

    Raises:
        InvalidResumeError: the value does not answer an interruption of that kind (see
            :func:`check_answer`).
    """
    if isinstance(raw, Answer):
        return check_answer(intr, raw, thread_id=thread_id)
    if intr.kind == "approval":
        if raw is True:
            return Answer("approve")
        if raw is False:
            return Answer("reject")
        if isinstance(raw, Mapping) and type(raw.get("decision")) is str:
            if raw["decision"] in ("approve", "reject"):
                answer = Answer(
                    raw["decision"],
                    edited=raw.get("edited"),
                    reason=raw.get("reason"),
                    by=raw.get("by"),
                )
                return check_answer(intr, answer, thread_id=thread_id)
        raise InvalidResumeError(
            f"the approval {intr.id} of node {intr.node!r} is answered with True (approve), "
            f"False (reject) or {{'decision': 'approve'|'reject', ...}}, not {_short(raw)}; "
            "or use RunState.approve()",
            thread_id=thread_id,
        )
    if intr.kind == "breakpoint":
        return Answer("continue", value=raw)
    return Answer("resume", value=raw)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- JSON encoding of values in a RunState -----------------------------------------------------


def _plain(value: Any) -> bool:
    if value is None or type(value) in (str, int, bool):
        return True
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if type(value) is list:
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return "$msgpack" not in value and all(
            type(k) is str and _plain(v) for k, v in value.items()
        )
    return False


def _encode(graph: CompiledGraph[Any], value: Any) -> Any:
    if _plain(value):
        return value
    blob = graph.serde.dumps(value, channel="RunState")
    return {"$msgpack": base64.b64encode(blob).decode()}


def _decode(graph: CompiledGraph[Any], value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$msgpack"}:
        return graph.serde.loads(base64.b64decode(value["$msgpack"]), channel="RunState")
    return value


def _key_bytes(key: Any, thread_id: str | None) -> bytes:
    """The signing key as bytes; an empty key (or one of another type) is refused."""
    if type(key) not in (str, bytes) or not key:
        raise InvalidResumeError(
            "a RunState signing key must be a non-empty str or bytes (an empty key signs "
            "nothing); pass the secret your deployment keeps for RunStates",
            thread_id=thread_id,
        )
    return key.encode() if isinstance(key, str) else key


def _sign(key: str | bytes, body: Mapping[str, Any]) -> str:
    raw = _key_bytes(key, None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(raw, canonical.encode(), hashlib.sha256).hexdigest()


@dataclass(slots=True)
class RunState:
    """A paused run, portable across processes: inspect it, decide, serialize, continue.

    Get one with ``result.to_state()`` (or ``RunState.from_json(text, graph)``), record
    decisions with :meth:`approve`, :meth:`reject` and :meth:`resume`, then continue with
    ``graph.run(state)``. Decisions, who made them and when are recorded in the checkpoint
    metadata (``metadata["decisions"]``). A state is refused if it belongs to another graph or
    thread, or if the thread moved on since it was taken.

    Attributes:
        thread_id: The paused thread.
        checkpoint_id: The thread's head when the state was taken.
        graph_name: Name of the graph that produced it.
        graph_version: Its version fingerprint.
        interruptions: Every interrupt pending when the state was taken.
        answers: Decisions recorded so far, by interruption id.
    """

    thread_id: str
    checkpoint_id: str
    graph_name: str
    graph_version: str
    interruptions: tuple[Interruption, ...]
    answers: dict[str, Answer] = field(default_factory=dict)
    _graph: CompiledGraph[Any] | None = field(default=None, repr=False, compare=False)

    @property
    def pending(self) -> tuple[Interruption, ...]:
        """Interruptions without a decision yet."""
        return tuple(i for i in self.interruptions if i.id not in self.answers)

    def _find(self, which: Interruption | str | int) -> Interruption:
        if isinstance(which, Interruption):
            which = which.id
        if isinstance(which, int):
            if not 0 <= which < len(self.interruptions):
                raise InvalidResumeError(
                    f"no interruption #{which}: this state has {len(self.interruptions)}",
                    thread_id=self.thread_id,
                    pending=[i.id for i in self.pending],
                )
            return self.interruptions[which]
        for i in self.interruptions:
            if i.id == which:
                return i
        raise InvalidResumeError(
            f"interruption {which!r} is not part of this state of thread {self.thread_id!r}",
            thread_id=self.thread_id,
            pending=[i.id for i in self.pending],
        )

    def _decide(
        self, which: Interruption | str | int, answer: Answer, kinds: tuple[str, ...]
    ) -> RunState:
        target = self._find(which)
        if target.kind not in kinds:
            verb = {"approve": "approve()", "reject": "reject()"}.get(answer.decision, "resume()")
            raise InvalidResumeError(
                f"interruption {target.id} of node {target.node!r} is a {target.kind!r} "
                f"interrupt; {verb} does not apply to it",
                thread_id=self.thread_id,
                pending=[i.id for i in self.pending],
            )
        self.answers[target.id] = answer
        return self

    def approve(
        self,
        which: Interruption | str | int,
        *,
        edited: Mapping[str, Any] | None = None,
        by: str | None = None,
    ) -> RunState:
        """Approve an approval (or release a breakpoint); ``edited`` values apply first.

        Args:
            which: The interruption, its id, or its index in :attr:`interruptions`.
            edited: State values to apply (through the reducers) before the node runs.
            by: Who approved.
        """
        target = self._find(which)
        if target.kind == "breakpoint":
            return self._decide(which, Answer("continue", by=by), ("breakpoint",))
        return self._decide(which, Answer("approve", edited=edited, by=by), ("approval",))

    def reject(
        self, which: Interruption | str | int, *, reason: str | None = None, by: str | None = None
    ) -> RunState:
        """Reject an approval: the node is skipped and the run follows its ``on_reject``."""
        return self._decide(which, Answer("reject", reason=reason, by=by), ("approval",))

    def resume(
        self, which: Interruption | str | int, value: Any, *, by: str | None = None
    ) -> RunState:
        """Answer an ``interrupt()``: the node's ``interrupt`` call returns ``value``."""
        return self._decide(which, Answer("resume", value=value, by=by), ("input", "breakpoint"))

    # -- serialization ------------------------------------------------------------------------

    def to_json(
        self,
        graph: CompiledGraph[Any] | None = None,
        *,
        key: str | bytes | None = None,
        unsigned: bool = False,
    ) -> str:
        """Serialize to JSON text, signed with ``key`` (HMAC-SHA256).

        A RunState carries decisions (approvals, edited values, answers): whoever can change
        the text can change them, so it is signed by default and :meth:`from_json` refuses
        unsigned text. Pass ``unsigned=True`` instead of a key only for text that never leaves
        a trusted place (a test, one process); the reader must then opt out too.

        Values that JSON cannot hold exactly (datetimes, tuples, models ...) are embedded as
        msgpack from the graph's closed-registry serializer, so ``graph`` is needed for them
        (``result.to_state()`` remembers its graph).

        Args:
            graph: The graph, when the state does not remember it.
            key: The signing secret: a non-empty str or bytes.
            unsigned: Write no signature (instead of a key).

        Raises:
            GraphExecError: neither ``key`` nor ``unsigned=True`` was given, or both were.
            InvalidResumeError: ``key`` is empty.
        """
        if key is None and not unsigned:
            raise GraphExecError(
                f"RunState.to_json() of thread {self.thread_id!r} needs key= (the secret that "
                "signs it, so an edited copy is refused); pass unsigned=True only for text that "
                "stays in trusted hands"
            )
        if key is not None and unsigned:
            raise GraphExecError("RunState.to_json(): pass key= or unsigned=True, not both")
        if key is not None:
            _key_bytes(key, self.thread_id)
        g = graph if graph is not None else self._graph
        if g is None:
            raise GraphExecError("pass the graph: state.to_json(graph)")
        body: dict[str, Any] = {
            "format": _FORMAT,
            "graph": self.graph_name,
            "graph_version": self.graph_version,
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "interruptions": [
                {
                    "id": i.id,
                    "node": i.node,
                    "kind": i.kind,
                    "value": _encode(g, i.value),
                    "created_at": i.created_at.isoformat(),
                }
                for i in self.interruptions
            ],
            "answers": {
                iid: {
                    "decision": a.decision,
                    "value": _encode(g, a.value),
                    "edited": _encode(g, None if a.edited is None else dict(a.edited)),
                    "reason": a.reason,
                    "by": a.by,
                    "at": a.at.isoformat(),
                }
                for iid, a in self.answers.items()
            },
        }
        doc = {"body": body}
        if key is not None:
            doc["signature"] = _sign(key, body)  # type: ignore[assignment]
        return json.dumps(doc, indent=2, sort_keys=True)

    @classmethod
    def from_json(
        cls,
        text: str,
        graph: CompiledGraph[Any],
        *,
        key: str | bytes | None = None,
        allow_unsigned: bool = False,
    ) -> RunState:
        """Load a state written by :meth:`to_json`, for ``graph``.

        Args:
            text: The JSON text.
            graph: The graph the state belongs to.
            key: The secret it was signed with.
            allow_unsigned: Accept text written with ``to_json(unsigned=True)``; only for text
                that never passed through untrusted hands. Without it an unsigned document
                (or one whose signature was removed) is refused.

        Raises:
            InvalidResumeError: the text is not a RunState (or is nested too deeply), was made
                by another graph (name or version differ), is unsigned and ``allow_unsigned``
                was not given, is signed but no ``key`` was given, the key is empty, its
                signature does not match (it was tampered with), or an answer's decision does
                not fit its interruption's kind.
        """
        try:
            doc = json.loads(text)
            if type(doc) is not dict:
                raise TypeError(f"it is a {type(doc).__name__}, not an object")
            body = doc["body"]
            if type(body) is not dict:
                raise TypeError(f"its body is a {type(body).__name__}, not an object")
            fmt = body["format"]
        except RecursionError as e:
            raise InvalidResumeError(
                "not a RunState JSON document: it is nested too deeply to read", thread_id=None
            ) from e
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidResumeError(f"not a RunState JSON document: {e}", thread_id=None) from e
        thread = body.get("thread_id")
        if thread is not None and type(thread) is not str:
            raise InvalidResumeError(
                "malformed RunState: thread_id is not a string", thread_id=None
            )
        if fmt != _FORMAT:
            raise InvalidResumeError(f"unsupported RunState format {fmt!r}", thread_id=thread)
        signature = doc.get("signature")
        if key is not None:
            _key_bytes(key, thread)
            if signature is None:
                raise InvalidResumeError(
                    "this RunState is not signed but a key was given; refusing unsigned state",
                    thread_id=thread,
                )
            try:
                expected = _sign(key, body)
            except (RecursionError, ValueError, TypeError) as e:
                raise InvalidResumeError(
                    f"malformed RunState: its body cannot be checked: {type(e).__name__}",
                    thread_id=thread,
                ) from e
            if type(signature) is not str or not hmac.compare_digest(signature, expected):
                raise InvalidResumeError(
                    "RunState signature does not match: it was modified or signed with another key",
                    thread_id=thread,
                )
        elif signature is not None:
            raise InvalidResumeError(
                "this RunState is signed; pass key= to verify it", thread_id=thread
            )
        elif not allow_unsigned:
            raise InvalidResumeError(
                f"this RunState of thread {thread!r} is not signed, so its decisions may have "
                "been edited: write it with to_json(key=...) and read it with the same key= "
                "(allow_unsigned=True accepts unsigned text from a trusted place only)",
                thread_id=thread,
            )
        if body.get("graph") != graph.name or body.get("graph_version") != graph.version:
            raise InvalidResumeError(
                f"this RunState belongs to graph {body.get('graph')!r} version "
                f"{body.get('graph_version')}, not to {graph.name!r} version {graph.version}",
                thread_id=thread,
            )
        try:
            interruptions = tuple(
                Interruption(
                    i["id"],
                    i["node"],
                    i["kind"],
                    _decode(graph, i["value"]),
                    datetime.fromisoformat(i["created_at"]),
                )
                for i in body["interruptions"]
            )
            answers = {
                iid: Answer(
                    a["decision"],
                    value=_decode(graph, a["value"]),
                    edited=_decode(graph, a["edited"]),
                    reason=a["reason"],
                    by=a["by"],
                    at=datetime.fromisoformat(a["at"]),
                )
                for iid, a in body["answers"].items()
            }
            checkpoint_id = body["checkpoint_id"]
            if type(thread) is not str or type(checkpoint_id) is not str:
                raise TypeError("thread_id and checkpoint_id must be strings")
        except RecursionError as e:
            raise InvalidResumeError(
                "malformed RunState: a value is nested too deeply to read", thread_id=thread
            ) from e
        except (KeyError, TypeError, ValueError, AttributeError, DeserializationError) as e:
            # Anything but a well-formed document is refused, never half-interpreted; the
            # values' msgpack (closed registry) never constructs what this graph did not register.
            raise InvalidResumeError(f"malformed RunState: {e}", thread_id=thread) from e
        by_id = {i.id: i for i in interruptions}
        for iid, answer in answers.items():
            intr = by_id.get(iid)
            if intr is None:
                raise InvalidResumeError(
                    f"malformed RunState: it answers {iid!r}, which is not one of its "
                    "interruptions",
                    thread_id=thread,
                )
            check_answer(intr, answer, thread_id=thread)
        state = cls(
            thread_id=thread,
            checkpoint_id=checkpoint_id,
            graph_name=body["graph"],
            graph_version=body["graph_version"],
            interruptions=interruptions,
            answers=answers,
            _graph=graph,
        )
        return state
