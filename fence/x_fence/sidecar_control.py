"""The x-fence sidecar's control queue (fence/x_fence/sidecar.py): `geofence inspect` answers and
the handover steps of `geofence worker add / remove / hot` (deploy/worker_ops.py).

Invariants:
- `inspect` reads the state and changes nothing; while the state is rebuilt in a thread
  (journal replay) it says how far, and reads nothing of the state;
- a handover step runs only once the session's state is ready, under the sidecar's lock, and
  IMPORT and FORGET are journaled (the pipeline drained) before they are answered: what the
  controller is told was taken or let go survives a crash;
- a bad request is answered with its error (the controller is waiting); a message that is no
  request at all is dead-lettered.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aio_pika.abc import AbstractIncomingMessage

from exchanges import control, shell
from exchanges import topology as t
from exchanges.batch import unpack
from exchanges.contract import BAD_INPUT, InvalidMessage
from exchanges.hash_ring import HashRing
from exchanges.state_dir import pack as journal_pack
from exchanges.state_dir import unpack as journal_unpack

if TYPE_CHECKING:  # the sidecar calls these with itself: no import of it at run time
    from fence.x_fence.sidecar import FenceSidecar

log = logging.getLogger("geofence")


async def handle_controls(sc: FenceSidecar, messages: Sequence[AbstractIncomingMessage]) -> None:
    outs = []
    for m in messages:
        try:
            msg = unpack(m.body)
            if msg["kind"] == control.INSPECT:
                answer = sc.inspect(msg)
            elif msg["kind"] in (control.EXPORT, control.IMPORT, control.FORGET):
                answer = await sc.hand_over(msg)
            else:
                raise InvalidMessage(f"unknown control kind {msg['kind']!r}")
            out = shell.reply(sc.out_ch, m, answer)
            if out is not None:
                outs.append(out)
        except BAD_INPUT as exc:
            outs.append(shell.dead_letter(sc.dlx, m, shell.reason_of(exc, "control"),
                                          t.fence_control_queue(sc.worker), sc.counters))
    await shell.publish_all(outs, sc.counters)


async def hand_over(sc: FenceSidecar, msg: dict[str, Any]) -> dict[str, Any]:
    """`geofence worker add / remove / hot` (deploy/worker_ops.py), with x-ingress paused and
    the pipeline drained: EXPORT the state the ring given gives to others (fences, or a hot
    fence's objects; a copy, base64 msgpack), IMPORT this worker's share of another's export, FORGET what
    the ring gives to others once it is in force; IMPORT and FORGET are journaled before
    the answer. A bad request is answered with its error (the controller is waiting)."""
    if not sc.ready:
        return {"worker": sc.worker, "error": "the worker is rebuilding its state (journal replay): "
                f"{sc.replayed[0]} of {sc.replayed[1]} records; ask again"}
    try:
        ring = HashRing.from_dict(msg["ring"])
        async with sc.lock:
            if msg["kind"] == control.EXPORT:
                data = sc.core.export(ring, bool(msg.get("gates", True)))
                return {"worker": sc.worker, "fences": len(data["whole"]),
                        "names": [name for name, _ in data["fences"]], "gates": len(data["gate_ids"]),
                        "pairs": len(data["since"]) // 8,
                        "state": base64.b64encode(journal_pack(data)).decode()}
            if msg["kind"] == control.IMPORT:
                data = journal_unpack(base64.b64decode(msg["state"]))
                n = sc.core.take(data, ring)
            else:
                n = sc.core.forget(ring)
                sc.ring, sc.ring_version = ring, int(msg.get("version", sc.ring_version))
            await sc._emit([])
            await sc.pipeline.drain()  # journaled before the answer
        log.info("handover (%s): %d %s", msg["kind"], n,
                 "inside pairs taken" if msg["kind"] == control.IMPORT else "fences let go")
        return {"worker": sc.worker, "fences" if msg["kind"] == control.FORGET else "pairs": n,
                "stats": sc.core.stats()}
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        log.error("handover request refused: %s: %s", type(exc).__name__, exc)
        return {"worker": sc.worker, "error": f"{type(exc).__name__}: {exc}"}


def inspect(sc: FenceSidecar, msg: dict[str, Any]) -> dict[str, Any]:
    """An `inspect` request's answer (deploy/inspect_cmd.py): the worker's state, and on request
    a fence's, an object's, the fences, the counts, the proximity matcher's."""
    if sc.recovering:  # the state is being rebuilt in a thread: how far, nothing of it
        return {"worker": sc.worker, "recovering": {"replayed": sc.replayed[0],
                                                    "records": sc.replayed[1]},
                "counters": sc.counters.to_json(), "ring_version": sc.ring_version}
    out: dict[str, Any] = {"worker": sc.worker, "stats": sc.core.stats(),
                           "counters": sc.counters.to_json(), "ring_version": sc.ring_version}
    if sc.replica is not None:  # the process running the worker (host/pid/...) and its stream
        out["master"] = {"process": sc.replica.master, "stream": sc.replica.queue,
                         "generation": sc.replica.generation}
    if sc.journal is not None:
        out["journal"] = {"dir": str(sc.journal.path), "generation": sc.journal.generation,
                          "journal_bytes": sc.journal.journal_bytes,
                          "records_written": sc.journal.records_written}
    fence_id = msg.get("fence_id")
    if fence_id is not None:
        d = sc.core.fence(str(fence_id))
        out["fence"] = None if d is None else {
            "id": d.fence_id, "version": d.version, "name": d.name, "timeout_s": d.timeout_s,
            "hysteresis_m": d.hysteresis_m, "dwell_s": d.dwell_s,
            "occupants": sc.core.occupants(d.fence_id)}
    object_id = msg.get("object_id")
    if object_id is not None:
        out["object"] = {"id": object_id, "fences": sc.core.fences_of(str(object_id)),
                         "last_seen": sc.core.last_seen(str(object_id))}
    if msg.get("fences"):
        out["fences"] = sc.core.fences()
    if msg.get("counts"):
        out["counts"] = sc.core.counts()
    if sc.roam is not None:
        out["proximity"] = {"subscriptions": len(sc.roam.subscriptions()),
                            "held": len(sc.roam.held())}
        if msg.get("roam"):
            out["proximity"].update(ids=[s.id for s in sc.roam.subscriptions()],
                                    near_pairs=sorted(map(list, sc.roam.near_pairs())),
                                    positions=sc.roam.held())
    return out
