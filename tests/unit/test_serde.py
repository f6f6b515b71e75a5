from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import decimal
import enum
import importlib
import operator
import os
import threading
import uuid
import zoneinfo
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal, NamedTuple, NotRequired, Optional, TypedDict

import msgpack  # type: ignore[import-untyped]
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphexec._serde import (
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
    Serializer,
    default_serializer,
)
from graphexec.errors import DeserializationError, SerializationError


def mark(code: int) -> msgpack.ExtType:
    """The zero-length marker extension that heads a structured value's array."""
    return msgpack.ExtType(code, b"")


def pack(value: Any) -> bytes:
    blob: bytes = msgpack.packb(value, use_bin_type=True)
    return blob


ALL_EXT_CODES = [
    EXT_BIGINT,
    EXT_TUPLE,
    EXT_SET,
    EXT_FROZENSET,
    EXT_DATETIME,
    EXT_DATE,
    EXT_TIME,
    EXT_TIMEDELTA,
    EXT_UUID,
    EXT_DECIMAL,
    EXT_TIMEZONE,
    EXT_ZONEINFO,
    EXT_REGISTERED,
]


# -- types used by the tests ----------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    READ = 1
    WRITE = 2


class Mode(enum.Enum):
    FAST = ("fast", 1)  # a tuple value: must come back as a tuple for Mode(value) to work
    SLOW = ("slow", 2)


@dataclasses.dataclass
class Attachment:
    name: str
    size: int
    kind: Color


class Tag(pydantic.BaseModel):
    label: str
    priority: Priority


class Note(pydantic.BaseModel):
    text: str
    tags: list[Tag] = []
    attachment: Attachment | None = None
    replies: list[Note] = []


@dataclasses.dataclass(frozen=True)
class Envelope:
    note: Note
    stamps: tuple[dt.datetime, ...]
    meta: dict[str, Any]


@dataclasses.dataclass
class Counter:
    start: int
    count: int = dataclasses.field(init=False, default=0)


class Aliased(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    user_id: int = pydantic.Field(alias="userId")


class Names(pydantic.RootModel[list[str]]):
    pass


class Holder(pydantic.BaseModel):
    payload: Any


class Pair(NamedTuple):
    left: int
    right: Color


@dataclasses.dataclass
class Wrapper:
    x: Any


class Money:
    """A plain class stored through explicit encode/decode callables."""

    __slots__ = ("amount", "currency")

    def __init__(self, amount: decimal.Decimal, currency: str) -> None:
        self.amount = amount
        self.currency = currency

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Money)
            and (self.amount, self.currency) == (other.amount, other.currency)
            and str(self.amount) == str(other.amount)
        )

    def __hash__(self) -> int:
        return hash((self.amount, self.currency))


class Unregistered:
    pass


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def canon(x: Any) -> Any:
    """A hashable, type-exact picture of a value: equal pictures mean an exact round trip."""
    t = type(x)
    if t is float:
        return (t, x.hex())  # tells -0.0 from 0.0; every NaN is "nan"
    if t is decimal.Decimal:
        return (t, str(x))  # tells 1.0 from 1.00
    if t is list or t is tuple:
        return (t, tuple(canon(i) for i in x))
    if t is set or t is frozenset:
        return (t, frozenset(canon(i) for i in x))
    if t is dict:
        return (t, tuple((canon(k), canon(v)) for k, v in x.items()))
    if t is dt.datetime or t is dt.time:
        return (t, x.replace(tzinfo=None).isoformat(), x.fold, canon(x.tzinfo))
    if t is dt.timezone:
        return (t, x.utcoffset(None), x.tzname(None))
    if t is zoneinfo.ZoneInfo:
        return (t, x.key)
    return (t, x)


def roundtrip(serde: Serializer, value: Any) -> Any:
    return serde.loads(serde.dumps(value, channel="c"), channel="c")


def full_serializer() -> Serializer:
    serde = Serializer([Counter, Aliased, Names, Holder, Pair, Wrapper, Perm, Mode])
    serde.register_schema(Envelope)
    serde.register(
        Money, encode=lambda m: (m.amount, m.currency), decode=lambda t: Money(t[0], t[1])
    )
    return serde


# -- built-in types ---------------------------------------------------------------------------

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
IST = dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")

