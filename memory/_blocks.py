"""Core-memory block rules shared by every backend: labels, edits, conflicts, rendering."""

from __future__ import annotations

from collections.abc import Sequence

from graphexec.errors import MemoryConflictError, MemoryStoreError
from memory._text import LABEL_PATTERN, Block, render_blocks

__all__ = [
    "check_label",
    "check_labels",
    "conflict",
    "edit_replace",
    "occurrences",
    "render_selected",
]


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
