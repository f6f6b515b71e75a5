"""Checkpoint encoding: msgpack with a closed type registry.

Every value graphexec stores (channel values, pending writes, interrupt payloads) goes through a
:class:`Serializer`. The format is plain msgpack plus a handful of extension types, and the
design rule is security: **stored bytes never choose what code runs**. There is no pickle, and
nothing is imported or looked up by a name read from storage. A stored registered value carries
a name, but that name is only a key into the dictionary of classes *this process* registered
with :meth:`Serializer.register`; an unknown name is an error, never an import.

Supported without registration: ``None``, ``bool``, ``int`` (any size), ``float`` (including
NaN and infinities), ``str``, ``bytes``, ``list``, ``dict`` (any supported keys, insertion order
kept), ``tuple``, ``set``, ``frozenset``, :class:`datetime.datetime`, :class:`~datetime.date`,
:class:`~datetime.time`, :class:`~datetime.timedelta`, :class:`datetime.timezone`,
:class:`zoneinfo.ZoneInfo`, :class:`uuid.UUID` and :class:`decimal.Decimal`. Each comes back as
its exact type: a tuple stays a tuple, a frozenset a frozenset. ``bytearray`` and
``memoryview`` are written as (and read back as) ``bytes``.

Supported after registration: Enum classes, pydantic models, dataclasses, NamedTuples, and any
class given explicit ``encode``/``decode`` callables. :meth:`Serializer.register_schema` walks a
state schema's type hints and registers all of these it finds.

Types are matched exactly, never by ``isinstance``: a subclass of a registered or built-in type
must be registered on its own, so a value always decodes to the class it was written as.
(``msgpack.ExtType`` and ``msgpack.Timestamp`` objects are the exception: msgpack writes them
itself, so do not put them in state.)

Wire format: msgpack's native types for the native values. The other built-in and registered
types use the ``EXT_*`` extension codes below, in one of two shapes:

* *leaf* extensions carry the whole value in their payload (big ints, dates, timedeltas, UUIDs,
  Decimals, zone keys);
* *structured* values (tuples, sets, datetimes, registered classes, ...) are written as a msgpack
  array whose first element is a zero-length *marker* extension naming the type, followed by the
  parts, which are encoded like any other value.

Structured values never nest msgpack documents inside extension payloads, so one ``unpackb`` call
reads the whole value: stored bytes cannot drive decoding into deep C recursion (each nested
``unpackb`` would take about 40 KB of C stack, enough to crash a thread from a few hundred levels).
A marker found anywhere but at the head of an array makes the data corrupt.

Output is deterministic: equal values (dicts in the same insertion order) give equal bytes; sets
and frozensets are written in the sorted order of their elements' encoded bytes. Extension code
``-1`` is msgpack's reserved timestamp type; graphexec never writes it, and reads it as an aware
UTC :class:`~datetime.datetime`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import reprlib
import threading
import types
import typing
import uuid
import zoneinfo
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]
import pydantic

from graphexec._wire import (
    _FROZENSET,
    _LEAVES,
    _MARKERS,
    _REGISTERED,
    _SET,
    EXT_BIGINT,
    EXT_DATE,
    EXT_DATETIME,
    EXT_DECIMAL,
    EXT_FROZENSET,
    EXT_REGISTERED,
    EXT_SET,
    EXT_TIME,
    EXT_TIMEDELTA,
    EXT_TIMEZONE,
    EXT_TUPLE,
    EXT_UUID,
    EXT_ZONEINFO,
    _Corrupt,
    _dataclass_build,
    _dataclass_fields,
    _dec_datetime,
    _dec_frozenset,
    _dec_set,
    _dec_time,
    _dec_timezone,
    _dec_tuple,
    _enc_bigint,
    _enc_date,
    _enc_datetime,
    _enc_decimal,
    _enc_time,
    _enc_timedelta,
    _enc_timezone,
    _enc_tuple,
    _enc_uuid,
    _enc_zoneinfo,
    _enum_value,
    _for_channel,
    _Marker,
    _model_fields,
    _model_validate,
    _namedtuple_build,
    _root_value,
    _short,
    _type_name,
    _Unsupported,
    known_zones,
)
from graphexec.errors import DeserializationError, SerializationError

__all__ = [
    "EXT_BIGINT",
    "EXT_DATE",
    "EXT_DATETIME",
    "EXT_DECIMAL",
    "EXT_FROZENSET",
    "EXT_REGISTERED",
    "EXT_SET",
    "EXT_TIME",
    "EXT_TIMEDELTA",
    "EXT_TIMEZONE",
    "EXT_TUPLE",
    "EXT_UUID",
    "EXT_ZONEINFO",
    "MAX_BYTES",
    "Serializer",
    "default_serializer",
    "known_zones",
]

MAX_BYTES: Final = 512 * 1024 * 1024
"""Default limit on one encoded value (512 MiB): below what SQLite (1 GB per blob by default)
and PostgreSQL (1 GB per ``bytea``) accept, so an oversized value fails at write time with a
:class:`~graphexec.errors.SerializationError` naming its channel, not as a driver error."""

_Children = Callable[[Any], Iterable[tuple[str, Any]]]

# Exact types with a built-in encoding; registering one of them is refused.
_BUILTIN_TYPES: Final = frozenset(
    {
        type(None),
        bool,
        int,
        float,
        str,
        bytes,
        bytearray,
        memoryview,
        list,
        dict,
        tuple,
        set,
        frozenset,
        dt.datetime,
        dt.date,
        dt.time,
        dt.timedelta,
        dt.timezone,
        zoneinfo.ZoneInfo,
        uuid.UUID,
        decimal.Decimal,
    }
)


class _ThreadState(threading.local):
    packer: Any = None
    """This thread's idle top-level Packer (None while in use or not yet made)."""
    markers: int = 0
    """Markers decoded minus markers consumed at the head of an array, in this thread."""
    hashed: int = 0
    """Collision-prone hashable values decoded so far by this thread's current fast decode."""
    checked: bool = False
    """True while this thread decodes with hash-collision checks (see :data:`_HASHED_LIMIT`)."""


