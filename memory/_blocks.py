"""Core-memory blocks: the Block record, labels, edits, conflicts and the XML prompt rendering.

Shared by every backend. Rendering is pure Python and deterministic, so the core-memory prompt
is the same on every machine and in every process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from graphexec.errors import MemoryConflictError, MemoryStoreError

__all__ = [
    "LABEL_PATTERN",
    "Block",
    "BlockLike",
    "check_label",
    "check_labels",
    "conflict",
    "edit_replace",
    "occurrences",
    "render_blocks",
    "render_selected",
    "xml_escape",
]


LABEL_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""A block label: a lowercase XML-safe name of 1-64 characters (matched in full)."""


def check_label(label: object) -> str:
    """``label`` if it is a valid block label, else :class:`MemoryStoreError`."""
    if not isinstance(label, str) or LABEL_PATTERN.fullmatch(label) is None:
        raise MemoryStoreError(
            f"invalid block label {label!r}: use 1-64 characters, a lowercase letter first, then "
            "lowercase letters, digits or '_' (e.g. 'persona', 'user_prefs')"
        )
    return label


def occurrences(text: str, old: str) -> int:
    """How many times ``old`` occurs in ``text``, overlapping occurrences included."""
    count = 0
    start = text.find(old)
    while start != -1:
        count += 1
        start = text.find(old, start + 1)
    return count


def conflict(name: str, expected: int, actual: int) -> MemoryConflictError:
    """The error for a block whose version is not the one the caller expected."""
    return MemoryConflictError(
        f"{name} is at version {actual}, not the expected version {expected}: another writer "
        "changed it; read it again and retry",
        key=name,
        expected=expected,
        actual=actual,
    )


def check_labels(labels: Sequence[str] | None) -> list[str] | None:
    """The distinct labels asked for, in order (``None``: all)."""
    if labels is None:
        return None
    if isinstance(labels, str):
        raise MemoryStoreError(f"labels must be a list of labels, got the str {labels!r}")
    return list(dict.fromkeys(check_label(label) for label in labels))


def render_selected(
    blocks: Sequence[Block], wanted: list[str] | None, namespace: tuple[str, ...]
) -> str:
    """Render ``wanted`` (all when ``None``) of ``blocks``; a missing label is an error."""
    if wanted is None:
        return render_blocks(blocks)
    by_label = {block.label: block for block in blocks}
    missing = [label for label in wanted if label not in by_label]
    if missing:
        raise MemoryStoreError(
            f"no block labelled {', '.join(map(repr, missing))}"
            + (f" in namespace {namespace!r}" if namespace else "")
            + f"; existing labels: {sorted(by_label) or 'none'}"
        )
    return render_blocks(by_label[label] for label in wanted)


def edit_replace(name: str, value: str, old: str, new: str) -> str:
    """``value`` with ``old`` (which must occur exactly once) replaced by ``new``."""
    count = occurrences(value, old)
    if count == 0:
        raise MemoryStoreError(
            f"{name} does not contain the text to replace ({old!r}); copy it exactly "
            "from the block's current value"
        )
    if count > 1:
        raise MemoryStoreError(
            f"{name} contains the text to replace ({old!r}) {count} times; it must "
            "occur exactly once: include more of the surrounding text"
        )
    return value.replace(old, new, 1)


@dataclass(frozen=True)
class Block:
    """A core-memory block: a labelled piece of text that is rendered into every prompt.

    The label is checked on construction (it becomes an XML element name). The size limit is
    checked by :meth:`check`, not on construction, so that a store's developer API can write an
    oversized value on purpose (``force=True``); agent-facing tools call :meth:`check`.
    """

    label: str
    """Unique name, e.g. ``persona`` or ``human``; matches :data:`LABEL_PATTERN`."""
    value: str = ""
    """The block's text."""
    limit: int = 5000
    """Maximum length of ``value`` in characters."""
    description: str = ""
    """What the block is for, shown to the model."""
    read_only: bool = False
    """When true, agent-facing tools may not change the block."""
    version: int = 0
    """Optimistic-concurrency version, bumped by the store on every write."""

    def __post_init__(self) -> None:
        check_label(self.label)
        if not isinstance(self.value, str) or not isinstance(self.description, str):
            raise MemoryStoreError(f"block {self.label!r}: value and description must be str")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise MemoryStoreError(
                f"block {self.label!r}: limit must be a non-negative int, got {self.limit!r}"
            )

    def check(self) -> None:
        """Enforce the size limit.

        Raises:
            MemoryStoreError: When ``value`` is longer than ``limit``; the message gives both
                sizes so the caller can shorten the text or raise the limit.
        """
        if len(self.value) > self.limit:
            raise MemoryStoreError(
                f"block {self.label!r} would hold {len(self.value)} characters, over its limit "
                f"of {self.limit}: shorten the text (e.g. replace old lines) or raise the limit"
            )


class BlockLike(Protocol):
    """Anything :func:`render_blocks` can render (e.g. :class:`Block`)."""

    @property
    def label(self) -> str:
        """Block label."""
        ...

    @property
    def value(self) -> str:
        """Block text."""
        ...

    @property
    def limit(self) -> int:
        """Character limit."""
        ...

    @property
    def description(self) -> str:
        """What the block is for."""
        ...

    @property
    def read_only(self) -> bool:
        """Whether agents may edit it."""
        ...


# Characters XML 1.0 cannot carry at all, not even as character references.
_XML_INVALID_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_escape(text: str) -> str:
    """Escape text for XML element content so that parsing gives back exactly ``text``.

    ``&``, ``<`` and ``>`` become entities and carriage returns become ``&#13;`` (an XML parser
    would otherwise turn them into newlines). Characters XML 1.0 cannot represent at all (most
    C0 controls, lone surrogates, U+FFFE/U+FFFF) are replaced with U+FFFD.

    Args:
        text: Any text.

    Returns:
        Escaped text, safe inside any element.
    """
    text = _XML_INVALID_RE.sub("\ufffd", text)
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#13;")
    )


def render_blocks(blocks: Iterable[BlockLike]) -> str:
    """Render blocks as Letta-style ``<memory_blocks>`` XML for a system prompt.

    The layout, per block (values and descriptions escaped with :func:`xml_escape`, so no text can
    close an element early or open a new one)::

        <memory_blocks>
        <persona>
        <description>...</description>
        <metadata>chars_current=12 chars_limit=5000</metadata>
        <value>...</value>
        </persona>
        </memory_blocks>

    ``read_only=true`` is added to the metadata of read-only blocks.

    Args:
        blocks: Blocks in display order.

    Returns:
        The XML text; parsing it gives back every value and description exactly.

    Raises:
        MemoryStoreError: When a label is not a valid block label.
    """
    lines = ["<memory_blocks>"]
    for block in blocks:
        label = check_label(block.label)
        meta = f"chars_current={len(block.value)} chars_limit={int(block.limit)}"
        if block.read_only:
            meta += " read_only=true"
        lines += [
            f"<{label}>",
            f"<description>{xml_escape(block.description)}</description>",
            f"<metadata>{meta}</metadata>",
            f"<value>{xml_escape(block.value)}</value>",
            f"</{label}>",
        ]
    lines.append("</memory_blocks>")
    return "\n".join(lines)