BUILTIN_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    10**100,
    -(10**100),
    0.0,
    -0.0,
    1.5,
    float("inf"),
    float("-inf"),
    float("nan"),
    "",
    "héllo ☃",
    b"",
    b"\x00\xff",
    [],
    [1, "a", None],
    (),
    (1,),
    (1, (2, (3,))),
    {},
    {"a": 1},
    {1: "int key", (1, 2): "tuple key", None: 0, b"k": 1, frozenset({1}): 2, 2.5: 3},
    set(),
    {1, 2, 3},
    frozenset(),
    frozenset({"a", (1, 2)}),
    dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
    dt.datetime(2024, 3, 31, 2, 30, tzinfo=PARIS),
    dt.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=PARIS),
    dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2024, 1, 1, tzinfo=IST),
    dt.datetime(2024, 1, 1, tzinfo=dt.timezone(-dt.timedelta(hours=3, microseconds=7))),
    dt.datetime.min,
    dt.datetime.max,
    dt.date(2024, 2, 29),
    dt.date.min,
    dt.time(),
    dt.time(23, 59, 59, 999999, tzinfo=IST),
    dt.time(1, 2, fold=1),
    dt.timedelta(),
    dt.timedelta(days=-3, seconds=5, microseconds=7),
    dt.timedelta.max,
    dt.UTC,
    IST,
    PARIS,
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    uuid.UUID(int=0),
    decimal.Decimal("1.10"),
    decimal.Decimal("-0"),
    decimal.Decimal("1E+999999"),
    decimal.Decimal("3.14159265358979323846264338327950288419716939937510"),
    decimal.Decimal("NaN"),
    decimal.Decimal("-sNaN"),
    decimal.Decimal("Infinity"),
    decimal.Decimal("-Infinity"),
]


@pytest.mark.parametrize("value", BUILTIN_VALUES, ids=repr)
def test_builtin_values_round_trip_with_their_exact_type(value: Any) -> None:
    serde = Serializer()
    assert canon(roundtrip(serde, value)) == canon(value)


def test_nested_builtin_values_round_trip() -> None:
    value = {
        "when": [dt.datetime(2024, 5, 1, 12, tzinfo=PARIS), dt.date(2024, 5, 1)],
        (1, "a"): {frozenset({1, 2}): (dt.timedelta(seconds=3), {uuid.UUID(int=5)})},
        10**30: [(decimal.Decimal("0.1"), b"x", None, [set(), frozenset()])],
    }
    assert canon(roundtrip(Serializer(), value)) == canon(value)


def test_dict_insertion_order_is_kept() -> None:
    value = {"b": 1, "a": 2, 3: 3, (0,): 4}
    assert list(roundtrip(Serializer(), value)) == ["b", "a", 3, (0,)]


def test_native_values_are_plain_msgpack() -> None:
    value = {"a": [1, 2.5, "x", b"y", None, True, {"n": 2**64 - 1}]}
    assert Serializer().dumps(value) == msgpack.packb(value, use_bin_type=True)


def test_bytearray_and_memoryview_are_stored_as_bytes() -> None:
    serde = Serializer()
    assert roundtrip(serde, bytearray(b"ab")) == b"ab"
    assert type(roundtrip(serde, memoryview(b"ab"))) is bytes


def test_msgpack_timestamp_extension_reads_as_utc_datetime() -> None:
    data = msgpack.packb(msgpack.Timestamp(10, 5000))
    value = Serializer().loads(data)
    assert value == dt.datetime(1970, 1, 1, 0, 0, 10, 5, tzinfo=dt.UTC)


def test_default_serializer_is_fresh_and_knows_only_builtins() -> None:
    a, b = default_serializer(), default_serializer()
    assert a is not b
    assert a.fingerprint_types() == []
    a.register(Color)
    assert b.fingerprint_types() == []


# -- deterministic output --------------------------------------------------------------------


def test_equal_sets_give_equal_bytes_whatever_their_iteration_order() -> None:
    serde = Serializer()
    forward = set(range(0, 2000, 7)) | {"a", "b", (1, 2)}
    backward: set[Any] = set()
    for item in reversed([*range(0, 4000, 7), "a", "b", (1, 2)]):
        backward.add(item)
    backward -= set(range(2000, 4000))
    assert forward == backward
    assert list(forward) != list(backward)  # different iteration orders, same set
    assert serde.dumps(forward) == serde.dumps(backward)
    assert serde.dumps(frozenset(forward)) == serde.dumps(frozenset(backward))
    assert serde.dumps(forward) != serde.dumps(frozenset(forward))


