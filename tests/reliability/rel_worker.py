"""Subprocess side of the reliability battery (not a test module).

    python rel_worker.py SPEC_JSON

``SPEC_JSON``: ``{"store": <Backend.spec>, "workflow": ..., "durability": ..., "folder": ...,
"thread": ..., "nap_scale": 1.0}``. The worker opens the store (and, for the ``memory``
workflow, the SQLite memory file in ``folder``), starts the thread if it has no checkpoint yet or
resumes it, answers every approval and interrupt, and runs it to its end. It prints ``READY``,
then ``COMMIT <step>`` after each root checkpoint event and ``END <node>`` after each task, and
``DONE`` at the end; a failed run prints ``ERROR <ExceptionType> <message>`` and exits with 3.
The parent kills it with SIGKILL at random moments and starts the next generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "integration"))

import rel_workflows as flows
from rel_backends import open_spec


def _print(line: str) -> None:
    print(line, flush=True)


async def main(spec: dict[str, Any]) -> None:
    folder = Path(spec["folder"])
    flows.NAP_SCALE = float(spec.get("nap_scale", 1.0))
    async with contextlib.AsyncExitStack() as stack:
        cp = await stack.enter_async_context(open_spec(spec["store"]))
        mem = None
        if spec["workflow"] == "memory":
            from memory import SqliteMemory

            mem = await stack.enter_async_context(SqliteMemory.open(folder / "memory.db"))
        graph = flows.build(spec["workflow"], cp, mem, folder)
        thread = spec["thread"]
        fresh = await cp.get(thread) is None

        def on_event(event: dict[str, Any]) -> None:
            if event["event"] == "checkpoint" and event["ns"] == "":
                _print(f"COMMIT {event['step']}")
            elif event["event"] == "task_end":
                _print(f"END {event['node']}")

        _print("READY")
        try:
            await flows.drive(
                graph, thread, durability=spec["durability"], fresh=fresh, on_event=on_event
            )
        except Exception as e:
            _print(f"ERROR {type(e).__name__} {e}".replace("\n", " "))
            sys.exit(3)
        _print("DONE")


if __name__ == "__main__":
    try:
        asyncio.run(main(json.loads(sys.argv[1])))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
