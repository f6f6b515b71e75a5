"""The stored format's extension codes, and the codecs of built-in types and registered classes.

:class:`~graphexec._serde.Serializer` (whose docstring describes the wire format as a whole)
plugs these into msgpack's hooks. Everything here is part of the stored format: an extension
code is never renumbered or reused, and a codec's payload layout never changes.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import functools
import os
import reprlib
import struct
import uuid
import zoneinfo
from collections.abc import Callable
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]
import pydantic

from graphexec.errors import DeserializationError

# Extension type codes. These are part of the stored format: never renumber or reuse one.
EXT_BIGINT: Final = 1
"""Leaf: an ``int`` outside msgpack's range (below -2**63 or above 2**64 - 1).

Payload: the value's signed, big-endian two's-complement bytes."""
EXT_TUPLE: Final = 2
"""Marker: ``[EXT_TUPLE, *items]`` is a ``tuple``."""
EXT_SET: Final = 3
"""Marker: ``[EXT_SET, *items]`` is a ``set``; items sorted by their encoded bytes."""
EXT_FROZENSET: Final = 4
"""Marker: ``[EXT_FROZENSET, *items]`` is a ``frozenset``; items sorted as for :data:`EXT_SET`."""
EXT_DATETIME: Final = 5
"""Marker: a :class:`datetime.datetime`.

``[EXT_DATETIME, year, month, day, hour, minute, second, microsecond, fold, tzinfo]``, where
``tzinfo`` is nil (naive) or an encoded tzinfo value (:data:`EXT_TIMEZONE`, :data:`EXT_ZONEINFO`
or an instance of a registered tzinfo class)."""
EXT_DATE: Final = 6
"""Leaf: a :class:`datetime.date`. Payload: its proleptic Gregorian ordinal, 4 bytes big-endian."""
EXT_TIME: Final = 7
"""Marker: ``[EXT_TIME, hour, minute, second, microsecond, fold, tzinfo]``, a
:class:`datetime.time`."""
EXT_TIMEDELTA: Final = 8
"""Leaf: a :class:`datetime.timedelta`.

Payload: days (int32), seconds (uint32) and microseconds (uint32), big-endian."""
EXT_UUID: Final = 9
"""Leaf: a :class:`uuid.UUID`. Payload: its 16 raw bytes."""
EXT_DECIMAL: Final = 10
"""Leaf: a :class:`decimal.Decimal`. Payload: ``str(value)`` in ASCII (exact, NaN and Infinity
too)."""
EXT_TIMEZONE: Final = 11
"""Marker: ``[EXT_TIMEZONE, offset_in_microseconds, name]``, a fixed-offset
:class:`datetime.timezone`; ``name`` is nil unless one was given explicitly."""
EXT_ZONEINFO: Final = 12
"""Leaf: a :class:`zoneinfo.ZoneInfo`. Payload: its key (e.g. ``Europe/Paris``) in UTF-8."""
EXT_REGISTERED: Final = 13
"""Marker: ``[EXT_REGISTERED, registered_name, data]``, an instance of a registered class.

``data`` is the class's encoded form: the field dict of a pydantic model or dataclass, the value
of an Enum member, the item list of a NamedTuple, or whatever a custom ``encode`` returned. On
read, ``registered_name`` is looked up in the reading Serializer's own registry only."""


_ONE_MICROSECOND: Final = dt.timedelta(microseconds=1)
_TIMEDELTA: Final = struct.Struct(">iII")
_DATE: Final = struct.Struct(">I")


class _Marker:
    """What the decoder's ext hook returns for a marker extension; never escapes :meth:`loads`."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code


_MARKER_CODES: Final = (
    EXT_TUPLE,
    EXT_SET,
    EXT_FROZENSET,
    EXT_DATETIME,
    EXT_TIME,
    EXT_TIMEZONE,
    EXT_REGISTERED,
)
# Written by the encoder (msgpack packs ExtType natively) ...
_TUPLE: Final = msgpack.ExtType(EXT_TUPLE, b"")
_SET: Final = msgpack.ExtType(EXT_SET, b"")
_FROZENSET: Final = msgpack.ExtType(EXT_FROZENSET, b"")
_DATETIME: Final = msgpack.ExtType(EXT_DATETIME, b"")
_TIME: Final = msgpack.ExtType(EXT_TIME, b"")
_TIMEZONE: Final = msgpack.ExtType(EXT_TIMEZONE, b"")
_REGISTERED: Final = msgpack.ExtType(EXT_REGISTERED, b"")
# ... and read back as these singletons, which the list hook recognises by identity of type.
_MARKERS: Final = {code: _Marker(code) for code in _MARKER_CODES}


class _Unsupported(Exception):
    """Raised by the encoder's ``default`` hook; :meth:`Serializer.dumps` reports it."""

    def __init__(self, obj: Any, reason: str | None = None) -> None:
        super().__init__(obj)
        self.obj = obj
        self.reason = reason