def test_same_value_gives_same_bytes() -> None:
    serde = full_serializer()
    value = {
        "s": {"x", "y", "z"},
        "n": Note(text="a", tags=[Tag(label="t", priority=Priority.HIGH)]),
    }
    assert serde.dumps(value) == serde.dumps(value)
    assert serde.dumps(roundtrip(serde, value)) == serde.dumps(value)


# -- registered types --------------------------------------------------------------------------


def test_pydantic_models_and_dataclasses_nest_and_keep_their_classes() -> None:
    serde = full_serializer()
    note = Note(
        text="hello",
        tags=[Tag(label="urgent", priority=Priority.HIGH)],
        attachment=Attachment("a.txt", 3, Color.RED),
        replies=[Note(text="reply", attachment=Attachment("b", 1, Color.GREEN))],
    )
    env = Envelope(
        note=note,
        stamps=(dt.datetime(2024, 1, 1, tzinfo=PARIS),),
        meta={"seen": {Color.RED, Color.GREEN}, "pair": Pair(1, Color.RED)},
    )
    value = {
        "envs": [env, env],
        Color.GREEN: note,
        "tags": (Tag(label="x", priority=Priority.LOW),),
    }
    out = roundtrip(serde, value)
    assert out == value
    out_env = out["envs"][0]
    assert type(out_env) is Envelope
    assert type(out_env.note) is Note
    assert type(out_env.note.tags[0]) is Tag
    assert out_env.note.tags[0].priority is Priority.HIGH
    assert type(out_env.note.attachment) is Attachment
    assert out_env.note.attachment.kind is Color.RED
    assert type(out_env.note.replies[0].attachment) is Attachment
    assert type(out_env.stamps) is tuple
    assert out_env.stamps[0].tzinfo is PARIS
    assert type(out_env.meta["pair"]) is Pair
    assert out_env.meta["pair"].right is Color.RED
    assert type(out[Color.GREEN]) is Note


def test_init_false_dataclass_fields_are_restored() -> None:
    serde = Serializer([Counter])
    counter = Counter(start=5)
    counter.count = 7
    out = roundtrip(serde, counter)
    assert (type(out), out.start, out.count) == (Counter, 5, 7)


def test_pydantic_aliases_extras_and_root_models() -> None:
    serde = Serializer([Aliased, Names, Holder, Attachment, Color])
    aliased = Aliased.model_validate({"userId": 1, "extra_field": (1, 2)})
    out = roundtrip(serde, aliased)
    assert out == aliased
    assert out.model_extra == {"extra_field": (1, 2)}
    names = Names(["a", "b"])
    assert roundtrip(serde, names) == names
    # An Any field keeps a registered dataclass as such (model_dump would turn it into a dict).
    holder = Holder(payload=[Attachment("x", 1, Color.RED), (1, 2)])
    out_holder = roundtrip(serde, holder)
    assert out_holder == holder
    assert type(out_holder.payload[0]) is Attachment
    assert type(out_holder.payload[1]) is tuple


@pytest.mark.parametrize(
    "member",
    [Color.RED, Priority.HIGH, Perm.READ | Perm.WRITE, Perm(0), Mode.FAST],
    ids=repr,
)
def test_enum_members_round_trip_as_members(member: enum.Enum) -> None:
    serde = Serializer([Color, Priority, Perm, Mode])
    assert roundtrip(serde, member) is member
    assert roundtrip(serde, {member: [member]}) == {member: [member]}


def test_explicit_encode_decode() -> None:
    serde = Serializer()
    serde.register(
        Money,
        name="money",
        encode=lambda m: (m.amount, m.currency),
        decode=lambda t: Money(t[0], t[1]),
    )
    value = {
        "price": Money(decimal.Decimal("9.90"), "EUR"),
        "set": {Money(decimal.Decimal(1), "X")},
    }
    out = roundtrip(serde, value)
    assert out == value
    assert str(out["price"].amount) == "9.90"
    assert serde.fingerprint_types() == ["money"]


def test_registered_name_survives_a_class_rename() -> None:
    @dataclasses.dataclass
    class OldPoint:
        x: int

    @dataclasses.dataclass
    class NewPoint:
        x: int

    writer = Serializer()
    writer.register(OldPoint, name="point")
    reader = Serializer()
    reader.register(NewPoint, name="point")
    assert reader.loads(writer.dumps(OldPoint(3))) == NewPoint(3)


def test_custom_encode_may_call_dumps_reentrantly() -> None:
    serde = Serializer()
    serde.register(
        Money,
        encode=lambda m: serde.dumps((m.amount, m.currency)),
        decode=lambda b: Money(*serde.loads(b)),
    )
    value = [Money(decimal.Decimal("1.5"), "USD"), {"k": Money(decimal.Decimal(2), "EUR")}]
    assert roundtrip(serde, value) == value


