"""Commands that inspect and maintain stored threads: threads, history, show, prune, expire."""

from __future__ import annotations

import argparse
from typing import Any

from graphexec._checkpoint import Checkpoint, validate_ttl
from graphexec._types import StateSnapshot
from graphexec.cli._common import (
    EXIT_OK,
    CliError,
    Progress,
    checkpoint_of,
    describe_store,
    dump_json,
    graph_for,
    open_store,
    short,
    table,
    terminal_safe,
    thread_head,
    to_plain,
    when,
)
from graphexec.errors import InvalidTTLError

__all__ = ["cmd_expire", "cmd_history", "cmd_prune", "cmd_show", "cmd_threads", "state_diff"]


async def cmd_threads(args: argparse.Namespace) -> int:
    """``graphexec threads``: every thread, most recently updated first."""
    async with open_store(args) as store:
        threads = list(await store.list_threads())
    threads = threads[: args.limit]
    if args.json:
        dump_json(
            [
                {
                    "thread_id": t.thread_id,
                    "head": t.head_id,
                    "step": t.step,
                    "next": list(t.next_nodes),
                    "checkpoints": t.checkpoints,
                    "updated_at": t.updated_at,
                }
                for t in threads
            ]
        )
        return EXIT_OK
    if not threads:
        print(f"no threads in {describe_store(args)}")
        return EXIT_OK
    rows = [
        (
            t.thread_id,
            t.step,
            ", ".join(t.next_nodes) or "(finished)",
            t.checkpoints,
            when(t.updated_at),
            t.head_id,
        )
        for t in threads
    ]
    print(table(rows, ["thread", "step", "next", "checkpoints", "updated", "head"]))
    return EXIT_OK


def _ran(cp: Checkpoint) -> str:
    writes = cp.metadata.get("writes") or {}
    return ", ".join(str(w) for w in writes) if isinstance(writes, dict) else ""


def _notes(cp: Checkpoint) -> str:
    notes: list[str] = []
    for d in cp.metadata.get("decisions", []) or []:
        if isinstance(d, dict):
            who = f" by {d['by']}" if d.get("by") else ""
            notes.append(f"{d.get('decision')} {d.get('node', '')}{who}".strip())
    forked = cp.metadata.get("forked_from")
    if isinstance(forked, dict):
        notes.append(f"forked from {forked.get('thread_id')}@{forked.get('checkpoint_id')}")
    if cp.snapshot is not None:
        notes.append("snapshot")
    return "; ".join(notes)


def _checkpoint_dict(cp: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": cp.checkpoint_id,
        "parent_id": cp.parent_id,
        "step": cp.step,
        "source": cp.source,
        "created_at": cp.created_at,
        "next": list(cp.next_nodes),
        "ran": list((cp.metadata.get("writes") or {}).keys()),
        "metadata": to_plain(dict(cp.metadata)),
        "snapshot": cp.snapshot is not None,
    }


async def cmd_history(args: argparse.Namespace) -> int:
    """``graphexec history T``: the checkpoints of a branch, newest first (or the branch tips)."""
    where = describe_store(args)
    async with open_store(args) as store:
        head = await thread_head(store, args.thread, where)
        if args.branches:
            cps = list(await store.list_tips(args.thread))
        elif args.checkpoint:
            tup = await checkpoint_of(store, args.thread, args.checkpoint, where)
            older = (
                await store.list(
                    args.thread,
                    "",
                    limit=None if args.limit is None else args.limit - 1,
                    before=args.checkpoint,
                )
                if args.limit != 1
                else []
            )
            cps = [tup.checkpoint, *older]
        else:
            cps = list(await store.list(args.thread, "", limit=args.limit))
    head_id = head.checkpoint.checkpoint_id
    if args.json:
        dump_json([{**_checkpoint_dict(cp), "head": cp.checkpoint_id == head_id} for cp in cps])
        return EXIT_OK
    rows = [
        (
            ("* " if cp.checkpoint_id == head_id else "  ") + cp.checkpoint_id,
            cp.step,
            cp.source,
            _ran(cp),
            ", ".join(cp.next_nodes) or "(end)",
            when(cp.created_at),
            _notes(cp),
        )
        for cp in cps
    ]
    title = "branch tips" if args.branches else "checkpoints, newest first"
    print(f"thread {terminal_safe(args.thread)}: {len(cps)} {title} (* = head)")
    print(table(rows, ["  checkpoint", "step", "source", "ran", "next", "created", "notes"]))
    return EXIT_OK


