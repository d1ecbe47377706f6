"""deploy/dead_letters.py (the core of `geofence dlq`) and the pure helpers of deploy/dlq_cmd.py.

The broker-style headers below are the shapes RabbitMQ 3.10 produced in an experiment (a
quorum queue with x-delivery-limit 2, and a classic queue with a reject): `x-death` most
recent first, `time` decoded by aio-pika as an aware datetime, no `x-delivery-count` kept.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

import pytest

from deploy import dead_letters as dl
from deploy import dlq_cmd
from deploy.cli import build_parser, main
from exchanges.shell import reason_key

T0 = dt.datetime(2026, 11, 22, 12, 56, 45, tzinfo=dt.UTC)
NOW = 1_800_000_000.0


def sidecar_headers(reason: str = "lat 91 is outside [-90, 90]", source: str = "x-ingress.positions",
                    routing_key: str = "positions.acme.obj-1", **app: Any) -> dict[str, Any]:
    return {**app, "x-geofence-reason": reason, "x-geofence-source": source,
            "x-geofence-routing-key": routing_key}


def broker_headers(reason: str = "delivery_limit", queue: str = "x-ingress.positions", count: int = 1,
                   routing_keys: list[str] | None = None, exchange: str = "amq.topic",
                   **app: Any) -> dict[str, Any]:
    keys = ["positions.acme.obj-1"] if routing_keys is None else routing_keys
    return {**app,
            "x-death": [{"count": count, "reason": reason, "queue": queue, "time": T0,
                         "exchange": exchange, "routing-keys": keys}],
            "x-first-death-exchange": exchange, "x-first-death-queue": queue,
            "x-first-death-reason": reason}


def raw(headers: dict[str, Any], body: bytes = b'{"lon": 9.5, "lat": 91, "ts": 1.8e9}',
        vhost: str = "gf-ingress", routing_key: str | None = None, content_type: str | None = None,
        message_id: str | None = "m-1") -> dl.RawMessage:
    return dl.RawMessage(vhost, body, headers, routing_key, content_type, message_id)


def letter(headers: dict[str, Any], **kw: Any) -> dl.DeadLetter:
    return dl.parse(raw(headers, **kw))


# --------------------------------------------------------------------------- parsing: sidecar


def test_a_sidecar_dead_letter() -> None:
    x = letter(sidecar_headers(app="kept"), routing_key="x-ingress.positions",
               content_type="application/json")
    assert x.kind == "sidecar"
    assert x.reason == "lat 91 is outside [-90, 90]"
    # counted as the sidecars count it (exchanges.shell.reason_key: numbers blanked)
    assert x.reason_key == reason_key(x.reason) and x.reason_key.startswith("lat N is outside [N")
    assert x.group == f"'{x.reason_key}'"
    assert x.source == "x-ingress.positions"
    assert x.routing_key == "positions.acme.obj-1"  # the original, not the dead-letters one
    assert x.exchange is None and x.time is None and x.deaths == 0
    assert x.replays == 0 and x.last_reason is None and x.replayed_at is None
    assert x.size == len(b'{"lon": 9.5, "lat": 91, "ts": 1.8e9}')
    assert x.content_type == "application/json" and x.message_id == "m-1"
    assert x.preview == '{"lon": 9.5, "lat": 91, "ts": 1.8e9}'
    assert x.vhost == "gf-ingress" and x.replayable


def test_header_values_that_are_not_utf8_come_as_bytes_and_are_read() -> None:
    x = letter(sidecar_headers(reason="bad \xe9", source="fence.api") | {
        "x-geofence-reason": b"bad \xe9", "x-geofence-routing-key": b"k"})
    assert x.reason == "bad \ufffd"
    assert x.routing_key == "k" and x.source == "fence.api"


def test_an_empty_routing_key_is_kept_as_empty() -> None:
    # what comes through the retired fanout ingress.batches (before tenants) has routing key ""
    reason = "routing key '' is not a tenant (a gateway publishes its batches on ingress.gateway ...)"
    x = letter(sidecar_headers(reason, "x-ingress.batches", ""))
    assert x.routing_key == ""
    assert x.reason == reason and x.reason_key.startswith("routing key '…' is not a tenant")


def test_a_gateway_batch_is_replayed_with_its_tenant() -> None:
    """A gateway's batch comes on ingress.gateway with its tenant as the routing key, which
    x-ingress qualifies the ids by: a replay keeps it (the same tenant's objects again)."""
    headers = sidecar_headers("1 of 2 positions refused: position 0: lat 91 is outside [-90, 90]",
                              "x-ingress.batches", "acme")
    x = letter(headers, routing_key="x-ingress.batches")  # its key in dead-letters is the source
    assert x.routing_key == "acme"
    r = dl.replay_of(x, headers, {}, NOW)
    assert (r.queue, r.routing_key) == ("x-ingress.batches", "acme")


@pytest.mark.parametrize("source", [None, ""])
def test_a_sidecar_dead_letter_without_a_source_is_not_replayable(source: str | None) -> None:
    headers = {"x-geofence-reason": "odd"} if source is None else {"x-geofence-reason": "odd",
                                                                    "x-geofence-source": source}
    x = letter(headers)
    assert x.kind == "sidecar" and x.source is None and not x.replayable
    with pytest.raises(dl.NotReplayable, match=r"no known source queue.*x-geofence-source"):
        dl.replay_of(x, headers, {}, NOW)


# --------------------------------------------------------------------------- parsing: broker


def test_a_broker_dead_letter_after_the_delivery_limit() -> None:
    headers = broker_headers(app="x") | {"x-geofence-replays": 1}
    x = letter(headers, routing_key="positions.acme.obj-1", message_id="m1")
    assert x.kind == "broker"
    assert x.reason == "delivery_limit (by the broker, from x-ingress.positions)"
    assert x.reason_key == "delivery_limit" and x.group == "delivery_limit"
    assert x.source == "x-ingress.positions"
    assert x.routing_key == "positions.acme.obj-1"
    assert x.exchange == "amq.topic"
    assert x.time == T0
    assert x.deaths == 1
    assert x.replays == 1


def test_a_broker_reason_says_how_many_times_and_the_delivery_count_when_known() -> None:
    x = letter(broker_headers("rejected", "fence.archive", count=3) | {"x-delivery-count": 4})
    assert x.reason == "rejected (by the broker, from fence.archive, delivery count 4, dead-lettered 3 times)"
    assert x.deaths == 3


def test_the_first_death_is_mentioned_when_it_differs_from_the_last() -> None:
    headers = broker_headers("maxlen", "x-geo.positions")
    headers["x-death"].append({"count": 1, "reason": "expired", "queue": "q0", "time": T0,
                               "exchange": "", "routing-keys": ["q0"]})
    headers |= {"x-first-death-reason": "expired", "x-first-death-queue": "q0"}
    x = letter(headers)
    assert x.reason_key == "maxlen" and x.source == "x-geo.positions"  # the most recent death
    assert x.reason == "maxlen (by the broker, from x-geo.positions, first: expired from q0)"


def test_only_the_first_death_headers() -> None:
    x = letter({"x-first-death-reason": "expired", "x-first-death-queue": "fence.follow",
                "x-first-death-exchange": "fence.follow"}, routing_key="rk")
    assert x.kind == "broker"
    assert x.reason == "expired (by the broker, from fence.follow)"
    assert x.source == "fence.follow" and x.exchange == "fence.follow"
    assert x.routing_key == "rk"  # the broker keeps the original routing key
    assert x.time is None and x.deaths == 1


def test_an_epoch_time_is_read_too() -> None:
    headers = broker_headers()
    headers["x-death"][0]["time"] = 1_700_000_000
    assert letter(headers).time == dt.datetime.fromtimestamp(1_700_000_000, dt.UTC)
    headers["x-death"][0]["time"] = dt.datetime(2026, 1, 1, 0, 0, 0)  # naive: UTC
    assert letter(headers).time == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_x_death_without_routing_keys_takes_the_message_routing_key() -> None:
    headers = broker_headers()
    del headers["x-death"][0]["routing-keys"]
    assert letter(headers, routing_key="positions.acme.o2").routing_key == "positions.acme.o2"


@pytest.mark.parametrize("x_death", ["garbage", [1, "two"], [], {"reason": "x"}])
def test_malformed_x_death_is_survived(x_death: Any) -> None:
    x = letter({"x-death": x_death, "x-first-death-reason": "rejected", "x-first-death-queue": "q"})
    assert x.kind == "broker" and x.reason_key == "rejected" and x.source == "q"
    bare = letter({"x-death": x_death})  # no usable entry, no x-first-death-*: nothing known
    assert (bare.kind, bare.source) == ("unknown", None)


def test_garbage_count_in_x_death() -> None:
    headers = broker_headers()
    headers["x-death"][0]["count"] = "many"
    assert letter(headers).deaths == 1


def test_the_sidecar_reason_wins_when_both_styles_are_present() -> None:
    x = letter(broker_headers("rejected", "q-old") | sidecar_headers("bad", "x-ingress.batches", ""))
    assert x.kind == "sidecar" and x.reason == "bad" and x.source == "x-ingress.batches"
    assert x.time is None and x.exchange is None


# --------------------------------------------------------------------------- parsing: unknown


def test_a_message_with_neither_style_is_unknown_and_refused() -> None:
    x = letter({"app": 1}, routing_key="whatever")
    assert (x.kind, x.reason, x.reason_key, x.source, x.routing_key) == (
        "unknown", "unknown", "unknown", None, None)
    assert not x.replayable
    with pytest.raises(dl.NotReplayable, match="neither x-geofence-\\* nor x-death headers"):
        dl.replay_of(x, {"app": 1}, {}, NOW)


@pytest.mark.parametrize(("value", "expected"), [(2, 2), ("3", 3), (b"4", 4), ("abc", 0), (True, 0),
                                                 (-1, 0), (None, 0), (2.5, 0)])
def test_the_replays_counter_is_read_defensively(value: Any, expected: int) -> None:
    assert letter(sidecar_headers() | {"x-geofence-replays": value}).replays == expected


# --------------------------------------------------------------------------- replaying


def test_replay_headers_and_target() -> None:
    headers = sidecar_headers("lat 91 is outside [-90, 90]", "x-ingress.positions", "positions.acme.obj-1",
                              app="kept", other=[1, 2]) | {"x-delivery-count": 3}
    x = letter(headers)
    props = {"content_type": "application/json", "message_id": "m-1", "correlation_id": None,
             "user_id": "somebody", "expiration": "60000", "priority": 0, "timestamp": T0}
    r = dl.replay_of(x, headers, props, NOW)
    assert (r.vhost, r.queue, r.routing_key) == ("gf-ingress", "x-ingress.positions", "positions.acme.obj-1")
    assert r.headers == {"app": "kept", "other": [1, 2], "x-geofence-replays": 1,
                         "x-geofence-last-reason": "lat 91 is outside [-90, 90]",
                         "x-geofence-replayed-at-ms": 1_800_000_000_000}
    assert r.properties == {"content_type": "application/json", "message_id": "m-1", "priority": 0,
                            "timestamp": T0}


def test_a_replay_never_carries_a_delivery_count() -> None:
    """A sidecar that dead-letters a message from a quorum queue copies its x-delivery-count;
    a classic queue would deliver a replay with it unchanged, and the sidecars take a message
    delivered twice before for a suspect (exchanges.shell.delivery_count)."""
    headers = sidecar_headers("internal error on delivery 3: boom", "x-ingress.positions") | {
        "x-delivery-count": 2}
    x = letter(headers)
    assert x.kind == "sidecar" and x.reason == "internal error on delivery 3: boom"
    assert "x-delivery-count" not in dl.replay_of(x, headers, {}, NOW).headers


def test_replaying_a_broker_dead_letter_removes_every_death_header() -> None:
    headers = broker_headers(app="a") | {"x-last-death-reason": "delivery_limit",
                                         "x-last-death-queue": "x-ingress.positions",
                                         "x-geofence-replays": 2, "x-geofence-last-reason": "older",
                                         "x-geofence-replayed-at-ms": 1_799_999_940_000}
    x = letter(headers)
    r = dl.replay_of(x, headers, {}, NOW)
    assert r.queue == "x-ingress.positions" and r.routing_key == "positions.acme.obj-1"
    assert r.headers == {"app": "a", "x-geofence-replays": 3,
                         "x-geofence-last-reason": "delivery_limit (by the broker, from x-ingress.positions)",
                         "x-geofence-replayed-at-ms": 1_800_000_000_000}


def test_a_replayed_message_that_fails_again_is_recognisable() -> None:
    first = sidecar_headers("malformed JSON: x", "x-ingress.batches", "", app="a")
    replay = dl.replay_of(letter(first), first, {}, NOW)
    # what exchanges.shell.dead_letter does with it: its headers, plus the new reason and source
    again = {**replay.headers, "x-geofence-reason": "malformed JSON: y",
             "x-geofence-source": "x-ingress.batches", "x-geofence-routing-key": ""}
    x = letter(again)
    assert (x.replays, x.last_reason, x.reason) == (1, "malformed JSON: x", "malformed JSON: y")
    assert x.replayed_at == NOW
    assert dl.replayed_since(x, NOW) and dl.replayed_since(x, NOW - 1) and not dl.replayed_since(x, NOW + 1)
    assert not dl.replayed_since(letter(first), 0.0)
    assert dl.replay_of(x, again, {}, NOW + 5).headers["x-geofence-replays"] == 2


def test_the_replay_time_is_an_integer_of_milliseconds() -> None:
    """pamqp encodes a float header as a 32-bit float: 1.8e9 seconds would lose ~2 minutes."""
    headers = sidecar_headers()
    r = dl.replay_of(letter(headers), headers, {}, 1_795_352_639.1239)
    value = r.headers["x-geofence-replayed-at-ms"]
    assert type(value) is int and value == 1_795_352_639_123
    back = letter({**r.headers, **sidecar_headers()})
    assert back.replayed_at == 1_795_352_639.123
    assert dl.replayed_since(back, 1_795_352_639.1231)  # the same millisecond
    assert not dl.replayed_since(back, 1_795_352_639.124)
    assert letter(headers | {"x-geofence-replayed-at-ms": "garbage"}).replayed_at is None


def test_a_long_reason_is_cut_in_the_last_reason_header() -> None:
    headers = sidecar_headers("r" * 5000)
    assert dl.replay_of(letter(headers), headers, {}, NOW).headers["x-geofence-last-reason"] == "r" * 1000


def test_without_an_original_routing_key_the_replay_uses_the_queue_name() -> None:
    headers = {"x-geofence-reason": "bad", "x-geofence-source": "fence.api"}
    r = dl.replay_of(letter(headers), headers, {}, NOW)
    assert (r.queue, r.routing_key) == ("fence.api", "fence.api")


def test_a_broker_dead_letter_without_a_queue_is_refused() -> None:
    headers = {"x-first-death-reason": "rejected"}
    x = letter(headers)
    assert x.kind == "broker" and x.source is None
    with pytest.raises(dl.NotReplayable, match="no x-death queue"):
        dl.replay_of(x, headers, {}, NOW)


@pytest.mark.parametrize(("name", "dropped"), [
    ("x-death", True), ("x-first-death-queue", True), ("x-last-death-exchange", True),
    ("x-delivery-count", True), ("x-geofence-reason", True), ("x-geofence-source", True),
    ("x-geofence-routing-key", True), ("x-geofence-replays", True), ("x-geofence-other", False),
    ("x-deathly", False), ("app", False), ("x-match", False)])
def test_which_headers_a_replay_drops(name: str, dropped: bool) -> None:
    assert dl.is_dead_letter_header(name) is dropped


# --------------------------------------------------------------------------- filters


def test_filters() -> None:
    a = letter(sidecar_headers("lat 91 is outside [-90, 90]", "x-ingress.positions"), message_id="a")
    b = letter(sidecar_headers("Malformed JSON: oops", "x-ingress.batches"), vhost="gf-region-a",
               message_id="b")
    c = letter(broker_headers("delivery_limit", "x-ingress.positions"), message_id="c")
    u = letter({}, message_id=None)
    every = [a, b, c, u]

    def pick(f: dl.Filter) -> list[str | None]:
        return [x.message_id for x in every if f.matches(x)]

    assert pick(dl.Filter()) == ["a", "b", "c", None]
    assert pick(dl.Filter(vhosts=frozenset({"gf-region-a"}))) == ["b"]
    assert pick(dl.Filter(source="x-ingress.positions")) == ["a", "c"]
    assert pick(dl.Filter(source="x-ingress")) == []  # exact, not a prefix
    assert pick(dl.Filter(reason="malformed json")) == ["b"]  # case-insensitive substring
    assert pick(dl.Filter(reason="by the broker")) == ["c"]
    assert pick(dl.Filter(reason="unknown")) == [None]
    assert pick(dl.Filter(message_id="c")) == ["c"]
    assert pick(dl.Filter(source="x-ingress.positions", reason="lat")) == ["a"]
    assert pick(dl.Filter(vhosts=frozenset({"gf-ingress"}), source="x-ingress.batches")) == []


# --------------------------------------------------------------------------- summaries, output


def test_the_summary_line_groups_by_reason() -> None:
    lat = [letter(sidecar_headers(f"lat {v} is outside [-90, 90]")) for v in (91, 95, -100)] * 3
    limit = [letter(broker_headers())] * 3
    key = lat[0].reason_key
    assert dl.summary("gf-ingress", lat + limit) == (
        f"gf-ingress: 12 dead letters: 9 '{key}', 3 delivery_limit")
    assert dl.summary("gf-ingress", limit + lat[:1]) == (
        f"gf-ingress: 4 dead letters: 3 delivery_limit, 1 '{key}'")
    assert dl.summary("gf-ingress", limit, total=12) == (
        "gf-ingress: 3 of 12 dead letters match: 3 delivery_limit")
    assert dl.summary("gf-ingress", [], total=12) == "gf-ingress: 0 of 12 dead letters match"
    assert dl.summary("gf-fences", []) == "gf-fences: no dead letters"
    assert dl.summary("gf-fences", [], total=0) == "gf-fences: no dead letters"
    assert dl.summary("gf-fences", limit[:1]) == "gf-fences: 1 dead letter: 1 delivery_limit"
    assert dl.summary("gf-fences", limit[:1], total=1) == "gf-fences: 1 dead letter: 1 delivery_limit"
    assert dl.summary("gf-fences", [letter({})]) == "gf-fences: 1 dead letter: 1 unknown"


def test_groups_of_equal_size_are_in_a_stable_order() -> None:
    xs = [letter(sidecar_headers("b")), letter(sidecar_headers("a"))]
    assert dl.summary("v", xs) == "v: 2 dead letters: 1 'a', 1 'b'"


@pytest.mark.parametrize(("body", "expected"), [
    (b"", ""),
    (b"hello", "hello"),
    (b"a\nb\tc\x00", "a\\nb\\tc\\x00"),
    (b"\xc1\xc1ok", "\\xc1\\xc1ok"),
    ("zürich".encode(), "zürich"),
    (b"x" * 81, "x" * 80 + "…"),
    (b"x" * 80, "x" * 80),
    (b'{"op":"get","token":"eyJhbGci.payload.sig","id":"f1"}', '{"op":"get","token":"****","id":"f1"}'),
    (b'{"Password": "p\\"w", "api_key":"k"}', '{"Password": "****", "api_key":"****"}'),
])
def test_preview(body: bytes, expected: str) -> None:
    assert dl.preview(body) == expected


def test_preview_never_exceeds_its_width_even_with_escapes() -> None:
    p = dl.preview(b"\x01" * 100, chars=10)
    assert p == "\\x01\\x01…"
    assert dl.preview(b"\xff" * 5000).endswith("…")
    assert len(dl.preview(b"\xff" * 5000)) <= dl.PREVIEW_CHARS + 1


def test_to_json_and_json_safe() -> None:
    x = letter(broker_headers())
    j = x.to_json()
    assert j["time"] == "2026-11-22T12:56:45+00:00" and j["kind"] == "broker" and j["replayable"] is True
    assert json.loads(json.dumps(j)) == j
    safe = dl.json_safe(broker_headers(blob=b"\x00\xff", n=None))
    assert safe["x-death"][0]["time"] == "2026-11-22T12:56:45+00:00"
    assert safe["blob"] == "\\x00\\xff" and safe["n"] is None
    assert dl.json_safe({"d": {1, 2}.__class__.__name__}) == {"d": "set"}
    assert isinstance(dl.json_safe(object()), str)
    json.dumps(safe)


# --------------------------------------------------------------------------- the command's pure parts


def parse_args(*argv: str) -> argparse.Namespace:
    parser, module = build_parser(["dlq", *argv])
    assert module is dlq_cmd
    return parser.parse_args(["dlq", *argv])


def test_arguments() -> None:
    args = parse_args("list", "--vhost", "gf-ingress", "--vhost", "gf-fences", "--reason", "lat",
                      "--limit", "5", "--json")
    assert (args.action, args.vhost, args.reason, args.limit, args.json) == (
        "list", ["gf-ingress", "gf-fences"], "lat", 5, True)
    args = parse_args("replay", "--source", "x-ingress.batches", "--dry-run", "--message-id", "m")
    assert (args.action, args.source, args.dry_run, args.message_id, args.limit) == (
        "replay", "x-ingress.batches", True, "m", None)
    f = dlq_cmd._filter(args)
    assert f == dl.Filter(frozenset(), "x-ingress.batches", None, "m")


@pytest.mark.parametrize("argv", [["dlq"], ["dlq", "purge"], ["dlq", "list", "--limit", "0"],
                                  ["dlq", "list", "--limit", "x"], ["dlq", "replay", "--json"]])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_urls_from_an_amqp_url() -> None:
    args = parse_args("list", "--amqp-url", "amqp://ops:s3cret@rabbit.example:5673/ignored")
    urls = dlq_cmd.targets(args, {})
    assert list(urls) == ["gf-ingress", "gf-region-a", "gf-region-b", "gf-fences"]
    assert urls["gf-region-a"] == "amqp://ops:s3cret@rabbit.example:5673/gf-region-a?name=geofence-dlq"
    env = {"GEOFENCE_AMQP_URL": "amqps://u:p@h/?name=mine", "GEOFENCE_REGIONS": "x"}
    urls = dlq_cmd.targets(parse_args("replay", "--vhost", "gf-region-x"), env)
    assert urls == {"gf-region-x": "amqps://u:p@h/gf-region-x?name=mine"}


def test_usage_errors_name_the_problem_and_hide_passwords() -> None:
    with pytest.raises(dlq_cmd.UsageError, match="'gf-nope': not a vhost of the topology"):
        dlq_cmd.targets(parse_args("list", "--vhost", "gf-nope", "--amqp-url", "amqp://h/"), {})
    with pytest.raises(dlq_cmd.UsageError, match="not an amqp:// URL") as exc:
        dlq_cmd.targets(parse_args("list", "--amqp-url", "http://u:hunter2@h/"), {})
    assert "hunter2" not in str(exc.value) and "****" in str(exc.value)
    with pytest.raises(dlq_cmd.UsageError, match="GEOFENCE_NOPE"):
        dlq_cmd.targets(parse_args("list"), {"GEOFENCE_NOPE": "1"})


def test_a_stack_that_is_not_set_up_is_a_clear_error(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEOFENCE_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("GEOFENCE_AMQP_URL", raising=False)
    assert main(["dlq", "list"]) == 3  # deploy/exit_codes.py: the broker is not there
    err = capsys.readouterr().err
    assert "the local stack is not set up" in err and "geofence up" in err


def test_an_unreachable_broker_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    # port 9 (discard) on localhost: nothing listens there
    url = "amqp://u:hunter2@127.0.0.1:9/"
    assert main(["dlq", "replay", "--vhost", "gf-ingress", "--amqp-url", url]) == 3  # unreachable
    err = capsys.readouterr().err
    assert "cannot connect to amqp://u:****@127.0.0.1:9/gf-ingress" in err and "is the stack up?" in err
    assert "hunter2" not in err


def test_the_table() -> None:
    xs = [letter(sidecar_headers("lat 91 is outside [-90, 90]"), message_id="m-1"),
          letter(broker_headers(), vhost="gf-region-a", message_id=None, body=b"x" * 1234)]
    lines = dlq_cmd.table(xs)
    assert lines[0].split() == ["VHOST", "SOURCE", "KIND", "SIZE", "TIME", "MESSAGE-ID", "REASON"]
    assert lines[1].split()[:6] == ["gf-ingress", "x-ingress.positions", "sidecar", "36", "-", "m-1"]
    assert lines[1].endswith("lat 91 is outside [-90, 90]")
    assert lines[2].split()[:7] == ["gf-region-a", "x-ingress.positions", "broker", "1234", "2026-11-22",
                                    "12:56:45Z", "-"]
    assert len({line.index("KIND") if i == 0 else line.index(x.kind) for i, (line, x) in
                enumerate(zip(lines, [xs[0], *xs], strict=True))}) == 1  # columns line up


def test_the_replay_summary() -> None:
    out = dlq_cmd.Outcome("gf-ingress", 10)
    out.replayed.update({"x-ingress.batches": 2, "x-ingress.positions": 1})
    out.refused.append((letter({}), "no known source queue"))
    assert dlq_cmd.replay_summary(out, dry_run=False) == (
        "gf-ingress: replayed 3 of 4 matching dead letters (2 to x-ingress.batches, "
        "1 to x-ingress.positions); 1 could not be replayed and stay in dead-letters")
    out.skipped = 2
    assert dlq_cmd.replay_summary(out, dry_run=True).startswith("gf-ingress: would replay 3 of 6 matching")