def test_custom_decode_may_swallow_a_failed_inner_loads() -> None:
    serde = Serializer()

    def decode(blob: bytes) -> Money:
        try:
            return Money(*serde.loads(blob))
        except DeserializationError:
            return Money(decimal.Decimal(0), "???")

    # A truncated tuple: the inner loads() reads a marker, then fails before consuming it. The
    # outer loads() must not be confused by that.
    serde.register(Money, encode=lambda m: b"\x93\xc7\x00\x02\x01", decode=decode)
    value = (Money(decimal.Decimal(1), "EUR"), {1, 2})
    assert roundtrip(serde, value) == (Money(decimal.Decimal(0), "???"), {1, 2})


def test_dumps_is_thread_safe() -> None:
    serde = full_serializer()
    values = [
        {"i": i, "note": Note(text=str(i) * (i % 50)), "t": (i, {i, -i}), "s": "x" * i}
        for i in range(300)
    ]
    expected = [serde.dumps(v) for v in values]
    barrier = threading.Barrier(8)

    def work(offset: int) -> list[bytes]:
        barrier.wait()
        order = values[offset:] + values[:offset]
        return [serde.dumps(v) for v in order]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(0, 80, 10)))
    for offset, result in zip(range(0, 80, 10), results, strict=True):
        assert result == expected[offset:] + expected[:offset]


# -- encoding errors ---------------------------------------------------------------------------


def test_unregistered_class_fails_at_dumps_naming_channel_type_and_path() -> None:
    serde = Serializer([Wrapper])
    with pytest.raises(SerializationError) as info:
        serde.dumps([0, 1, 2, Wrapper(x=Unregistered())], channel="notes")
    err = info.value
    assert err.channel == "notes"
    assert err.type_name == qualname(Unregistered)
    message = str(err)
    assert "channel 'notes'" in message
    assert "notes[3].x" in message
    assert qualname(Unregistered) in message
    assert "Serializer.register(Unregistered, encode=..., decode=...)" in message
    assert isinstance(err, TypeError)


@pytest.mark.parametrize(
    ("value", "type_name", "hint"),
    [
        ({"k": Attachment("a", 1, Color.RED)}, qualname(Attachment), "register(Attachment)"),
        ({"k": [Color.RED]}, qualname(Color), "register(Color)"),
        ({"k": lambda: None}, "function", "functions"),
        ({"k": OrderedDict(a=1)}, "collections.OrderedDict", "plain dict"),
        ({"k": {1: object()}}, "object", "encode=..., decode=..."),
        ({"k": (1, {2: int})}, "type", "register"),
    ],
    ids=["dataclass", "enum", "lambda", "dict-subclass", "object", "class-object"],
)
def test_unsupported_values_fail_with_a_hint(value: Any, type_name: str, hint: str) -> None:
    with pytest.raises(SerializationError) as info:
        Serializer().dumps(value, channel="state")
    assert info.value.type_name == type_name
    assert "channel 'state'" in str(info.value)
    assert hint in str(info.value)


def test_unsupported_value_in_set_dict_key_and_tz_is_reported() -> None:
    serde = Serializer()

    class OddTz(dt.tzinfo):
        def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
            return dt.timedelta(0)

        def dst(self, d: dt.datetime | None) -> dt.timedelta:
            return dt.timedelta(0)

        def tzname(self, d: dt.datetime | None) -> str:
            return "odd"

    for value in (
        {Pair(1, Color.RED)},
        {Pair(1, Color.RED): 1},
        dt.datetime(2024, 1, 1, tzinfo=OddTz()),
    ):
        with pytest.raises(SerializationError) as info:
            serde.dumps(value, channel="c")
        assert info.value.channel == "c"


def test_failing_custom_encode_is_wrapped_and_chained() -> None:
    def boom(_: Any) -> Any:
        raise RuntimeError("boom")

    serde = Serializer()
    serde.register(Money, encode=boom, decode=lambda d: d)
    with pytest.raises(SerializationError, match="boom") as info:
        serde.dumps({"m": Money(decimal.Decimal(1), "X")}, channel="c")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_reference_cycles_and_deep_nesting_fail_cleanly() -> None:
    serde = Serializer()
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    deep: Any = ()
    for _ in range(5000):
        deep = (deep,)
    for value in (cyclic, deep):
        with pytest.raises(SerializationError, match="nests too deeply"):
            serde.dumps(value, channel="c")