def state_diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-key changes from ``before`` to ``after``.

    Each change is ``{"key", "change": "added"|"removed"|"changed"|"appended", ...}``; a list
    that only grew at its end is reported as ``appended`` with just the new items.
    """
    changes: list[dict[str, Any]] = []
    for key in [*before, *(k for k in after if k not in before)]:
        if key not in after:
            changes.append({"key": key, "change": "removed", "before": before[key]})
        elif key not in before:
            changes.append({"key": key, "change": "added", "after": after[key]})
        elif before[key] != after[key]:
            old, new = before[key], after[key]
            if isinstance(old, list) and isinstance(new, list) and new[: len(old)] == old:
                changes.append({"key": key, "change": "appended", "items": new[len(old) :]})
            else:
                changes.append({"key": key, "change": "changed", "before": old, "after": new})
    return changes


def _print_snapshot(snap: StateSnapshot) -> None:
    thread = terminal_safe(snap.thread_id)
    print(f"thread {thread}, checkpoint {snap.checkpoint_id} (step {snap.step})")
    print(f"  parent:  {snap.parent_id or '(none)'}")
    print(f"  created: {when(snap.created_at)}")
    print(f"  next:    {terminal_safe(', '.join(snap.next)) or '(finished)'}")
    for i in snap.interruptions:
        print(f"  waiting: {i.kind} of {i.node!r} (id {i.id}): {short(i.value, 70)}")


async def cmd_show(args: argparse.Namespace) -> int:
    """``graphexec show T [--checkpoint C] [--diff]``: a checkpoint's state, or what it changed."""
    _spec, graph = await graph_for(args, "show")
    where = describe_store(args)
    async with open_store(args) as store:
        if args.checkpoint:
            await checkpoint_of(store, args.thread, args.checkpoint, where)
        else:
            await thread_head(store, args.thread, where)
        g = graph.with_checkpointer(store)
        try:
            snap = await g.aget_state(args.thread, checkpoint_id=args.checkpoint)
            assert snap is not None
            parent = None
            if args.diff and snap.parent_id is not None:
                parent = await g.aget_state(args.thread, checkpoint_id=snap.parent_id)
        finally:
            await _close_memory(g.memory)
    changes = state_diff(parent.values if parent else {}, snap.values) if args.diff else None
    if args.json:
        out: dict[str, Any] = {
            "thread_id": snap.thread_id,
            "checkpoint_id": snap.checkpoint_id,
            "parent_id": snap.parent_id,
            "step": snap.step,
            "created_at": snap.created_at,
            "next": list(snap.next),
            "metadata": snap.metadata,
            "interruptions": [
                {"id": i.id, "node": i.node, "kind": i.kind, "value": i.value}
                for i in snap.interruptions
            ],
        }
        out["diff" if changes is not None else "values"] = (
            changes if changes is not None else snap.values
        )
        dump_json(out)
        return EXIT_OK
    _print_snapshot(snap)
    if changes is None:
        print("values:")
        for key, value in snap.values.items():
            print(f"  {key}: {short(value, 110)}")
        return EXIT_OK
    print(f"changes from {'parent ' + snap.parent_id if snap.parent_id else 'an empty state'}:")
    if not changes:
        print("  (none)")
    for c in changes:
        key = c["key"]
        if c["change"] == "added":
            print(f"  + {key}: {short(c['after'], 100)}")
        elif c["change"] == "removed":
            print(f"  - {key} (was {short(c['before'], 90)})")
        elif c["change"] == "appended":
            for item in c["items"]:
                print(f"  + {key}[]: {short(item, 100)}")
        else:
            print(f"  ~ {key}: {short(c['before'], 50)} -> {short(c['after'], 50)}")
    return EXIT_OK


async def _close_memory(memory: Any) -> None:
    close = getattr(memory, "aclose", None)
    if close is not None:
        await close()


async def cmd_prune(args: argparse.Namespace) -> int:
    """``graphexec prune (T | --all) --keep-last N``: drop old checkpoints and side branches."""
    if args.keep_last < 1:
        raise CliError(f"--keep-last must be at least 1, got {args.keep_last}")
    if bool(args.thread) == bool(args.all):
        raise CliError("name one thread to prune, or pass --all (and no thread)")
    _spec, graph = await graph_for(args, "prune")
    where = describe_store(args)
    deleted: dict[str, int] = {}
    async with open_store(args) as store:
        if args.thread:
            await thread_head(store, args.thread, where)
            threads = [args.thread]
        else:
            threads = [t.thread_id for t in await store.list_threads()]
        g = graph.with_checkpointer(store)
        progress = Progress("pruning threads", len(threads), enabled=not args.json)
        try:
            for tid in threads:
                deleted[tid] = await g.aprune(tid, keep_last=args.keep_last)
                progress.step(tid)
        finally:
            progress.close()
            await _close_memory(g.memory)
    if args.json:
        dump_json({"keep_last": args.keep_last, "deleted": deleted})
    else:
        total = sum(deleted.values())
        print(
            f"deleted {total} checkpoint(s) from {len(deleted)} thread(s), keeping the last "
            f"{args.keep_last} of each"
        )
    return EXIT_OK


async def cmd_expire(args: argparse.Namespace) -> int:
    """``graphexec expire``: delete threads past their TTL (or set one with ``--ttl``)."""
    where = describe_store(args)
    if args.ttl is not None and not args.thread:
        raise CliError("--ttl sets one thread's time-to-live: pass --thread T as well")
    ttl: float | None = None
    if args.ttl is not None:
        if args.ttl.lower() in ("none", "never"):
            ttl = None
        else:
            try:
                ttl = float(args.ttl)
            except ValueError as e:
                raise CliError(f"--ttl must be seconds or 'none', got {args.ttl!r}") from e
            try:
                ttl = validate_ttl(ttl, thread_id=args.thread)
            except InvalidTTLError as e:  # nan, inf, negative, over 100 years
                raise CliError(f"--ttl: {e}") from e
    async with open_store(args) as store:
        if args.thread:
            await thread_head(store, args.thread, where)
            await store.set_ttl(args.thread, ttl)
            message = (
                f"thread {args.thread} is kept until deleted"
                if ttl is None
                else f"thread {args.thread} expires {ttl:g} s after its last commit"
            )
            result: dict[str, Any] = {"thread_id": args.thread, "ttl": ttl}
        else:
            count = await store.expire()
            message = f"deleted {count} expired thread(s)"
            result = {"deleted": count}
    if args.json:
        dump_json(result)
    else:
        print(message)
    return EXIT_OK
