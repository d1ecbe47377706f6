"""The position an event was decided from, put in the event (`Event.position`, on the wire
`position: {lon, lat, ts, fields}`): what a consumer of ENTER / LEAVE / CROSS wants beside the
fact (where the object was, its speed or driver or load: the position's extra fields, up to
MAX_FIELDS_BYTES).

An event keeps the time of its position (`position_ts`); the rows routed in the same call are
where that position is (held rows released later are routed with the batch that opens them),
so the match is by (object, position time), the last such row winning (rows of one object at
one time are one observation). Events of timers and fence changes, decided from no row of the
batch, carry none.

Trade-off: a dict over the batch's rows of the objects that have an event, built once per routed
batch that has events; nothing is kept between batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exchanges.fence_events import SET_POSITION, Event, position_json
from exchanges.worker_batch import WorkerBatch


def attach(events: Sequence[Event], wb: WorkerBatch) -> None:
    if not events:
        return
    wanted = {(e.object_id, e.position_ts) for e in events}
    objects = {o for o, _ in wanted}
    pos = wb.positions
    ts = pos.ts.tolist()
    rows: dict[tuple[str, float], int] = {}
    for i, (o, t) in enumerate(zip(pos.ids, ts, strict=True)):
        if o in objects and (o, t) in wanted:
            rows[(o, t)] = i
    if not rows:
        return
    lon, lat, extra = pos.lon, pos.lat, pos.extra
    for e in events:
        row = rows.get((e.object_id, e.position_ts))
        if row is not None:
            fields: dict[str, Any] | None = extra[row] if row < len(extra) else None
            SET_POSITION(e, position_json(float(lon[row]), float(lat[row]), ts[row], fields))
