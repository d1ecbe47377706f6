"""The partitions' topology (exchanges/ingress_partitions.py): what the definitions hold, and
the plan keeping a consistent-hash exchange's bindings in bucket order."""

from __future__ import annotations

from deploy.rabbitmq import definitions as d
from deploy.rabbitmq import plan as p
from exchanges import topology as t
from exchanges.topology import Topology

PASSWORDS = {u: f"pw-{u}" for u in (t.ADMIN_USER, *d.SIDECAR_USERS)}
DEFS = d.build(Topology(), d.Endpoint("127.0.0.1", 5672), PASSWORDS[t.FEDERATION_USER])
PARTITIONS = [f"x-ingress.p{i:02d}" for i in range(16)]


def _hashed(steps: list[p.Step], method: str) -> list[str]:
    return [s.path.rsplit("/", 2)[1] if method == "DELETE" else s.path.rsplit("/", 1)[1] for s in steps
            if isinstance(s, p.Http) and s.method == method
            and s.path.startswith("api/bindings/gf-ingress/e/x-ingress.partition/")]


def test_the_definitions_partition_mqtt_positions_in_bucket_order() -> None:
    assert d.Exchange("gf-ingress", "x-ingress.partition", "x-consistent-hash") in DEFS.exchanges
    hashed = [b for b in DEFS.bindings if b.source == "x-ingress.partition"]
    assert [(b.queue, b.routing_key) for b in hashed] == [(q, "1") for q in PARTITIONS]
    retired = d.Binding("gf-ingress", "amq.topic", "x-ingress.positions", "positions.*.*")
    assert retired in DEFS.retired_bindings
    queues = {q.name: q for q in DEFS.queues if q.vhost == "gf-ingress"}
    assert all(queues[q].type == d.QUORUM and queues[q].single_active for q in PARTITIONS)
    assert set(PARTITIONS) <= set(d.input_queues(Topology(), "gf-ingress"))  # dead letters, limits


def test_a_missing_partition_binding_rebinds_them_all_in_order() -> None:
    every = {(b.vhost, b.source, b.queue, b.routing_key) for b in DEFS.bindings}
    current = p.Current(bindings=every - {("gf-ingress", "x-ingress.partition", "x-ingress.p05", "1")})
    steps = p.plan(DEFS, PASSWORDS, current)
    unbound = _hashed(steps, "DELETE")
    assert sorted(unbound) == [q for q in PARTITIONS if q != "x-ingress.p05"]
    assert _hashed(steps, "POST") == PARTITIONS
    first_bind = min(i for i, s in enumerate(steps) if isinstance(s, p.Http) and s.method == "POST"
                     and "x-ingress.partition/" in s.path)
    assert all(i < first_bind for i, s in enumerate(steps) if isinstance(s, p.Http) and s.method == "DELETE"
               and "x-ingress.partition/" in s.path)


def test_complete_partition_bindings_are_left_alone() -> None:
    every = {(b.vhost, b.source, b.queue, b.routing_key) for b in DEFS.bindings}
    steps = p.plan(DEFS, PASSWORDS, p.Current(bindings=every))
    assert _hashed(steps, "POST") == [] and _hashed(steps, "DELETE") == []
