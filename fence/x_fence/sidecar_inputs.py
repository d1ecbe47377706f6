"""The x-fence sidecar's input queue read into steps (fence/x_fence/sidecar.py applies them):
runs of position parts, fence definitions and deletes, proximity messages, drain barriers.

Invariants:
- the steps keep the queue's order: consecutive position parts are one step (routed
  together), and a definition's re-check rows are the step right behind it;
- a run of consecutive proximity `rows` messages is one step (one matcher call); any other
  proximity message is a step of its own;
- a message that does not fit is dead-lettered with its reason here, and is in no step: the
  caller acks it with the batch (nothing silently dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from exchanges import control, shell
from exchanges import topology as t
from exchanges.batch import unpack
from exchanges.contract import BAD_INPUT, InvalidMessage
from exchanges.roam_routing import ROAM
from exchanges.worker_batch import WorkerBatch
from fence.x_fence import roaming

POSITIONS = "positions"


@dataclass
class RoamStep:
    """Proximity messages applied as one step: one message, or a run of `rows` decoded (a
    message that does not fit is dead-lettered when read)."""

    messages: list[AbstractIncomingMessage]
    msgs: list[dict[str, Any]]
    rows: list[roaming.Rows]

    def add(self, message: AbstractIncomingMessage, msg: dict[str, Any], rows: roaming.Rows) -> None:
        self.messages.append(message)
        self.msgs.append(msg)
        self.rows.append(rows)


Step = list[WorkerBatch] | control.Define | control.Drop | RoamStep


@dataclass
class Inputs:
    """A batch of the input queue read: its steps in queue order, the drain barriers to answer
    once the steps before them are applied, and the dead letters of what did not fit."""

    steps: list[Step]
    barriers: list[dict[str, Any]]
    outs: list[shell.Out | shell.Plains]


def read_inputs(messages: Sequence[AbstractIncomingMessage], worker: str, dlx: AbstractExchange,
                counters: shell.Counters) -> Inputs:
    """Runs of position parts are routed together; definitions apply between them."""
    outs: list[shell.Out | shell.Plains] = []
    # in queue order; a proximity message with its input message (dead-lettered if it does not fit)
    steps: list[Step] = []
    barriers: list[dict[str, Any]] = []  # answered once the steps before are applied
    for m in messages:
        try:
            msg = unpack(m.body)
            if msg["kind"] == control.BARRIER:
                barriers.append({"barrier": str(msg["barrier"]), "region": str(msg["region"]),
                                 "reply": str(msg["reply"])})
                continue
            if msg["kind"] == ROAM:
                if not isinstance(msg.get("op"), str):
                    raise InvalidMessage("a proximity message without its op")
                rows = roaming.Rows.of(msg) if msg["op"] == "rows" else None
                if rows is not None and steps and isinstance(steps[-1], RoamStep) and steps[-1].rows:
                    steps[-1].add(m, msg, rows)  # a run of rows: one matcher call
                else:
                    steps.append(RoamStep([m], [msg], [rows] if rows is not None else []))
                continue
            if msg["kind"] == POSITIONS:
                parts = [WorkerBatch.from_wire(p) for p in msg["parts"]]
                if not parts or any(p.worker != worker for p in parts):
                    raise InvalidMessage(f"a positions message whose parts are not all for worker "
                                         f"{worker} ({len(parts)} parts)")
                if steps and isinstance(steps[-1], list):
                    steps[-1] += parts
                else:
                    steps.append(parts)
            else:
                change = control.parse(msg)
                recheck = change.recheck if isinstance(change, control.Define) else None
                if recheck is not None and recheck.worker != worker:
                    raise InvalidMessage(f"re-check rows for worker {recheck.worker}, not {worker}")
                steps.append(change)
                if recheck is not None:
                    steps.append([recheck])  # right behind its definition
        except BAD_INPUT as exc:
            outs.append(shell.dead_letter(dlx, m, shell.reason_of(exc, "message"),
                                          t.fence_queue(worker), counters))
    return Inputs(steps, barriers, outs)
