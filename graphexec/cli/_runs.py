"""Commands that run graphs: run, resume, replay, fork, approve, reject, and draw."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from graphexec._graph import CompiledGraph
from graphexec._hitl import RunState
from graphexec._types import Command, Interruption, RunResult
from graphexec.cli._common import (
    EXIT_OK,
    CliError,
    checkpoint_of,
    describe_store,
    graph_for,
    json_arg,
    load_graph,
    open_store,
    print_result,
    thread_head,
)
from graphexec.cli._common import (
    terminal_safe as safe,
)
from graphexec.cli._threads import _close_memory

__all__ = [
    "cmd_approve",
    "cmd_draw",
    "cmd_fork",
    "cmd_reject",
    "cmd_replay",
    "cmd_resume",
    "cmd_run",
]


async def _execute(
    graph: CompiledGraph[Any],
    input: Any,
    args: argparse.Namespace,
    spec: str,
    *,
    checkpoint_id: str | None = None,
) -> RunResult:
    """Run with a progress line per finished node on stderr (unless ``--quiet``/``--json``)."""
    quiet = args.quiet or args.json
    run = graph.run_streamed(
        input,
        mode="updates",
        thread_id=args.thread,
        checkpoint_id=checkpoint_id,
        durability=args.durability,
        recursion_limit=args.recursion_limit,
        on_busy="wait" if args.wait else "raise",
        metadata={"graph": spec, "via": "cli"},
    )
    async for part in run:
        for node in part if not quiet else ():
            if node != "__interrupt__":
                print(f"  ran {node}", file=sys.stderr, flush=True)
    return run.result


async def cmd_run(args: argparse.Namespace) -> int:
    """``graphexec run MODULE:GRAPH --thread T --input JSON``: start (or continue) a thread."""
    payload = json_arg(args.input) if args.input is not None else None
    if payload is not None and not isinstance(payload, dict):
        raise CliError(f"--input must be a JSON object of state keys, got {type(payload).__name__}")
    _name, graph = load_graph(args.target)
    if payload is not None:
        _check_update(graph, "__input__", payload, "--input")
    async with open_store(args, create=True) as store:
        g = graph.with_checkpointer(store)
        try:
            result = await _execute(g, payload, args, args.target)
        finally:
            await _close_memory(g.memory)
    return print_result(result, args, args.target)


async def cmd_resume(args: argparse.Namespace) -> int:
    """``graphexec resume T [ID] [--value JSON]``: continue a thread from its last checkpoint."""
    value = json_arg(args.value, "--value") if args.value is not None else None
    if args.interrupt_id and args.value is None:
        raise CliError("an interrupt id answers an interrupt(): pass its answer with --value JSON")
    spec, graph = await graph_for(args, "resume")
    async with open_store(args) as store:
        tup = await thread_head(store, args.thread, describe_store(args))
        g = graph.with_checkpointer(store)
        try:
            if args.value is not None:
                snap = await g.aget_state(args.thread)
                assert snap is not None
                target = _pick(snap.interruptions, args.interrupt_id, ("input", "breakpoint"), args)
                command: Any = Command(resume={target.id: value})
            else:
                if not tup.checkpoint.next_nodes:
                    raise CliError(
                        f"thread {args.thread!r} has finished; start a new run with "
                        f"graphexec run {spec} --thread {args.thread} --input JSON"
                    )
                command = None
            result = await _execute(g, command, args, spec)
        finally:
            await _close_memory(g.memory)
    return print_result(result, args, spec)


async def cmd_replay(args: argparse.Namespace) -> int:
    """``graphexec replay T C``: re-execute from checkpoint C on a new branch of T."""
    spec, graph = await graph_for(args, "replay")
    async with open_store(args) as store:
        await checkpoint_of(store, args.thread, args.checkpoint, describe_store(args))
        g = graph.with_checkpointer(store)
        try:
            result = await _execute(g, None, args, spec, checkpoint_id=args.checkpoint)
        finally:
            await _close_memory(g.memory)
    return print_result(result, args, spec)


async def cmd_fork(args: argparse.Namespace) -> int:
    """``graphexec fork T C NEW``: copy thread T at checkpoint C into a new thread NEW."""
    spec, graph = await graph_for(args, "fork")
    where = describe_store(args)
    async with open_store(args) as store:
        await checkpoint_of(store, args.thread, args.checkpoint, where)
        if await store.get(args.new_thread) is not None:
            raise CliError(
                f"thread {args.new_thread!r} already exists in {where}; choose a new thread id"
            )
        g = graph.with_checkpointer(store)
        try:
            head = await g.afork(args.thread, args.checkpoint, args.new_thread)
        finally:
            await _close_memory(g.memory)
    if args.json:
        from graphexec.cli._common import dump_json

        dump_json(
            {
                "thread_id": args.new_thread,
                "checkpoint_id": head,
                "forked_from": {"thread_id": args.thread, "checkpoint_id": args.checkpoint},
            }
        )
    else:
        source = safe(f"{args.thread}@{args.checkpoint}")
        print(f"forked {source} into {safe(args.new_thread)} (head {head})")
        print(f"continue it with: graphexec resume {safe(args.new_thread)} --graph {spec}")
    return EXIT_OK


def _check_update(graph: CompiledGraph[Any], writer: str, update: Any, what: str) -> None:
    """``graph.check_update`` with its refusal as a user mistake (nothing is written yet)."""
    from graphexec.errors import InvalidUpdateError, SerializationError

    try:
        graph.check_update(writer, update)
    except (InvalidUpdateError, SerializationError) as e:
        raise CliError(f"{what} is refused: {e}") from e


def _check_edit(graph: CompiledGraph[Any], node: str, edit: Any, values: Any, thread: str) -> None:
    """Refuse an ``--edit`` the schema or a reducer would refuse, before anything is written."""
    from graphexec.errors import InvalidUpdateError, SerializationError

    try:
        graph._check_edited(node, edit, values)
    except (InvalidUpdateError, SerializationError) as e:
        raise CliError(
            f"--edit for node {node!r} of thread {thread!r} is refused: {e}; nothing was written"
        ) from e


def _pick(
    pending: tuple[Interruption, ...],
    wanted: str | None,
    kinds: tuple[str, ...],
    args: argparse.Namespace,
) -> Interruption:
    """The interruption ``wanted`` names (id or unique id prefix), or the only one of ``kinds``."""
    fitting = [i for i in pending if i.kind in kinds]
    listing = ", ".join(f"{i.id} ({i.kind} of {i.node})" for i in pending) or "none"
    if wanted is not None:
        matches = [i for i in pending if i.id == wanted] or [
            i for i in pending if i.id.startswith(wanted)
        ]
        if len(matches) != 1:
            problem = "matches several" if matches else "is not"
            raise CliError(
                f"interrupt id {wanted!r} {problem} pending on thread {args.thread!r}; pending: "
                f"{listing}"
            )
        return matches[0]
    if not fitting:
        what = " or ".join(kinds)
        raise CliError(f"thread {args.thread!r} is not waiting for {what}; pending: {listing}")
    if len(fitting) > 1:
        raise CliError(
            f"thread {args.thread!r} has {len(fitting)} pending; name one by id: {listing}"
        )
    return fitting[0]


async def _decide(args: argparse.Namespace, approve: bool) -> int:
    edit = json_arg(args.edit, "--edit") if getattr(args, "edit", None) is not None else None
    if edit is not None and not isinstance(edit, dict):
        raise CliError("--edit must be a JSON object of state keys to change before the node runs")
    if not approve and edit is not None:
        raise CliError("--edit applies to an approval, not to a rejection")
    command = "approve" if approve else "reject"
    spec, graph = await graph_for(args, command)
    async with open_store(args) as store:
        await thread_head(store, args.thread, describe_store(args))
        g = graph.with_checkpointer(store)
        try:
            snap = await g.aget_state(args.thread)
            assert snap is not None
            kinds = ("approval", "breakpoint") if approve else ("approval",)
            target = _pick(snap.interruptions, args.interrupt_id, kinds, args)
            state = RunState(
                thread_id=args.thread,
                checkpoint_id=snap.checkpoint_id,
                graph_name=g.name,
                graph_version=g.version,
                interruptions=snap.interruptions,
                _graph=g,
            )
            if approve and edit is not None:
                _check_edit(g, target.node, edit, snap.values, args.thread)
            if approve:
                state.approve(target.id, edited=edit, by=args.by)
            else:
                state.reject(target.id, reason=args.reason, by=args.by)
            result = await _execute(g, state, args, spec)
        finally:
            await _close_memory(g.memory)
    if not args.json:
        verb = "approved" if approve else "rejected"
        print(
            safe(f"{verb} {target.kind} of {target.node!r}" + (f" as {args.by}" if args.by else ""))
        )
    return print_result(result, args, spec)


async def cmd_approve(args: argparse.Namespace) -> int:
    """``graphexec approve T [ID] [--edit JSON] [--by NAME]`` (``--reject`` rejects)."""
    if args.reject:
        return await _decide(args, approve=False)
    if args.reason is not None:
        raise CliError("--reason goes with a rejection: graphexec reject T [ID] --reason R")
    return await _decide(args, approve=True)


async def cmd_reject(args: argparse.Namespace) -> int:
    """``graphexec reject T [ID] --reason R [--by NAME]``: skip the node; follow its on_reject."""
    return await _decide(args, approve=False)


async def cmd_draw(args: argparse.Namespace) -> int:
    """``graphexec draw MODULE:GRAPH [-o FILE]``: Mermaid text, or an SVG / PNG image."""
    _, graph = load_graph(args.target)
    if args.output is None:
        sys.stdout.write(graph.draw_mermaid())
        return EXIT_OK
    out = Path(args.output)
    suffix = out.suffix.lower()
    if suffix in (".mmd", ".mermaid", ".md"):
        text = graph.draw_mermaid()
        if suffix == ".md":
            text = f"```mermaid\n{text}```\n"
        data: bytes = text.encode()
    elif suffix == ".svg":
        data = graph.draw_svg().encode()
    elif suffix == ".png":
        data = _png(graph)
    else:
        raise CliError(
            f"cannot draw to {out.name!r}: use a .svg (built in), .png (needs matplotlib), "
            ".mmd or .md file, or no -o for Mermaid text on stdout"
        )
    if not out.parent.is_dir():
        raise CliError(f"cannot write {out}: directory {out.parent} does not exist")
    out.write_bytes(data)
    print(f"wrote {out} ({len(data)} bytes)")
    return EXIT_OK


def _png(graph: CompiledGraph[Any]) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise CliError(
            "PNG output needs matplotlib (pip install matplotlib); SVG needs nothing: -o graph.svg"
        ) from e
    import io

    import networkx as nx

    from graphexec._draw import _layers

    g = graph.to_networkx()
    pos: dict[Any, tuple[float, float]] = {}
    for row, nodes in enumerate(_layers(g)):
        for col, node in enumerate(nodes):
            pos[node] = (col - (len(nodes) - 1) / 2, -row)
    fig, ax = plt.subplots(figsize=(max(4, len(pos) * 0.9), max(3, len(pos) * 0.7)))
    nx.draw_networkx(
        nx.DiGraph(g),
        pos,
        ax=ax,
        node_color="#e8f0fe",
        edgecolors="#4a6fa5",
        node_size=1800,
        font_size=9,
        arrows=True,
    )
    ax.set_axis_off()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