class _Corrupt(Exception):
    """Raised by decoding hooks; :meth:`Serializer.loads` reports it."""


def _type_name(cls: type) -> str:
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


# -- built-in codecs -------------------------------------------------------------------------


def _enc_bigint(obj: int) -> Any:
    # Only reached for ints outside the 64-bit range: msgpack packs the others natively.
    return msgpack.ExtType(
        EXT_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)
    )


def _enc_tuple(obj: tuple[Any, ...]) -> list[Any]:
    return [_TUPLE, *obj]


def _enc_datetime(obj: dt.datetime) -> list[Any]:
    return [
        _DATETIME,
        obj.year,
        obj.month,
        obj.day,
        obj.hour,
        obj.minute,
        obj.second,
        obj.microsecond,
        obj.fold,
        obj.tzinfo,
    ]


def _enc_date(obj: dt.date) -> Any:
    return msgpack.ExtType(EXT_DATE, _DATE.pack(obj.toordinal()))


def _enc_time(obj: dt.time) -> list[Any]:
    return [_TIME, obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold, obj.tzinfo]


def _enc_timedelta(obj: dt.timedelta) -> Any:
    return msgpack.ExtType(EXT_TIMEDELTA, _TIMEDELTA.pack(obj.days, obj.seconds, obj.microseconds))


