"""What an x-ingress instance keeps of a batch and what it hands on (no I/O).

With several x-ingress instances (exchanges/ingress_partitions.py), each consumes the
partition queues it owns. Two kinds of positions reach an instance that is not theirs:
- a gateway batch holds many objects, and the first instance (x-ingress) takes every gateway
  batch: the positions of partitions another instance owns go to those partitions' queues,
  one message per partition, so an object's gateway positions are routed by the instance that
  routes its MQTT positions;
- the proximity router (ingress/proximity.py) is the first instance's: the others hand it the
  positions of tenants that have a proximity subscription, through x-ingress.proximity.

Both hand-ons are batches in the wire form (exchanges/batch.py, kind `handed-on`), already
validated and tenant-qualified, published to the default exchange: a device can publish only
to amq.topic, never to the default exchange, so a message that came that way is x-ingress's
own (`handed_on`), and is read without validating it again.

Trade-off: a handed-on position takes one more queue hop (the first instance publishes it, the
owner consumes it); in exchange no position is judged by two instances, so an object's
memory (region, entry, proximity) stays in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch, unpack
from exchanges.tenancy import SEP, tenant_of

HANDED_ON = "handed-on"
DEFAULT_EXCHANGE = ""  # where hand-ons are published: no client of the stack may publish there


def handed_on(message: Any) -> bool:
    """Published by an x-ingress instance (see the module's docstring)."""
    return (getattr(message, "exchange", None) or "") == DEFAULT_EXCHANGE


def read_handed_on(body: bytes) -> tuple[PositionBatch, str | None, int]:
    """The positions, the sending process's token and the hand-on's number (0: none); ValueError
    if the body is not a hand-on."""
    d = unpack(body)
    if d["kind"] != HANDED_ON or not isinstance(d.get("batch"), dict):
        raise ValueError(f"a message on the default exchange that is not a hand-on (kind {d['kind']!r})")
    origin, seq = d.get("origin"), d.get("seq", 0)
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ValueError(f"a hand-on numbered {seq!r}")
    return PositionBatch.from_wire(d["batch"]), origin if isinstance(origin, str) else None, seq


def split(batch: PositionBatch, partitions: npt.NDArray[np.int64], owned: npt.NDArray[np.bool_]
          ) -> tuple[PositionBatch, dict[int, PositionBatch]]:
    """`batch` as what this instance keeps (`owned[partition]`) and, per partition it does not
    own, that partition's positions; each keeps the batch's order."""
    mine = owned[partitions]
    if mine.all():
        return batch, {}
    others: dict[int, PositionBatch] = {}
    rest = partitions[~mine]
    idx = np.flatnonzero(~mine)
    for p in np.unique(rest).tolist():
        others[int(p)] = batch.take(idx[rest == p])
    return batch.take(np.flatnonzero(mine)), others


def of_tenants(batch: PositionBatch, tenants: frozenset[str]) -> PositionBatch:
    """The positions of objects of `tenants` (the proximity router's share)."""
    if not tenants or not len(batch):
        return batch.take(np.empty(0, np.int64))
    if len(tenants) == 1:
        prefix = next(iter(tenants)) + SEP
        keep = np.fromiter((i.startswith(prefix) for i in batch.ids), bool, len(batch))
    else:
        keep = np.fromiter((tenant_of(i) in tenants for i in batch.ids), bool, len(batch))
    return batch if keep.all() else batch.take(np.flatnonzero(keep))


def runs(messages: Sequence[Any], kind: Callable[[Any], bool]) -> list[tuple[bool, int, int]]:
    """(kind, start, end) of each run of consecutive messages of one kind, in order."""
    out: list[tuple[bool, int, int]] = []
    for i, m in enumerate(messages):
        k = kind(m)
        if out and out[-1][0] == k:
            out[-1] = (k, out[-1][1], i + 1)
        else:
            out.append((k, i, i + 1))
    return out