def test_dumps_works_after_a_failure() -> None:
    serde = Serializer()
    with pytest.raises(SerializationError):
        serde.dumps(["x" * 1000, Unregistered()])
    assert serde.dumps({"a": 1}) == msgpack.packb({"a": 1})


def test_surrogate_strings_fail_as_serialization_errors() -> None:
    with pytest.raises(SerializationError):
        Serializer().dumps("\ud800", channel="c")


# -- decoding errors and security ---------------------------------------------------------------


def test_type_unknown_to_the_reader_is_a_deserialization_error() -> None:
    blob = Serializer([Attachment, Color]).dumps(Attachment("a", 1, Color.RED))
    with pytest.raises(DeserializationError) as info:
        Serializer([Color]).loads(blob, channel="files")
    assert info.value.channel == "files"
    assert repr(qualname(Attachment)) in str(info.value)
    assert "channel 'files'" in str(info.value)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("os.system", ["echo pwned"]),
        ("builtins.eval", ["__import__('os').system('echo pwned')"]),
        ("subprocess.Popen", [["echo", "pwned"]]),
        (qualname(Attachment), {"name": "a", "size": 1, "kind": "red"}),
    ],
)
def test_stored_names_are_never_imported_or_called(
    monkeypatch: pytest.MonkeyPatch, name: str, args: Any
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(("os.system", a)))
    monkeypatch.setattr(importlib, "import_module", lambda *a, **k: calls.append(("imp", a)))
    crafted = pack([mark(EXT_REGISTERED), name, args])
    serde = Serializer([Color])  # Attachment is not registered here
    real_import = builtins.__import__

    def spy_import(*a: Any, **k: Any) -> Any:
        calls.append(("__import__", a[0]))
        return real_import(*a, **k)

    error: DeserializationError | None = None
    builtins.__import__ = spy_import
    try:
        try:
            serde.loads(crafted, channel="notes")
        except DeserializationError as e:
            error = e
    finally:
        builtins.__import__ = real_import
    assert calls == []
    assert error is not None
    assert error.channel == "notes"
    assert f"type {name!r} is not registered" in str(error)


def test_corrupt_truncated_and_trailing_bytes_raise() -> None:
    serde = full_serializer()
    blob = serde.dumps(
        {
            "n": Note(text="x", tags=[Tag(label="t", priority=Priority.LOW)]),
            "t": (1, 2),
            "d": dt.date(2024, 1, 1),
        }
    )
    for cut in range(len(blob)):
        with pytest.raises(DeserializationError):
            serde.loads(blob[:cut], channel="c")
    with pytest.raises(DeserializationError, match="unexpected bytes after"):
        serde.loads(blob + b"\x00", channel="c")
    with pytest.raises(DeserializationError, match="truncated"):
        serde.loads(b"\x92\x01", channel="c")
    for bad in (b"", b"\xc1", b"\xd4\x63x", b"\xd4\x80x", b"\xc7\x00\x00"):
        with pytest.raises(DeserializationError) as info:
            serde.loads(bad, channel="c")
        assert info.value.__cause__ is not None


def test_unknown_ext_code_is_named() -> None:
    with pytest.raises(DeserializationError, match="unknown extension type code 99"):
        Serializer().loads(msgpack.packb(msgpack.ExtType(99, b"")))


