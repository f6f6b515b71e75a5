"""Encryption at rest for stored blobs: AES-256-GCM, bound to the row each blob belongs to.

Shared by the SQL backends. Every blob a backend stores (channel values, snapshots, frontier,
pending writes, metadata) is sealed with associated data naming its row -- thread, namespace,
checkpoint, role and channel -- so a blob copied into another row fails authentication instead
of being read as that row's data.

Stored format (one envelope per blob)::

    0xE1 | len(key_id) (1 byte) | key_id (UTF-8) | nonce (12 bytes) | ciphertext + tag (16 bytes)

``0xE1`` is the format version. It is also a byte that never starts a msgpack map, which lets a
backend opened *without* encryption recognise encrypted metadata and say so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]

from graphexec.errors import DeserializationError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["ENVELOPE_VERSION", "Encryption", "blob_context", "looks_encrypted"]

ENVELOPE_VERSION = 0xE1
"""First byte of every encrypted blob."""

_NONCE = 12
_TAG = 16
_CONTEXT_TAG = "graphexec/blob/v1"


def blob_context(*parts: str | int | None) -> bytes:
    """Associated data naming one stored blob's place, e.g. ``(thread, ns, id, role, channel)``.

    The parts are length-delimited and typed (msgpack), so ``("a|b", "c")`` and ``("a", "b|c")``
    differ, and so do ``1`` and ``"1"``.
    """
    packed: bytes = msgpack.packb([_CONTEXT_TAG, *parts], use_bin_type=True)
    return packed


def _load_aesgcm() -> tuple[type[AESGCM], type[Exception]]:
    try:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as e:  # pragma: no cover - the dev environment installs it
        raise ImportError(
            "encryption at rest needs the 'cryptography' package: "
            "pip install 'graphexec[encryption]'"
        ) from e
    return AESGCM, InvalidTag


class Encryption:
    """AES-256-GCM keys for encrypting checkpoints at rest, with key ids for rotation.

    New blobs are encrypted with the ``active`` key; any key in ``keys`` can decrypt. To rotate,
    add a new key, make it active, and keep the old one until nothing written with it remains
    (old checkpoints are pruned or expire). A blob whose key id is unknown, whose tag does not
    verify (tampered, or moved from another row), or that is not encrypted at all raises
    :class:`~graphexec.errors.DeserializationError`; no data is ever returned for it.

    Example:
        Two keys, the newer one active::

            enc = Encryption(keys={"2024": old_key, "2025": new_key}, active="2025")
            async with SqliteCheckpointer.open("runs.db", encryption=enc) as cp: ...

    Args:
        keys: Key id to 32-byte key. Key ids are short strings (at most 255 UTF-8 bytes) stored
            in every blob; the keys themselves are never stored.
        active: The key id used to encrypt new blobs.

    Raises:
        ImportError: The ``cryptography`` package (extra ``encryption``) is not installed.
        ValueError: A key is not 32 bytes, a key id is empty or too long, or ``active`` is not
            one of ``keys``.
    """

    def __init__(self, *, keys: Mapping[str, bytes], active: str) -> None:
        aesgcm, self._invalid_tag = _load_aesgcm()
        if not keys:
            raise ValueError("Encryption(keys=...) needs at least one key")
        self._ciphers: dict[bytes, AESGCM] = {}
        # Messages name an entry by its position, never by its id or key: a misconfigured
        # entry often holds the key itself where the id belongs.
        for number, (key_id, key) in enumerate(keys.items(), 1):
            raw_id = key_id.encode() if isinstance(key_id, str) else b""
            if not raw_id or len(raw_id) > 255:
                raise ValueError(
                    f"keys entry {number}: the key id must be a non-empty string of at most 255 "
                    f"UTF-8 bytes (got {type(key_id).__name__} of {_size(key_id)}; not shown)"
                )
            if not isinstance(key, bytes | bytearray) or len(key) != 32:
                raise ValueError(
                    f"keys entry {number}: the key must be 32 bytes (AES-256), e.g. from "
                    f"os.urandom(32) (got {type(key).__name__} of {_size(key)}; not shown)"
                )
            self._ciphers[raw_id] = aesgcm(bytes(key))
        if active not in keys:
            raise ValueError(
                f"the active key id must be one of the {len(keys)} key ids in keys= (the value "
                "given is not shown)"
            )
        self._active_id = active.encode()
        self._active = self._ciphers[self._active_id]
        self._header = bytes([ENVELOPE_VERSION, len(self._active_id)]) + self._active_id

    @property
    def active(self) -> str:
        """The key id new blobs are encrypted with."""
        return self._active_id.decode()

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id this object can decrypt."""
        return tuple(k.decode() for k in self._ciphers)

    def __repr__(self) -> str:  # never show key material
        return f"Encryption(key_ids={list(self.key_ids)!r}, active={self.active!r})"

    def encrypt(self, data: bytes, *, context: bytes) -> bytes:
        """Seal ``data`` for the row described by ``context`` (see :func:`blob_context`)."""
        nonce = os.urandom(_NONCE)
        return self._header + nonce + self._active.encrypt(nonce, data, context)

    def decrypt(self, blob: bytes, *, context: bytes, what: str) -> bytes:
        """Open a blob sealed by :meth:`encrypt` for the same ``context``.

        Args:
            blob: The stored envelope.
            context: The associated data of the row it was read from.
            what: Names the blob in error messages (e.g. ``"channel 'messages' of checkpoint
                '...'"``).

        Raises:
            DeserializationError: The blob is not encrypted, names an unknown key id, or fails
                authentication.
        """
        if len(blob) < 2 or blob[0] != ENVELOPE_VERSION:
            raise DeserializationError(
                f"{what} is not encrypted (a plaintext row?) but this checkpointer was opened "
                "with encryption; refusing to read it. Re-write the data with encryption, or "
                "open the database without encryption="
            )
        id_end = 2 + blob[1]
        key_id = blob[2:id_end]
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            name = key_id.decode(errors="replace")
            raise DeserializationError(
                f"{what} was encrypted with key id {name!r}, which is not among this "
                f"Encryption's keys {list(self.key_ids)}; add that key to keys="
            )
        nonce = blob[id_end : id_end + _NONCE]
        if len(nonce) != _NONCE or len(blob) < id_end + _NONCE + _TAG:
            raise DeserializationError(f"{what}: encrypted blob is truncated")
        try:
            return cipher.decrypt(nonce, blob[id_end + _NONCE :], context)
        except self._invalid_tag as e:
            raise DeserializationError(
                f"{what} failed authentication: it was modified, moved from another row, or "
                f"key {key_id.decode(errors='replace')!r} is not the key it was written with"
            ) from e


def looks_encrypted(blob: Any) -> bool:
    """Whether ``blob`` starts like an encryption envelope (used to refuse reading it plain)."""
    return isinstance(blob, bytes) and len(blob) > 1 and blob[0] == ENVELOPE_VERSION


def _size(value: object) -> str:
    """``"N bytes"`` / ``"N characters"`` of a rejected id or key, for messages (not its value)."""
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    if isinstance(value, str):
        return f"{len(value)} characters"
    return "unknown length"