_HASHED_LIMIT: Final = 256
"""Collision-prone values (big ints, Decimals, UUIDs, tuples, frozensets, hashable registered
instances) one value may hold before it is decoded again with collision checks.

Their hashes are not randomised (an int hashes to itself mod 2**61 - 1, a tuple by a fixed mix
of its items' hashes), so a crafted payload can make every set member or map key collide and
each insertion compare with all the earlier ones: seconds for a megabyte, minutes for four.
Below the limit that costs at most ``_HASHED_LIMIT**2 / 2`` comparisons; above it, the second
decode counts each container's hash collisions before building it."""

_COLLISION_LIMIT: Final = 64
"""Equal hashes (of unequal keys) tolerated in one set or map before it is refused."""


class _Rehash(Exception):
    """Raised by the fast decode when a value holds too many collision-prone values."""


def _check_collisions(items: Iterable[Any], count: int, what: str) -> None:
    # Equal full hashes are the only case in which a dict or set compares keys, so distinct
    # hashes bound the build to linear time. hash() of an int hash is bounded in collisions.
    distinct = len({hash(item) for item in items})
    if count - distinct > _COLLISION_LIMIT:
        raise _Corrupt(
            f"{count - distinct} of the {count} {what} have colliding hashes (more than "
            f"{_COLLISION_LIMIT}); this is crafted data, not something dumps() writes"
        )


def _checked_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    _check_collisions((key for key, _ in pairs), len(pairs), "map keys")
    return dict(pairs)


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    """How one registered class is encoded and decoded."""

    cls: type
    name: str
    to_data: Callable[[Any], Any]
    from_data: Callable[[Any], Any]
    children: _Children
    """Yields ``(path_suffix, child)`` pairs; used only to locate a failing value in errors."""
    explicit: tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]


def _is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _is_typeddict(cls: type) -> bool:
    # Duck-typed so it also recognises typing_extensions.TypedDict classes.
    return issubclass(cls, dict) and hasattr(cls, "__required_keys__")


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:
        # Unresolvable forward references (e.g. classes local to a function): keep what is
        # already evaluated. Types only reachable through a string hint must be registered
        # explicitly; dumps() names them if they are not.
        raw = getattr(cls, "__annotations__", {})
        return {k: v for k, v in raw.items() if not isinstance(v, str)}