MALFORMED = {
    "marker-with-payload": pack(msgpack.ExtType(EXT_TUPLE, b"x")),
    "marker-alone": pack(mark(EXT_TUPLE)),
    "marker-not-first": pack([1, mark(EXT_TUPLE)]),
    "two-markers": pack([mark(EXT_TUPLE), mark(EXT_TUPLE)]),
    "marker-as-dict-value": pack({"a": mark(EXT_SET)}),
    "marker-as-dict-key": pack({mark(EXT_SET): 1}),
    "unhashable-set-items": pack([mark(EXT_SET), [1], [2]]),
    "unhashable-dict-key": pack({b"k": 1}).replace(b"\xc4\x01k", b"\x91\x01"),
    "datetime-bad-month": pack([mark(EXT_DATETIME), 2024, 13, 1, 0, 0, 0, 0, 0, None]),
    "datetime-str-tz": pack([mark(EXT_DATETIME), 2024, 1, 1, 0, 0, 0, 0, 0, "UTC"]),
    "datetime-too-short": pack([mark(EXT_DATETIME), 2024]),
    "datetime-float-parts": pack([mark(EXT_DATETIME), 2024.0, 1, 1, 0, 0, 0, 0, 0, None]),
    "time-too-long": pack([mark(EXT_TIME), 1, 2, 3, 4, 0, None, None]),
    "timezone-out-of-range": pack([mark(EXT_TIMEZONE), 25 * 3600 * 10**6, None]),
    "timezone-float-offset": pack([mark(EXT_TIMEZONE), 1.5, None]),
    "timezone-bad-name": pack([mark(EXT_TIMEZONE), 0, 5]),
    "timedelta-short": pack(msgpack.ExtType(EXT_TIMEDELTA, b"\x00")),
    "date-zero": pack(msgpack.ExtType(EXT_DATE, b"\x00\x00\x00\x00")),
    "date-short": pack(msgpack.ExtType(EXT_DATE, b"\x01")),
    "zoneinfo-escape": pack(msgpack.ExtType(EXT_ZONEINFO, b"../../../../etc/passwd")),
    "zoneinfo-absolute": pack(msgpack.ExtType(EXT_ZONEINFO, b"/etc/passwd")),
    "zoneinfo-unknown": pack(msgpack.ExtType(EXT_ZONEINFO, b"No/Such_Zone")),
    "zoneinfo-not-utf8": pack(msgpack.ExtType(EXT_ZONEINFO, b"\xff")),
    "uuid-short": pack(msgpack.ExtType(EXT_UUID, b"short")),
    "decimal-garbage": pack(msgpack.ExtType(EXT_DECIMAL, b"garbage")),
    "decimal-not-ascii": pack(msgpack.ExtType(EXT_DECIMAL, b"\xff")),
    "registered-name-not-str": pack([mark(EXT_REGISTERED), 1, 2]),
    "registered-too-short": pack([mark(EXT_REGISTERED), "x"]),
    "unknown-code": pack(msgpack.ExtType(99, b"")),
    "negative-code": b"\xd4\xfbx",  # fixext 1, code -5
    "bad-timestamp": b"\xc7\x0c\xff" + b"\xff" * 12,  # ext -1 with a year out of range
}