def _enc_timezone(obj: dt.timezone) -> list[Any]:
    offset = obj.utcoffset(None)
    name: str | None = obj.tzname(None)
    if name == dt.timezone(offset).tzname(None):
        name = None  # the default "UTC+01:00"-style name: not worth storing
    return [_TIMEZONE, offset // _ONE_MICROSECOND, name]


def _enc_zoneinfo(obj: zoneinfo.ZoneInfo) -> Any:
    if obj.key is None:
        raise _Unsupported(obj, "a ZoneInfo loaded from a file has no key; use ZoneInfo(key)")
    return msgpack.ExtType(EXT_ZONEINFO, obj.key.encode("utf-8"))


def _enc_uuid(obj: uuid.UUID) -> Any:
    return msgpack.ExtType(EXT_UUID, obj.bytes)


def _enc_decimal(obj: decimal.Decimal) -> Any:
    return msgpack.ExtType(EXT_DECIMAL, str(obj).encode("ascii"))


def _dec_bigint(data: bytes) -> int:
    value = int.from_bytes(data, "big", signed=True)
    # Only what _enc_bigint writes: a value msgpack cannot hold natively, in its shortest form.
    # Anything else is not data this library wrote (e.g. another framework's extension 1).
    if -(2**63) <= value <= 2**64 - 1 or len(data) != (value.bit_length() + 8) // 8:
        raise _Corrupt("malformed big-int payload (not in the form graphexec writes)")
    return value


def _dec_date(data: bytes) -> dt.date:
    (ordinal,) = _DATE.unpack(data)
    return dt.date.fromordinal(ordinal)


def _dec_timedelta(data: bytes) -> dt.timedelta:
    days, seconds, microseconds = _TIMEDELTA.unpack(data)
    return dt.timedelta(days=days, seconds=seconds, microseconds=microseconds)


@functools.cache
def known_zones() -> frozenset[str]:
    """The IANA zone keys this machine has (system database and the ``tzdata`` package)."""
    return frozenset(zoneinfo.available_timezones())


def _dec_zoneinfo(data: bytes) -> zoneinfo.ZoneInfo:
    # Only keys of the installed IANA database: ZoneInfo falls back to importing the package
    # ``tzdata.zoneinfo.<key parts>``, and a stored key must never choose what is imported.
    key = data.decode("utf-8")
    if key not in known_zones() and not _in_tzpath(key):
        raise DeserializationError(f"stored time zone {key[:80]!r} is not an IANA zone key")
    return zoneinfo.ZoneInfo(key)


def _in_tzpath(key: str) -> bool:
    """Whether ``key`` is a file of the system zone database (``posix/UTC`` and the like)."""
    parts = key.split("/")
    if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return False
    return any(os.path.isfile(os.path.join(root, *parts)) for root in zoneinfo.TZPATH)


def _dec_uuid(data: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=data)


def _dec_decimal(data: bytes) -> decimal.Decimal:
    text = data.decode("ascii")
    value = decimal.Decimal(text)
    # With the InvalidOperation trap off, Decimal("garbage") is NaN instead of an error.
    if value.is_nan() and "nan" not in text.lower():
        raise _Corrupt("malformed Decimal payload")
    return value


_LEAVES: Final[dict[int, Callable[[bytes], Any]]] = {
    EXT_BIGINT: _dec_bigint,
    EXT_DATE: _dec_date,
    EXT_TIMEDELTA: _dec_timedelta,
    EXT_ZONEINFO: _dec_zoneinfo,
    EXT_UUID: _dec_uuid,
    EXT_DECIMAL: _dec_decimal,
}


def _dec_tuple(items: list[Any]) -> tuple[Any, ...]:
    return tuple(items[1:])


def _dec_set(items: list[Any]) -> set[Any]:
    return set(items[1:])


def _dec_frozenset(items: list[Any]) -> frozenset[Any]:
    return frozenset(items[1:])


def _dec_datetime(items: list[Any]) -> dt.datetime:
    _, year, month, day, hour, minute, second, us, fold, tz = items
    return dt.datetime(year, month, day, hour, minute, second, us, tzinfo=tz, fold=fold)


def _dec_time(items: list[Any]) -> dt.time:
    _, hour, minute, second, us, fold, tz = items
    return dt.time(hour, minute, second, us, tzinfo=tz, fold=fold)


def _dec_timezone(items: list[Any]) -> dt.timezone:
    _, offset, name = items
    if type(offset) is not int:
        raise _Corrupt("malformed timezone")
    delta = dt.timedelta(microseconds=offset)
    return dt.timezone(delta) if name is None else dt.timezone(delta, name)


# -- registered-class codecs -------------------------------------------------------------------


def _short(value: Any) -> str:
    return reprlib.repr(value)  # names in error messages come from untrusted bytes: bound them


def _for_channel(channel: str | None) -> str:
    return f" for channel {channel!r}" if channel else ""


def _enum_value(member: enum.Enum) -> Any:
    return member.value


def _root_value(model: pydantic.RootModel[Any]) -> Any:
    return model.root


def _model_fields(names: tuple[str, ...], model: pydantic.BaseModel) -> dict[str, Any]:
    # Field values as they are (not model_dump()), so nested values keep their own types and
    # go through the same encoder.
    values = model.__dict__
    data = {name: values[name] for name in names}
    extra = model.__pydantic_extra__
    if extra:
        data.update(extra)
    return data


def _model_validate(cls: type[pydantic.BaseModel], data: Any) -> pydantic.BaseModel:
    # Decoded field values already have their Python types, so validation keeps them. Match
    # by field name: the data was written by name, whatever aliases the model declares.
    return cls.model_validate(data, by_alias=False, by_name=True)


def _dataclass_fields(names: tuple[str, ...], obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in names}


def _dataclass_build(cls: type, init: frozenset[str], after: frozenset[str], data: Any) -> Any:
    if type(data) is not dict:
        raise _Corrupt(f"malformed {_type_name(cls)} payload")
    # Stored fields the class no longer has are dropped (as pydantic's extra="ignore" does);
    # missing required fields make cls() fail, which loads() reports.
    obj = cls(**{k: v for k, v in data.items() if k in init})
    for k, v in data.items():
        if k in after:
            object.__setattr__(obj, k, v)  # init=False fields; works on frozen dataclasses too
    return obj


def _namedtuple_build(cls: type, data: Any) -> Any:
    if type(data) is not list:
        raise _Corrupt(f"malformed {_type_name(cls)} payload")
    return cls(*data)