class Serializer:
    """Encodes values to msgpack bytes and back, constructing only types it was told about.

    A Serializer is safe to share between threads once its types are registered. Register every
    type before the first :meth:`dumps`/:meth:`loads`: the registry is not locked.

    Example:
        A Serializer for a graph whose state schema is ``MyState``::

            serde = Serializer()
            serde.register_schema(MyState)
            blob = serde.dumps(state["notes"], channel="notes")
            assert serde.loads(blob, channel="notes") == state["notes"]
    """

    def __init__(self, types: Iterable[type] = (), *, max_bytes: int | None = MAX_BYTES) -> None:
        """Create a Serializer knowing the built-in types plus ``types``.

        Args:
            types: Classes to :meth:`register` under their default names.
            max_bytes: Largest encoding :meth:`dumps` produces; a bigger value raises
                :class:`~graphexec.errors.SerializationError`. ``None``: no limit. Settable
                later through the :attr:`max_bytes` attribute (e.g. ``graph.serde.max_bytes``).
        """
        if max_bytes is not None and (isinstance(max_bytes, bool) or max_bytes < 1):
            raise ValueError(f"max_bytes must be a positive int or None, got {max_bytes!r}")
        self.max_bytes = max_bytes
        """Largest encoding :meth:`dumps` produces (``None``: no limit)."""
        self._by_type: dict[type, _Entry] = {}
        self._by_name: dict[str, _Entry] = {}
        self._local = _ThreadState()
        self._encoders: dict[type, Callable[[Any], Any]] = {
            int: _enc_bigint,
            tuple: _enc_tuple,
            set: self._enc_set,
            frozenset: self._enc_frozenset,
            dt.datetime: _enc_datetime,
            dt.date: _enc_date,
            dt.time: _enc_time,
            dt.timedelta: _enc_timedelta,
            dt.timezone: _enc_timezone,
            zoneinfo.ZoneInfo: _enc_zoneinfo,
            uuid.UUID: _enc_uuid,
            decimal.Decimal: _enc_decimal,
        }
        self._structured: dict[int, Callable[[list[Any]], Any]] = {
            EXT_TUPLE: _dec_tuple,
            EXT_SET: _dec_set,
            EXT_FROZENSET: _dec_frozenset,
            EXT_DATETIME: _dec_datetime,
            EXT_TIME: _dec_time,
            EXT_TIMEZONE: _dec_timezone,
            EXT_REGISTERED: self._dec_registered,
        }
        for cls in types:
            self.register(cls)

    # -- registry ---------------------------------------------------------------------------

    def register(
        self,
        cls: type,
        *,
        name: str | None = None,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
    ) -> None:
        """Allow instances of exactly ``cls`` to be stored and read back.

        Without ``encode``/``decode``, ``cls`` must be an Enum (stored by value), a pydantic model
        (its fields, read back with ``model_validate``), a dataclass (its fields, read back with
        ``cls(**init_fields)``; ``init=False`` fields are set afterwards) or a NamedTuple. Any
        other class needs both callables: ``encode(obj)`` returns a value this Serializer can
        store (it may contain other registered types) and ``decode(data)`` rebuilds the object.

        Registering the same class under the same name and codec again does nothing.

        Args:
            cls: The class. Subclasses are not covered; register them separately.
            name: The name written to storage. Defaults to ``"module.QualName"``. It is only a key
                into this registry; renaming a class while keeping ``name`` keeps old data
                readable.
            encode: Turns an instance into storable data. Requires ``decode``.
            decode: Turns that data back into an instance. Requires ``encode``.

        Raises:
            TypeError: ``cls`` is not a class, only one of ``encode``/``decode`` was given, or
                ``cls`` is not a supported kind and has no codec.
            ValueError: ``cls`` is built in, ``name`` is taken by a different class, or ``cls``
                is already registered under another name or codec.
        """
        if not isinstance(cls, type):
            raise TypeError(f"Serializer.register() expects a class, got {cls!r}")
        if (encode is None) != (decode is None):
            raise TypeError(
                f"cannot register {_type_name(cls)}: pass both encode= and decode=, or neither"
            )
        if cls in _BUILTIN_TYPES:
            raise ValueError(f"{_type_name(cls)} is built in; it needs no registration")
        reg_name = _type_name(cls) if name is None else name
        if not isinstance(reg_name, str) or not reg_name:
            raise ValueError(f"cannot register {_type_name(cls)}: name must be a non-empty str")
        taken = self._by_name.get(reg_name)
        if taken is not None and taken.cls is not cls:
            same = " (a different class with the same qualified name)"
            raise ValueError(
                f"cannot register {_type_name(cls)} as {reg_name!r}: that name is already "
                f"registered for {_type_name(taken.cls)}"
                f"{same if _type_name(taken.cls) == _type_name(cls) else ''}; pass name= to "
                "register one of them under a different name"
            )
        previous = self._by_type.get(cls)
        if previous is not None:
            if previous.name == reg_name and previous.explicit == (encode, decode):
                return
            raise ValueError(
                f"{_type_name(cls)} is already registered as {previous.name!r}"
                f"{' with a different codec' if previous.name == reg_name else ''}; "
                "a class can be registered only once"
            )
        entry = self._make_entry(cls, reg_name, encode, decode)
        to_data = entry.to_data

        def encoder(obj: Any) -> Any:
            return [_REGISTERED, reg_name, to_data(obj)]

        self._by_type[cls] = entry
        self._by_name[reg_name] = entry
        self._encoders[cls] = encoder

    def register_schema(self, schema: Any) -> None:
        """Register every Enum, pydantic model, dataclass and NamedTuple a state schema uses.

        Walks the type hints of ``schema`` (a TypedDict, pydantic model or dataclass class, or
        any type hint) recursively, through ``Annotated``, ``Optional``/unions, ``list``,
        ``dict``, ``tuple``, ``set``, generic aliases, ``Literal`` enum members and nested
        classes. Nested TypedDicts are walked but not registered (their values are plain dicts).
        Recursive models are fine. Classes already registered (under any name) are left as they
        are.

        Args:
            schema: The state schema or type hint to walk.

        Raises:
            ValueError: A class found conflicts with an existing registration (see
                :meth:`register`).
        """
        self._walk(schema, set())

    def fingerprint_types(self) -> list[str]:
        """Return the registered names, sorted; used in graph fingerprints.

        Returns:
            The names of all registered classes (built-in types are not listed).
        """
        return sorted(self._by_name)

    def _make_entry(
        self,
        cls: type,
        name: str,
        encode: Callable[[Any], Any] | None,
        decode: Callable[[Any], Any] | None,
    ) -> _Entry:
        explicit = (encode, decode)
        if encode is not None and decode is not None:
            return _Entry(cls, name, encode, decode, lambda o: [("", encode(o))], explicit)
        if issubclass(cls, enum.Enum):
            return _Entry(cls, name, _enum_value, cls, lambda o: [(".value", o.value)], explicit)
        if issubclass(cls, pydantic.RootModel):
            return _Entry(
                cls,
                name,
                _root_value,
                cls.model_validate,
                lambda o: [(".root", o.root)],
                explicit,
            )
        if issubclass(cls, pydantic.BaseModel):
            to_data = functools.partial(_model_fields, tuple(cls.model_fields))
            return _Entry(
                cls,
                name,
                to_data,
                functools.partial(_model_validate, cls),
                lambda o: [(f".{k}", v) for k, v in to_data(o).items()],
                explicit,
            )
        if dataclasses.is_dataclass(cls):
            fields = dataclasses.fields(cls)
            names = tuple(f.name for f in fields)
            init = frozenset(f.name for f in fields if f.init)
            after = frozenset(f.name for f in fields if not f.init)
            to_data = functools.partial(_dataclass_fields, names)
            return _Entry(
                cls,
                name,
                to_data,
                functools.partial(_dataclass_build, cls, init, after),
                lambda o: [(f".{k}", v) for k, v in to_data(o).items()],
                explicit,
            )
        if _is_namedtuple(cls):
            field_names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
            return _Entry(
                cls,
                name,
                list,
                functools.partial(_namedtuple_build, cls),
                lambda o: [(f".{k}", v) for k, v in zip(field_names, o, strict=True)],
                explicit,
            )
        raise TypeError(
            f"cannot register {_type_name(cls)} without encode= and decode=: it is not an Enum, "
            "pydantic model, dataclass or NamedTuple"
        )

    def _walk(self, hint: Any, seen: set[Any]) -> None:
        if hint is None or hint is Ellipsis or isinstance(hint, (str, typing.ForwardRef)):
            return
        origin = typing.get_origin(hint)
        if origin is not None:
            args = typing.get_args(hint)
            if origin is typing.Annotated:
                self._walk(args[0], seen)
            elif origin is typing.Literal:
                for arg in args:
                    if isinstance(arg, enum.Enum):
                        self._walk(type(arg), seen)
            else:
                self._walk(origin, seen)  # e.g. a generic dataclass: Box[int] -> Box
                for arg in args:
                    for item in arg if isinstance(arg, list) else (arg,):  # Callable[[A], B]
                        self._walk(item, seen)
            return
        if isinstance(hint, typing.TypeVar):
            for bound in (hint.__bound__, *hint.__constraints__):
                self._walk(bound, seen)
            return
        supertype = getattr(hint, "__supertype__", None)  # typing.NewType
        if supertype is not None:
            self._walk(supertype, seen)
            return
        if not isinstance(hint, type) or hint in seen:
            return
        seen.add(hint)
        if _is_typeddict(hint):
            for sub in _type_hints(hint).values():
                self._walk(sub, seen)
        elif issubclass(hint, enum.Enum):
            self._ensure(hint)
        elif issubclass(hint, pydantic.BaseModel):
            if hint is pydantic.BaseModel or hint is pydantic.RootModel:
                return
            self._ensure(hint)
            for field in hint.model_fields.values():
                self._walk(field.annotation, seen)
        elif dataclasses.is_dataclass(hint):
            self._ensure(hint)
            hints = _type_hints(hint)
            for f in dataclasses.fields(hint):
                self._walk(hints.get(f.name, f.type), seen)
        elif _is_namedtuple(hint) and hint is not tuple:
            self._ensure(hint)
            for sub in _type_hints(hint).values():
                self._walk(sub, seen)

    def _ensure(self, cls: type) -> None:
        if cls not in self._by_type:
            self.register(cls)

    # -- encoding ---------------------------------------------------------------------------

    def dumps(self, value: Any, *, channel: str | None = None) -> bytes:
        """Encode ``value`` to bytes.

        Args:
            value: The value to store.
            channel: The state key (channel) or write the value belongs to; used in errors.

        Returns:
            The msgpack bytes. Equal values give equal bytes.

        Raises:
            SerializationError: ``value`` contains an unregistered or unsupported type (the
                message names the channel, the type and where in the value it sits), nests too
                deeply, contains a reference cycle, a custom ``encode`` failed, or its encoding
                is larger than :attr:`max_bytes`.
        """
        # One Packer per thread, reused: cheaper than msgpack.packb() building one per call. It
        # is taken out of its slot while in use, so a re-entrant dumps() (a custom encode calling
        # dumps on this Serializer) makes its own.
        state = self._local
        packer = state.packer
        if packer is None:
            packer = msgpack.Packer(
                default=self._default, strict_types=True, use_bin_type=True, datetime=False
            )
        else:
            state.packer = None
        try:
            # Packing [value] and dropping the 1-byte array header makes msgpack's nesting limit
            # one level tighter for the value, so dumps() never writes anything nested deeper
            # than the unpacker's fixed-size stack (1024 containers) can read back.
            out: bytes = packer.pack([value])[1:]
        except _Unsupported as e:
            raise self._unsupported_error(value, e, channel) from None
        except Exception as e:
            raise self._failed_error(value, e, channel) from e
        finally:
            state.packer = packer  # pack() resets its buffer on errors too
        limit = self.max_bytes
        if limit is not None and len(out) > limit:
            raise SerializationError(
                f"cannot serialize value{_for_channel(channel)}: its encoding is {len(out)} "
                f"bytes, over the limit of {limit} bytes (Serializer.max_bytes); keep large "
                "data outside the state (a file or object store) and store a reference, or "
                "raise the limit (graph.serde.max_bytes = ...)",
                channel=channel,
                type_name=_type_name(type(value)),
            )
        return out

    def _default(self, obj: Any) -> Any:
        # msgpack calls this for every value it does not pack natively (with strict_types, that
        # includes tuples and subclasses of native types). It returns a leaf ExtType, or a
        # marker-headed list whose parts msgpack then packs in the same pass.
        encoder = self._encoders.get(type(obj))
        if encoder is None:
            raise _Unsupported(obj)
        return encoder(obj)

    def _sort_key(self, obj: Any) -> bytes:
        return msgpack.packb(  # type: ignore[no-any-return]
            obj, default=self._default, strict_types=True, use_bin_type=True, datetime=False
        )

    def _enc_set(self, obj: set[Any]) -> list[Any]:
        return [_SET, *(sorted(obj, key=self._sort_key) if len(obj) > 1 else obj)]

    def _enc_frozenset(self, obj: frozenset[Any]) -> list[Any]:
        return [_FROZENSET, *(sorted(obj, key=self._sort_key) if len(obj) > 1 else obj)]

    def _unsupported_error(
        self, value: Any, exc: _Unsupported, channel: str | None
    ) -> SerializationError:
        obj = exc.obj
        cls = type(obj)
        type_name = _type_name(cls)
        root = channel if channel else "value"
        path = self._locate(value, obj, root)
        where = f" at {path}" if path is not None and path != root else ""
        problem = exc.reason if exc.reason is not None else self._problem(obj, type_name)
        return SerializationError(
            f"cannot serialize value{_for_channel(channel)}{where}: {problem}",
            channel=channel,
            type_name=type_name,
        )

    def _problem(self, obj: Any, type_name: str) -> str:
        cls = type(obj)
        unregistered = f"type {type_name!r} is not registered; "
        if isinstance(
            obj,
            (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial),
        ):
            return f"{type_name!r} values (functions) cannot be stored in state; store data instead"
        if (
            issubclass(cls, (enum.Enum, pydantic.BaseModel))
            or dataclasses.is_dataclass(cls)
            or _is_namedtuple(cls)
        ):
            return unregistered + (
                f"register it with Serializer.register({cls.__name__}) or use it in the state "
                "schema's type hints"
            )
        for base in cls.__mro__[1:]:
            if base in _BUILTIN_TYPES:
                return unregistered + (
                    f"subclasses of {_type_name(base)} are not stored as such; convert it to a "
                    f"plain {_type_name(base)} or register it with "
                    f"Serializer.register({cls.__name__}, encode=..., decode=...)"
                )
        return unregistered + (
            f"register it with Serializer.register({cls.__name__}, encode=..., decode=...) or use "
            "a pydantic model/dataclass in the state schema"
        )

    def _failed_error(self, value: Any, exc: Exception, channel: str | None) -> SerializationError:
        if isinstance(exc, RecursionError) or (
            isinstance(exc, ValueError) and "recursion limit" in str(exc)
        ):
            problem = "the value nests too deeply or contains a reference cycle"
        else:
            problem = f"{type(exc).__name__}: {exc}"
        return SerializationError(
            f"cannot serialize value{_for_channel(channel)}: {problem}",
            channel=channel,
            type_name=_type_name(type(value)),
        )

    def _locate(self, value: Any, target: Any, root: str) -> str | None:
        """Find the path to ``target`` inside ``value`` (error path only, so it may be slow)."""
        seen: set[int] = set()
        short = reprlib.Repr()
        short.maxstring = short.maxother = 40

        def walk(obj: Any, path: str) -> str | None:
            if obj is target:
                return path
            cls = type(obj)
            children: Iterable[tuple[str, Any]]
            if cls is list or cls is tuple:
                children = ((f"[{i}]", item) for i, item in enumerate(obj))
            elif cls is dict:
                children = (
                    pair
                    for k, v in obj.items()
                    for pair in ((f"<key {short.repr(k)}>", k), (f"[{short.repr(k)}]", v))
                )
            elif cls is set or cls is frozenset:
                children = (("<element>", item) for item in obj)
            elif cls is dt.datetime or cls is dt.time:
                children = ((".tzinfo", obj.tzinfo),)
            elif cls in self._by_type:
                children = self._by_type[cls].children(obj)
            else:
                return None
            if id(obj) in seen:
                return None
            seen.add(id(obj))
            for suffix, child in children:
                found = walk(child, path + suffix)
                if found is not None:
                    return found
            return None

        try:
            return walk(value, root)
        except Exception:  # a custom encode failing, a very deep value: give up on the path
            return None

    # -- decoding ---------------------------------------------------------------------------

    def loads(self, data: bytes, *, channel: str | None = None) -> Any:
        """Decode bytes written by :meth:`dumps`.

        Only built-in types and classes registered with this Serializer are ever constructed;
        names in the data are looked up in this Serializer's registry and nowhere else.

        Args:
            data: The bytes (``bytes``, ``bytearray`` or ``memoryview``).
            channel: The state key (channel) or write being decoded; used in errors.

        Returns:
            The decoded value. Never ``None`` as a stand-in for failure.

        Raises:
            DeserializationError: The bytes are corrupt, truncated, followed by trailing bytes,
                use an unknown extension code, or name a class this Serializer has not
                registered (or whose decoding failed). The cause is chained.
            TypeError: ``data`` is not bytes-like.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"Serializer.loads() expects bytes, got {type(data).__name__}")
        state = self._local
        before = state.markers
        hashed, checked = state.hashed, state.checked
        try:
            state.hashed = 0
            try:
                value = self._unpack(data, checked=checked)
            except _Rehash:
                # Too many collision-prone values for the fast path: decode again, counting
                # the hash collisions of every set and map before it is built.
                state.markers = before
                state.checked = True
                value = self._unpack(data, checked=True)
            if state.markers != before:
                raise _Corrupt("a type marker is not at the head of an array")
        except Exception as e:
            state.markers = before
            if isinstance(e, _Corrupt):
                problem = str(e)
            elif isinstance(e, msgpack.ExtraData):
                problem = "unexpected bytes after the encoded value"
            elif isinstance(e, ValueError) and "incomplete input" in str(e):
                problem = "the data is truncated"
            else:
                detail = f": {e}" if str(e) else ""
                problem = f"the data is corrupt ({type(e).__name__}{detail})"
            raise DeserializationError(
                f"cannot deserialize value{_for_channel(channel)}: {problem}", channel=channel
            ) from e
        finally:
            state.hashed, state.checked = hashed, checked
        return value

    def _unpack(self, data: bytes, *, checked: bool) -> Any:
        return msgpack.unpackb(
            data,
            ext_hook=self._ext_hook,
            list_hook=self._list_hook,
            # Only on the checked path: a Python call per map costs the fast path too much.
            object_pairs_hook=_checked_dict if checked else None,
            raw=False,
            strict_map_key=False,
            # msgpack decodes its reserved ext -1 itself (no hook runs): make it an aware UTC
            # datetime, a type we support anyway, rather than a msgpack.Timestamp.
            timestamp=3,
        )

    def _count_hashed(self) -> None:
        state = self._local
        state.hashed += 1
        if state.hashed > _HASHED_LIMIT and not state.checked:
            raise _Rehash

    def _ext_hook(self, code: int, data: bytes) -> Any:
        marker = _MARKERS.get(code)
        if marker is not None:
            if data:
                raise _Corrupt(f"marker extension {code} has a payload")
            self._local.markers += 1
            return marker
        leaf = _LEAVES.get(code)
        if leaf is None:
            raise _Corrupt(f"unknown extension type code {code}")
        if code in _HASHED_LEAVES:
            self._count_hashed()
        return leaf(data)

    def _list_hook(self, items: list[Any]) -> Any:
        # Called by msgpack for every array, innermost first, so parts are already decoded.
        if not items or type(items[0]) is not _Marker:
            return items
        state = self._local
        state.markers -= 1
        code = items[0].code
        if code in _HASHED_ARRAYS:
            if state.checked and code != EXT_TUPLE:
                _check_collisions(items[1:], len(items) - 1, "set members")
            if code != EXT_SET:
                self._count_hashed()
        return self._structured[code](items)

    def _dec_registered(self, items: list[Any]) -> Any:
        _, name, data = items
        entry = self._by_name.get(name) if type(name) is str else None
        if entry is None:
            raise _Corrupt(
                f"type {_short(name)} is not registered with this Serializer; register the class "
                "under that name (Serializer.register(cls, name=...)) or add it to the state schema"
            )
        if entry.cls.__hash__ not in _IDENTITY_HASHES:  # hashes by value: may be a crafted key
            self._count_hashed()
        return entry.from_data(data)


_HASHED_LEAVES: Final = frozenset({EXT_BIGINT, EXT_DECIMAL, EXT_UUID})
"""Leaf extensions whose hashes a payload can make collide (a UUID hashes as its int)."""
_HASHED_ARRAYS: Final = frozenset({EXT_TUPLE, EXT_SET, EXT_FROZENSET})
"""Structured types that are collision-prone keys (tuples, frozensets) or build a set."""
_IDENTITY_HASHES: Final[tuple[Any, ...]] = (None, object.__hash__)
"""``__hash__`` of unhashable classes and of classes hashing by identity (never collide)."""


def default_serializer() -> Serializer:
    """Return a new Serializer that knows only the built-in types.

    Returns:
        A fresh :class:`Serializer`; register state schema types on it before use.
    """
    return Serializer()
