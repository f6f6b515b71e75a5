"""State schemas and channels: how a schema's keys become channels, and how updates are checked.

A state schema is a ``TypedDict``, a pydantic ``BaseModel`` or a dataclass. Each key is a
channel. A key annotated ``Annotated[T, reducer]`` folds updates into the current value with
``reducer(current, update)``; any other key keeps the last value written.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
import threading
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, count, repeat
from types import NoneType
from typing import Any, Literal, get_args, get_origin, get_type_hints, is_typeddict

import pydantic

from graphexec.errors import GraphBuildError, InvalidUpdateError

__all__ = [
    "REMOVE_ALL_MESSAGES",
    "ChannelSpec",
    "RemoveMessage",
    "StateSchema",
    "add_messages",
]

SchemaKind = Literal["typeddict", "pydantic", "dataclass"]
_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """One state key.

    Attributes:
        name: The key.
        annotation: Its type, without the reducer.
        reducer: ``reducer(current, update) -> new`` for reducer channels, else ``None``.
        default: A default value factory, when the schema declares one.
    """

    name: str
    annotation: Any
    reducer: Callable[[Any, Any], Any] | None
    default: Callable[[], Any] | None
    adapter: pydantic.TypeAdapter[Any] | None
    container: type | None
    batchable: bool = False
    """Whether several updates can be folded as one (the reducer concatenates)."""

    def concat(self, updates: Sequence[Any]) -> Any:
        """Several updates of a batchable channel as one update."""
        if self.container is str:
            return "".join(updates)
        if self.container is tuple:
            return tuple(x for u in updates for x in u)
        return [x for u in updates for x in (u if isinstance(u, list | tuple) else [u])]

    def fold(self, current: Any, updates: Sequence[tuple[str, Any]]) -> Any:
        """Fold one step's ``(node, update)`` pairs into ``current`` (which may be missing).

        The result is what :meth:`reduce` gives applied to each update in turn, as LangGraph
        does, and so is the error for an update the reducer refuses (it names that update's
        node). Where the reducer concatenates, the updates are joined and reduced once, so N
        updates cost O(len(current) + their size) instead of N copies of a growing value:
        ``operator.add`` on a list, tuple or str key when every value is exactly that type
        (``a + b + c == a + (b + c)`` there, and no subclass's ``__add__`` can differ), and
        reducers marked ``batchable`` such as :data:`add_messages`. A reducer of any other
        kind is called once per update, in order: nothing is assumed about it.
        """
        if len(updates) > 1:
            joined = self._join(current, [u for _, u in updates])
            if joined is not _MISSING:
                try:
                    return self.reduce(updates[-1][0], current, joined)
                except InvalidUpdateError:
                    pass  # fold one by one below, so the error names the update at fault
        for node, update in updates:
            current = self.reduce(node, current, update)
        return current

    def _join(self, current: Any, updates: list[Any]) -> Any:
        """``updates`` as one update that folds like them all, else ``_MISSING``."""
        if self.reducer is operator.add:
            kind = self.container
            if kind not in (list, tuple, str):
                return _MISSING
            if current is not _MISSING and type(current) is not kind:
                return _MISSING
            if any(type(u) is not kind for u in updates):
                return _MISSING
            if kind is str:
                return "".join(updates)
            joined = list(chain.from_iterable(updates))
            return joined if kind is list else tuple(joined)
        if self.batchable:
            return self.concat(updates)
        return _MISSING

    def check_value(self, node: str, value: Any) -> Any:
        """The value as validated against the declared type.

        Validation is strict (no ``"5"`` for an int), but a dict written to a model-typed key
        becomes the model, so the next node sees the declared type.

        Raises:
            InvalidUpdateError: if ``value`` does not fit the declared type.
        """
        if self.adapter is None:
            return value
        try:
            return self.adapter.validate_python(value, strict=True)
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            raise InvalidUpdateError(
                f"node {node!r} wrote {type(value).__name__} {_short(value)} to state key "
                f"{self.name!r}, which is declared {_type_name(self.annotation)}: "
                f"{first['msg']}. Return a value of the declared type.",
                node=node,
                key=self.name,
            ) from None

    def reduce(self, node: str, current: Any, update: Any) -> Any:
        """Fold ``update`` into ``current`` (``current`` may be missing)."""
        assert self.reducer is not None
        if current is _MISSING:
            if self.container is not None:
                try:
                    current = self.container()
                except TypeError:
                    return update
            else:
                return update
        try:
            result = self.reducer(current, update)
        except Exception as e:
            raise InvalidUpdateError(
                f"node {node!r}: the reducer of state key {self.name!r} failed on update "
                f"{_short(update)}: {e}",
                node=node,
                key=self.name,
            ) from e
        if self.container is not None and not isinstance(result, self.container):
            raise InvalidUpdateError(
                f"node {node!r}: reducing state key {self.name!r} produced "
                f"{type(result).__name__}, but the key is declared {_type_name(self.annotation)}",
                node=node,
                key=self.name,
            )
        return result


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp).replace("typing.", "")


def _split_annotated(tp: Any) -> tuple[Any, Callable[[Any, Any], Any] | None]:
    if get_origin(tp) is typing.Annotated:
        base, *extras = get_args(tp)
        reducers = [x for x in extras if callable(x)]
        return base, (reducers[-1] if reducers else None)
    return tp, None


def _container_of(tp: Any) -> type | None:
    origin = get_origin(tp) or tp
    if isinstance(origin, type) and origin in (list, dict, set, frozenset, tuple, str, int, float):
        return origin
    return None


class StateSchema:
    """A state schema analysed into channels.

    Args:
        schema: A ``TypedDict``, pydantic ``BaseModel`` or dataclass type.
        role: Used in error messages (``"state"``, ``"input"`` ...).
    """

    def __init__(self, schema: Any, *, role: str = "state") -> None:
        self.schema = schema
        kind: SchemaKind
        if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
            kind = "pydantic"
        elif isinstance(schema, type) and dataclasses.is_dataclass(schema):
            kind = "dataclass"
        elif is_typeddict(schema):
            kind = "typeddict"
        else:
            raise GraphBuildError(
                f"{role} schema {schema!r} is not a TypedDict, pydantic BaseModel or dataclass; "
                "declare the state as one of those"
            )
        self.kind: SchemaKind = kind
        try:
            hints = get_type_hints(schema, include_extras=True)
        except Exception as e:
            raise GraphBuildError(
                f"cannot resolve the type hints of {role} schema {schema.__name__}: {e}. "
                "Define every type it mentions at module level."
            ) from e
        defaults = self._defaults()
        channels: dict[str, ChannelSpec] = {}
        for name, tp in hints.items():
            if name.startswith("__"):
                raise GraphBuildError(f"state key {name!r} is reserved (keys may not start '__')")
            if kind == "pydantic" and name not in schema.model_fields:
                continue
            if kind == "dataclass" and name not in {f.name for f in dataclasses.fields(schema)}:
                continue
            base, reducer = _split_annotated(tp)
            adapter: pydantic.TypeAdapter[Any] | None = None
            if reducer is None and base is not Any:
                try:
                    adapter = pydantic.TypeAdapter(base)
                except Exception as e:
                    raise GraphBuildError(
                        f"state key {name!r}: type {_type_name(base)} is not supported by "
                        f"pydantic validation ({e})"
                    ) from e
            container = _container_of(base)
            batchable = bool(getattr(reducer, "batchable", False)) or (
                reducer is operator.add and container in (list, tuple, str)
            )
            channels[name] = ChannelSpec(
                name, base, reducer, defaults.get(name), adapter, container, batchable
            )
        self.channels = channels

    def _defaults(self) -> dict[str, Callable[[], Any]]:
        out: dict[str, Callable[[], Any]] = {}
        if self.kind == "pydantic":
            for name, info in self.schema.model_fields.items():
                if info.default_factory is not None:
                    out[name] = info.default_factory
                elif info.default is not pydantic_core_undefined():
                    out[name] = functools.partial(_copy_default, info.default)
        elif self.kind == "dataclass":
            for f in dataclasses.fields(self.schema):
                if f.default_factory is not dataclasses.MISSING:
                    out[f.name] = f.default_factory
                elif f.default is not dataclasses.MISSING:
                    out[f.name] = functools.partial(_copy_default, f.default)
        return out

    # -- values -----------------------------------------------------------------------------

    def initial_values(self) -> dict[str, Any]:
        """Values of the keys that declare defaults."""
        return {name: spec.default() for name, spec in self.channels.items() if spec.default}

    def to_node_input(self, values: Mapping[str, Any]) -> Any:
        """The state as a node receives it: a dict, a model instance or a dataclass instance.

        Top-level lists, dicts and sets are shallow copies, so a node that mutates them in place
        (instead of returning an update) cannot change the run's state behind the checkpoint's
        back. Nested objects are shared: treat the state as read-only and return updates.
        """
        values = {k: _detach(v) for k, v in values.items()}
        if self.kind == "typeddict":
            return values
        if self.kind == "pydantic":
            return self.schema.model_construct(**values)
        obj = object.__new__(self.schema)
        for f in dataclasses.fields(self.schema):
            if f.name in values:
                object.__setattr__(obj, f.name, values[f.name])
            elif f.default_factory is not dataclasses.MISSING:
                object.__setattr__(obj, f.name, f.default_factory())
            elif f.default is not dataclasses.MISSING:
                object.__setattr__(obj, f.name, f.default)
        return obj

    def coerce_update(self, node: str, update: Any) -> dict[str, Any]:
        """Turn what a node returned into ``{key: value}`` and check every key and type.

        Raises:
            InvalidUpdateError: naming the node and the key at fault.
        """
        if update is None:
            return {}
        if isinstance(update, Mapping):
            items = dict(update)
        elif self.kind == "pydantic" and isinstance(update, self.schema):
            items = {k: getattr(update, k) for k in update.model_fields_set}
        elif self.kind == "dataclass" and isinstance(update, self.schema):
            items = {f.name: getattr(update, f.name) for f in dataclasses.fields(self.schema)}
        else:
            raise InvalidUpdateError(
                f"node {node!r} returned {type(update).__name__} {_short(update)}; a node must "
                "return a dict of state keys, None, a Command, or a list of Send",
                node=node,
                key=None,
            )
        for key, value in items.items():
            spec = self.channels.get(key)
            if spec is None:
                known = ", ".join(sorted(self.channels)) or "(none)"
                raise InvalidUpdateError(
                    f"node {node!r} wrote unknown state key {key!r}; the state schema "
                    f"{self.schema.__name__} declares: {known}",
                    node=node,
                    key=str(key),
                )
            if spec.reducer is None:
                items[key] = spec.check_value(node, value)
                continue
            prepare = getattr(spec.reducer, "prepare", None)
            if prepare is not None:
                try:
                    items[key] = prepare(value)
                except Exception as e:
                    raise InvalidUpdateError(
                        f"node {node!r}: update {_short(value)} for state key {key!r} was "
                        f"refused by its reducer: {e}",
                        node=node,
                        key=str(key),
                    ) from e
        return items

    def fingerprint(self) -> str:
        """A stable description of keys, types and reducers."""
        parts = []
        for name, spec in sorted(self.channels.items()):
            reducer = "" if spec.reducer is None else _callable_name(spec.reducer)
            parts.append(f"{name}:{_type_name(spec.annotation)}:{reducer}")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _detach(value: Any) -> Any:
    cls = type(value)
    if cls is list:
        return list(value)
    if cls is dict:
        return dict(value)
    if cls is set:
        return set(value)
    return value


def pydantic_core_undefined() -> Any:
    """The sentinel pydantic uses for "no default"."""
    from pydantic_core import PydanticUndefined

    return PydanticUndefined


def _copy_default(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


def _callable_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


# -- messages ---------------------------------------------------------------------------------

REMOVE_ALL_MESSAGES = "__remove_all__"
"""``RemoveMessage(REMOVE_ALL_MESSAGES)`` clears the whole message list."""


@dataclass(frozen=True, slots=True)
class RemoveMessage:
    """An update for :func:`add_messages` that deletes the message with ``id``.

    Attributes:
        id: The message to remove, or :data:`REMOVE_ALL_MESSAGES`.
    """

    id: str


def _message_id(message: Any) -> str | None:
    # Called for every message of the history on every update: plain dicts and string ids (the
    # common case) skip the slow ABC isinstance check and str().
    if type(message) is dict:
        value = message.get("id")
    elif isinstance(message, Mapping):
        value = message.get("id")
    else:
        value = getattr(message, "id", None)
    if value is None or type(value) is str:
        return value
    return str(value)


def _with_id(message: Any) -> Any:
    if _message_id(message) is not None:
        return message
    new_id = uuid.uuid4().hex
    if isinstance(message, Mapping):
        return {**message, "id": new_id}
    if isinstance(message, pydantic.BaseModel):
        return message.model_copy(update={"id": new_id})
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return dataclasses.replace(message, id=new_id)
    raise TypeError(
        f"message {_short(message)} has no 'id' and graphexec cannot set one; use a dict, a "
        "pydantic model or a dataclass with an 'id' field"
    )


def _as_messages(update: Any) -> list[Any]:
    items: Sequence[Any] = (
        update if isinstance(update, list | tuple) and not _is_role_tuple(update) else [update]
    )
    out = []
    for item in items:
        if isinstance(item, str):
            out.append({"role": "user", "content": item})
        elif _is_role_tuple(item):
            out.append({"role": item[0], "content": item[1]})
        else:
            out.append(item)
    return out


def _is_role_tuple(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], str)
    )


def _id_index(messages: list[Any]) -> tuple[dict[str | None, int], bool]:
    """``{message id: position}`` (the last position for a repeated id); all plain dicts?

    Histories of plain dicts with string ids (the common case) are indexed by C-level
    ``map``/``zip``, about 5x faster than a per-message call.
    """
    if set(map(type, messages)) <= {dict}:
        index: dict[Any, int] = dict(zip(map(dict.get, messages, repeat("id")), count()))
        if set(map(type, index)) <= {str, NoneType}:
            return index, True
        return {_message_id(m): i for i, m in enumerate(messages)}, True
    return {_message_id(m): i for i, m in enumerate(messages)}, False


class _IdIndexes:
    """The id indexes of the message lists :data:`add_messages` returned lately.

    Building ``{id: position}`` from the whole history on every update made a long chat's turns
    slower with its length (about 80 µs at 1,000 messages, twice a turn). The list a reducer
    returns comes back as the next update's ``current``: the same object within a run, a shallow
    copy (the same message objects) in the next run, because values are detached between runs.
    So an index is found by ``(length, identity of the last message)`` and used only if
    ``current`` equals the private copy of the list it was built for, which costs a pointer
    comparison per message when they are the same objects. Only all-dict histories are kept:
    two equal dicts have equal ids, while other message types' ``__eq__`` is their own. Like all
    state, messages must not be mutated in place (see :func:`graphexec._checkpoint.detach`).

    Using an index hands it over (it is extended in place for the result), so two updates of
    one list never share it. At most ``size`` lists are kept (one per active thread, as many as
    the values cache keeps by default), least recently used go first; a kept copy keeps its
    messages alive until it goes.
    Thread-safe: graphs run on several event loops.
    """

    __slots__ = ("_items", "_lock", "_size")

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._items: dict[tuple[int, int], tuple[list[Any], dict[str | None, int]]] = {}
        self._lock = threading.Lock()

    def take(self, messages: list[Any]) -> dict[str | None, int] | None:
        """The index built for a list equal to ``messages``, now the caller's; else ``None``."""
        if not messages:
            return None
        with self._lock:
            item = self._items.pop((len(messages), id(messages[-1])), None)
        if item is None or item[0] != messages:
            return None
        return item[1]

    def keep(self, messages: list[Any], index: dict[str | None, int]) -> None:
        """Remember ``index`` as the index of (a copy of) ``messages``, all plain dicts."""
        if not messages:
            return
        key = (len(messages), id(messages[-1]))
        item = (list(messages), index)
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = item
            while len(self._items) > self._size:
                del self._items[next(iter(self._items))]


class _AddMessages:
    """Id-aware message reducer (see :data:`add_messages`)."""

    __qualname__ = "add_messages"
    batchable = True
    """Folding updates one by one equals folding their concatenation once."""

    def __init__(self) -> None:
        self._indexes = _IdIndexes()

    def prepare(self, update: Any) -> list[Any]:
        """Normalise an update and give every message an id before it is stored.

        Ids are assigned once, at write time, so folding stored updates is deterministic.
        """
        return [m if isinstance(m, RemoveMessage) else _with_id(m) for m in _as_messages(update)]

    def __call__(self, current: Sequence[Any] | None, update: Any) -> list[Any]:
        merged = list(current or [])
        index = self._indexes.take(merged)
        plain = index is not None
        if index is None:
            index, plain = _id_index(merged)
        for message in self.prepare(update):
            if isinstance(message, RemoveMessage):
                if message.id == REMOVE_ALL_MESSAGES:
                    merged, index, plain = [], {}, True
                    continue
                if message.id not in index:
                    raise ValueError(f"RemoveMessage: no message with id {message.id!r}")
                merged = [m for m in merged if _message_id(m) != message.id]
                index, plain = _id_index(merged)
                continue
            plain = plain and type(message) is dict
            mid = _message_id(message)
            if mid in index:
                merged[index[mid]] = message
            else:
                index[mid] = len(merged)
                merged.append(message)
        if plain:
            self._indexes.keep(merged, index)
        return merged


add_messages: _AddMessages = _AddMessages()
"""Reducer for chat messages: appends new messages, replaces one with the same ``id``.

Use as ``messages: Annotated[list[dict], add_messages]``. Messages are dicts (``role``,
``content``, optional ``id``) or objects with an ``id`` attribute; a bare string becomes a user
message and a ``(role, content)`` tuple a dict. Messages without an id get one when the update is
written, so replaying stored updates always yields the same list. ``RemoveMessage(id)`` deletes.
"""
