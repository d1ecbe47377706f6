"""The /ops page's figures from Prometheus' answers (fence/ops.shape, pure)."""

from __future__ import annotations

from fence.ops import QUERIES, SERIES, STEP_S, shape


def vector(*rows: tuple[dict[str, str], float | str]) -> list[dict[str, object]]:
    return [{"metric": m, "value": [0, str(v)]} for m, v in rows]


def answers() -> dict[str, list[dict[str, object]]]:
    got: dict[str, list[dict[str, object]]] = {k: [] for k in QUERIES}
    got["up"] = vector(({"name": "x-fence-w0"}, 1), ({"name": "x-ingress"}, 0))
    got["received"] = vector(({"name": "x-fence-w0", "role": "x-fence"}, 12.5))
    got["positions"] = vector(({"name": "x-fence-w0"}, 100.0))
    got["objects"] = vector(({"name": "x-fence-w0"}, 42))
    q = {"vhost": "gf-fences", "queue": "x-fence.w0"}
    got["queues"] = vector((q, 7), ({"vhost": "gf-ingress", "queue": "x-ingress.positions"}, 30))
    got["ready"] = vector((q, 5), ({"vhost": "gf-ingress", "queue": "x-ingress.positions"}, 30))
    got["unacked"] = vector((q, 2))
    got["dead_letters"] = vector(({"role": "x-ingress", "reason": "lat N is outside [N, N]"}, 9))
    got["dead_letters_15m"] = vector(({"role": "x-ingress", "reason": "lat N is outside [N, N]"}, 4))
    got["p99"] = vector(({}, 0.0425))
    got["p50"] = vector(({}, "NaN"))
    return got


def test_the_answers_become_the_pages_figures() -> None:
    now, start = 1000.0, 1000.0 - 3 * STEP_S
    ranges = {name: {start: 1.0, start + STEP_S: None, now: 3.0} for name in SERIES}
    alerts = [{"labels": {"alertname": "GeofenceRoleDown"}, "state": "firing",
               "annotations": {"summary": "x-ingress does not answer"}}]
    d = shape(answers(), ranges, alerts, now, start)
    assert [p["name"] for p in d["processes"]] == ["x-fence-w0", "x-ingress"]
    w0, ingress = d["processes"]
    assert (w0["up"], w0["role"], w0["received_per_s"], w0["positions"], w0["objects"]) == (
        True, "x-fence", 12.5, 100.0, 42)
    assert (ingress["up"], ingress["received_per_s"], ingress["objects"]) == (False, None, None)
    assert [(q["queue"], q["ready"], q["unacked"]) for q in d["queues"]] == [
        ("x-ingress.positions", 30, None), ("x-fence.w0", 5, 2)]
    assert d["dead_letters"] == [{"role": "x-ingress", "reason": "lat N is outside [N, N]", "total": 9,
                                  "last_15m": 4}]
    assert d["latency_ms"] == {"p50": None, "p99": 42.5}  # NaN (no events) is no figure
    assert d["series"]["t"] == [start + i * STEP_S for i in range(4)]
    assert d["series"]["updates_per_s"] == [1.0, None, None, 3.0]  # gaps stay gaps
    assert d["alerts"] == [{"name": "GeofenceRoleDown", "state": "firing",
                            "summary": "x-ingress does not answer"}]


def test_a_process_that_answers_but_consumes_nothing_is_down_unless_it_waits_on_purpose() -> None:
    """A session that lost its consumer answers /metrics all the same: the page says it is not
    consuming (issue 34: w1 had 0 consumers for 45 minutes and showed as up)."""
    got = answers()
    got["up"] = vector(({"name": "x-fence-w0"}, 1), ({"name": "x-fence-w1"}, 1), ({"name": "x-fence-w2"}, 1),
                       ({"name": "fence-api"}, 1))
    got["consuming"] = vector(({"name": "x-fence-w0"}, 1), ({"name": "x-fence-w1"}, 0),
                              ({"name": "x-fence-w2"}, 0))
    got["recovering"] = vector(({"name": "x-fence-w2", "__name__": "geofence_recovering"}, 1))
    d = shape(got, {}, [], 1000.0, 1000.0)
    states = {p["name"]: (p["state"], p["up"]) for p in d["processes"]}
    assert states == {"x-fence-w0": ("up", True), "x-fence-w1": ("not consuming", False),
                      "x-fence-w2": ("recovering", True), "fence-api": ("up", True)}


def test_each_webhook_endpoint_gets_a_row() -> None:
    got = answers()
    ep = {"endpoint": "wh-0123456789abcdef", "tenant": "fleet"}
    off = {"endpoint": "wh-fedcba9876543210", "tenant": "depot"}
    got["wh_enabled"] = vector((ep, 1), (off, 0))
    got["wh_delivered"] = vector(({"endpoint": ep["endpoint"]}, 120.5))
    got["wh_backlog"] = vector((ep, 3), (off, 40))
    got["wh_lag_p99"] = vector(({"endpoint": ep["endpoint"]}, 0.25), ({"endpoint": off["endpoint"]}, "NaN"))
    got["wh_dead"] = vector((off, 2))
    rows = shape(got, {}, [], 1000.0, 100.0)["webhooks"]
    assert rows == [
        {"endpoint": ep["endpoint"], "tenant": "fleet", "enabled": True, "delivered_per_s": 120.5,
         "failed_per_s": None, "backlog": 3, "oldest_s": None, "lag_p99_ms": 250.0, "dead": None},
        {"endpoint": off["endpoint"], "tenant": "depot", "enabled": False, "delivered_per_s": None,
         "failed_per_s": None, "backlog": 40, "oldest_s": None, "lag_p99_ms": None, "dead": 2}]