@pytest.mark.parametrize("blob", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_extensions_raise(blob: bytes) -> None:
    with pytest.raises(DeserializationError) as info:
        Serializer().loads(blob, channel="c")
    assert info.value.channel == "c"
    assert info.value.__cause__ is not None


def test_malformed_registered_payloads_raise() -> None:
    serde = full_serializer()
    for data in (["x"], {"name": 1}, {"text": 1, "tags": "nope"}):
        for cls in (Note, Attachment, Counter, Pair):
            crafted = pack([mark(EXT_REGISTERED), qualname(cls), data])
            with pytest.raises(DeserializationError):
                serde.loads(crafted)


@pytest.mark.parametrize("depth", [1100, 100_000])
def test_deeply_nested_stored_data_raises(depth: int) -> None:
    # Nested tuples, crafted by hand: [TUPLE, [TUPLE, [... []]]]. Decoding is one flat msgpack
    # pass, so depth is bounded by msgpack's own stack, never by C recursion.
    blob = b"\x92\xc7\x00\x02" * depth + b"\x90"
    with pytest.raises(DeserializationError):
        Serializer().loads(blob)


@pytest.mark.parametrize(
    "wrap",
    [lambda v: [v], lambda v: (v,), lambda v: {"k": v}, lambda v: frozenset({v})],
    ids=["list", "tuple", "dict", "set"],
)
def test_whatever_dumps_accepts_loads_reads(wrap: Any) -> None:
    serde = Serializer()

    def nested(depth: int) -> Any:
        value: Any = ()
        for _ in range(depth):
            value = wrap(value)
        return value

    # The deepest value dumps() accepts must load: nothing is written that cannot be read
    # (msgpack's unpacker holds at most 1024 nested containers).
    for depth in range(1030, 1000, -1):
        try:
            blob = serde.dumps(nested(depth), channel="c")
        except SerializationError as e:
            assert "nests too deeply" in str(e)
            continue
        assert serde.dumps(serde.loads(blob)) == blob  # (== on such depths overflows Python)
        break
    else:
        pytest.fail("no depth above 1000 was accepted")
    assert depth < 1030


def test_loads_rejects_non_bytes() -> None:
    with pytest.raises(TypeError):
        Serializer().loads("not bytes")  # type: ignore[arg-type]


# -- registry ------------------------------------------------------------------------------------


def test_two_classes_under_one_name_is_a_value_error_naming_both() -> None:
    serde = Serializer()
    serde.register(Attachment, name="thing")
    with pytest.raises(ValueError) as info:
        serde.register(Tag, name="thing")
    assert qualname(Attachment) in str(info.value)
    assert qualname(Tag) in str(info.value)


def test_same_qualified_name_from_two_class_objects_conflicts() -> None:
    def make() -> type:
        @dataclasses.dataclass
        class Point:
            x: int

        return Point

    serde = Serializer([make()])
    with pytest.raises(ValueError, match="same qualified name"):
        serde.register(make())


def test_registration_rules() -> None:
    serde = Serializer([Attachment])
    serde.register(Attachment)  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        serde.register(Attachment, name="other")
    with pytest.raises(ValueError, match="built in"):
        serde.register(tuple)
    with pytest.raises(TypeError, match="encode= and decode="):
        serde.register(Unregistered)
    with pytest.raises(TypeError, match="both encode= and decode="):
        serde.register(Money, encode=lambda m: m)
    with pytest.raises(TypeError, match="expects a class"):
        serde.register(Attachment("a", 1, Color.RED))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        serde.register(Money, name="", encode=lambda m: m, decode=lambda m: m)
    assert serde.fingerprint_types() == [qualname(Attachment)]


def test_fingerprint_types_is_sorted() -> None:
    serde = Serializer([Tag, Attachment, Color])
    serde.register(Money, name="aaa", encode=lambda m: m.currency, decode=lambda c: c)
    assert serde.fingerprint_types() == sorted(
        ["aaa", qualname(Tag), qualname(Attachment), qualname(Color)]
    )


class Inner(TypedDict):
    when: dt.datetime
    mode: Literal[Mode.FAST]


class State(TypedDict):
    notes: Annotated[list[Note], operator.add]
    current: Optional[Attachment]  # noqa: UP045 - the Optional spelling is what is tested
    by_color: dict[Color, list[tuple[Tag, ...]]]
    flags: set[Perm] | None
    inner: NotRequired[Inner]
    pairs: list[Pair]
    counter: int


def test_register_schema_walks_a_typeddict() -> None:
    serde = Serializer()
    serde.register_schema(State)
    expected = {Note, Tag, Priority, Attachment, Color, Perm, Mode, Pair}
    assert serde.fingerprint_types() == sorted(qualname(c) for c in expected)
    serde.register_schema(State)  # again: nothing changes, nothing fails
    assert len(serde.fingerprint_types()) == len(expected)
    value: State = {
        "notes": [Note(text="n", attachment=Attachment("a", 1, Color.RED))],
        "current": None,
        "by_color": {Color.GREEN: [(Tag(label="t", priority=Priority.LOW),)]},
        "flags": {Perm.READ},
        "inner": {"when": dt.datetime(2024, 1, 1), "mode": Mode.FAST},
        "pairs": [Pair(1, Color.RED)],
        "counter": 1,
    }
    assert roundtrip(serde, value) == value


def test_register_schema_on_models_and_dataclasses_registers_them_too() -> None:
    serde = Serializer()
    serde.register_schema(Envelope)
    assert serde.fingerprint_types() == sorted(
        qualname(c) for c in (Envelope, Note, Tag, Priority, Attachment, Color)
    )
    other = Serializer()
    other.register_schema(Note)  # recursive model: must not loop
    assert qualname(Note) in other.fingerprint_types()


def test_register_schema_keeps_existing_registrations() -> None:
    serde = Serializer()
    serde.register(Color, name="color")
    serde.register_schema(Attachment)
    assert serde.fingerprint_types() == sorted(["color", qualname(Attachment)])


# -- properties ------------------------------------------------------------------------------

_MAX_TZ = dt.timedelta(hours=23, minutes=59)
_tzinfos = st.one_of(
    st.none(),
    st.just(dt.UTC),
    st.builds(dt.timezone, st.timedeltas(min_value=-_MAX_TZ, max_value=_MAX_TZ)),
    st.builds(dt.timezone, st.timedeltas(min_value=-_MAX_TZ, max_value=_MAX_TZ), st.text()),
    st.timezones(),
)
_hashable_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.datetimes(timezones=_tzinfos, allow_imaginary=True),
    st.dates(),
    st.times(timezones=_tzinfos),
    st.timedeltas(),
    st.uuids(),
    st.decimals(allow_nan=False),
)
_hashables = st.recursive(
    _hashable_leaves,
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_leaves = _hashable_leaves | st.floats() | st.decimals()
values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(_hashables, inner, max_size=5),
        st.sets(_hashables, max_size=5),
        st.frozensets(_hashables, max_size=5),
    ),
    max_leaves=25,
)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_property_round_trip_is_exact_and_deterministic(value: Any) -> None:
    serde = Serializer()
    blob = serde.dumps(value, channel="c")
    out = serde.loads(blob, channel="c")
    assert canon(out) == canon(value)
    assert serde.dumps(out, channel="c") == blob


@settings(deadline=None, max_examples=500)
@given(st.binary())
def test_property_random_bytes_decode_or_raise_deserialization_error(data: bytes) -> None:
    serde = full_serializer()
    try:
        serde.loads(data)
    except DeserializationError:
        pass


_registered_names = st.sampled_from(
    [qualname(c) for c in (Note, Tag, Attachment, Counter, Pair, Money, Color)]
)
_junk = st.recursive(
    st.none()
    | st.integers(-5, 5)
    | st.text(max_size=5)
    | st.sampled_from(["red", "text", 2024])
    | st.sampled_from([*ALL_EXT_CODES, 0, 99]).map(mark)
    | st.tuples(st.sampled_from([*ALL_EXT_CODES, 0, 99]), st.binary(max_size=16)).map(
        lambda t: msgpack.ExtType(*t)
    ),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
_crafted = st.one_of(
    _junk,
    st.tuples(_registered_names, _junk).map(lambda p: [mark(EXT_REGISTERED), *p]),
    st.tuples(st.sampled_from(ALL_EXT_CODES), st.lists(_junk, max_size=10)).map(
        lambda p: [mark(p[0]), *p[1]]
    ),
)


@settings(deadline=None, max_examples=500)
@given(_crafted)
def test_property_crafted_values_decode_or_raise(crafted: Any) -> None:
    serde = full_serializer()
    try:
        serde.loads(pack(crafted))
    except DeserializationError:
        pass


@settings(deadline=None, max_examples=200)
@given(values, st.data())
def test_property_mutated_blobs_decode_or_raise(value: Any, data: st.DataObject) -> None:
    serde = Serializer()
    blob = bytearray(serde.dumps(value))
    index = data.draw(st.integers(0, len(blob) - 1))
    blob[index] = data.draw(st.integers(0, 255))
    try:
        serde.loads(bytes(blob))
    except DeserializationError:
        pass


# -- hash-collision payloads (crafted msgpack, never written by dumps) ---------------------------

_HASH_MODULUS = 2**61 - 1  # an int hashes to itself mod this: ints k * it apart collide


import time  # noqa: E402


def _colliding_bigints(count: int) -> list[Any]:

    from graphexec._wire import EXT_BIGINT

    base = 1 << 200
    ints = [base + i * _HASH_MODULUS for i in range(count)]
    return [
        msgpack.ExtType(EXT_BIGINT, n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True))
        for n in ints
    ]


@pytest.mark.parametrize("container", ["set", "frozenset", "map", "tuple-keys"])
def test_loads_refuses_colliding_keys_in_linear_time(container: str) -> None:

    from graphexec._wire import EXT_FROZENSET, EXT_SET, EXT_TUPLE

    items = _colliding_bigints(30_000)  # ~1 MB: ~40 s to decode before the collision guard
    packer = msgpack.Packer()
    if container in ("set", "frozenset"):
        code = EXT_SET if container == "set" else EXT_FROZENSET
        data = packer.pack([msgpack.ExtType(code, b""), *items])
    else:
        data = packer.pack_map_header(len(items))
        for item in items:
            key = [msgpack.ExtType(EXT_TUPLE, b""), item] if container == "tuple-keys" else item
            data += packer.pack(key) + packer.pack(0)
    started = time.perf_counter()
    with pytest.raises(DeserializationError, match="colliding hashes") as info:
        Serializer().loads(data, channel="notes")
    assert time.perf_counter() - started < 5
    assert "'notes'" in str(info.value)


def test_loads_keeps_many_distinct_collision_prone_values() -> None:
    # Past the fast path's limit the value is decoded again with checks: same result.
    value = {
        "keys": {(i, str(i)): decimal.Decimal(i) / 7 for i in range(2_000)},
        "ids": {uuid.UUID(int=i) for i in range(2_000)},
        "big": frozenset(10**30 + i for i in range(2_000)),
        "few": {-1: "a", -2: "b"},  # equal hashes (-1 hashes as -2), legitimately
    }
    serde = Serializer()
    assert serde.loads(serde.dumps(value)) == value
