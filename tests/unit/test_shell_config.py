"""exchanges/shell/ without a broker: configuration, URL masking, counters, backoff, and the
intake / settle machinery with small fakes of aio-pika's queue and messages."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import aiormq
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from exchanges import shell
from exchanges import topology as t
from exchanges.settings import mask
from exchanges.shell import Backoff, ConfigError, Counters, Intake, SidecarConfig, reason_key

AMQP = "amqp://geofence:amqp-s3cret@localhost:5672/"
PG = "postgresql://geofence:pg-pa55word@localhost:5433/geofence"
ENV = {"GEOFENCE_AMQP_URL": AMQP, "GEOFENCE_POSTGRES_URL": PG}


def config(**env: str) -> SidecarConfig:
    return SidecarConfig.from_env("x-geo", "a", {**ENV, **env})


# --------------------------------------------------------------------------- mask_url


@pytest.mark.parametrize(("url", "masked"), [
    ("amqp://user:secret@host:5672/vh", "amqp://user:****@host:5672/vh"),
    ("amqps://user:secret@host/?name=x", "amqps://user:****@host/?name=x"),
    ("postgresql://geofence:pg-pa55word@localhost:5433/geofence",
     "postgresql://geofence:****@localhost:5433/geofence"),
    ("postgres://u:p%40ss@db/x?sslmode=require", "postgres://u:****@db/x?sslmode=require"),
    # the password also spelled elsewhere in the URL: only the password is masked
    ("amqp://guest:guest@guest:5672/guest", "amqp://guest:****@guest:5672/guest"),
    ("amqp://user:@host/", "amqp://user:****@host/"),
])
def test_mask_url_hides_the_password(url: str, masked: str) -> None:
    assert mask(url) == masked


@pytest.mark.parametrize("url", ["amqp://user@host:5672/", "amqp://host/", "postgresql://localhost/geofence",
                                 "postgresql:///geofence?host=/run/pg", "not a url"])
def test_mask_url_without_password_is_unchanged(url: str) -> None:
    assert mask(url) == url


# --------------------------------------------------------------------------- from_env


def test_from_env_minimal_takes_the_defaults() -> None:
    c = SidecarConfig.from_env("x-fence", "w0", {**ENV, "PATH": "/bin", "HOME": "/root"})
    assert (c.role, c.instance, c.amqp_url, c.postgres_url) == ("x-fence", "w0", AMQP, PG)
    assert c.regions == t.Topology.regions == ("a", "b")
    assert c.workers == t.Topology.workers == ("w0", "w1")
    assert (c.drain_s, c.batch_max, c.prefetch, c.log_level) == (10.0, 5000, 10_000, "INFO")
    assert c.name == "x-fence-w0"


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("GEOFENCE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("GEOFENCE_AMQP_URL", AMQP)
    monkeypatch.setenv("GEOFENCE_POSTGRES_URL", PG)
    monkeypatch.setenv("GEOFENCE_BATCH_MAX", "17")
    assert SidecarConfig.from_env("x-ingress", "").batch_max == 17


def test_from_env_all_settings() -> None:
    c = config(GEOFENCE_REGIONS=" north , south,east ", GEOFENCE_WORKERS="w-0,w-1,w-2",
               GEOFENCE_DRAIN_S="2.5", GEOFENCE_BATCH_MAX="100", GEOFENCE_PREFETCH="300",
               GEOFENCE_LOG_LEVEL="debug")
    assert c.regions == ("north", "south", "east")
    assert c.workers == ("w-0", "w-1", "w-2")
    assert c.drain_s == 2.5 and c.batch_max == 100 and c.prefetch == 300
    assert isinstance(c.batch_max, int) and isinstance(c.prefetch, int)
    assert c.log_level == "DEBUG"
    assert c.topology.regions == ("north", "south", "east")


@pytest.mark.parametrize("missing", ["GEOFENCE_AMQP_URL", "GEOFENCE_POSTGRES_URL"])
def test_required_urls(missing: str) -> None:
    env = dict(ENV)
    del env[missing]
    with pytest.raises(ConfigError, match=f"^{missing} must be set"):
        SidecarConfig.from_env("x-geo", "a", env)
    with pytest.raises(ConfigError, match=f"^{missing} must be set"):
        SidecarConfig.from_env("x-geo", "a", {**env, missing: ""})


def test_both_urls_missing_are_both_named() -> None:
    with pytest.raises(ConfigError, match="GEOFENCE_AMQP_URL and GEOFENCE_POSTGRES_URL must be set"):
        SidecarConfig.from_env("x-geo", "a", {})


def test_unknown_setting_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        config(GEOFENCE_BATCHMAX="10")
    msg = str(info.value)
    assert msg.startswith("unknown setting GEOFENCE_BATCHMAX (did you mean GEOFENCE_BATCH_MAX?);")
    assert "GEOFENCE_BATCH_MAX" in msg  # the known ones are listed


def test_several_unknown_settings_are_all_named_sorted() -> None:
    hint = r"( \(did you mean \w+\?\))?"
    with pytest.raises(ConfigError, match=rf"^unknown settings GEOFENCE_A{hint}, GEOFENCE_Z{hint};"):
        config(GEOFENCE_Z="1", GEOFENCE_A="1")


def test_unknown_setting_is_refused_even_without_urls() -> None:
    with pytest.raises(ConfigError, match="unknown setting GEOFENCE_TYPO"):
        SidecarConfig.from_env("x-geo", "a", {"GEOFENCE_TYPO": "1"})


def test_also_known_keys_are_accepted() -> None:
    env = {**ENV, "GEOFENCE_MQTT_PORT": "1883", "GEOFENCE_EXTRA": "x"}
    c = SidecarConfig.from_env("x-ingress", "", env, also_known=("GEOFENCE_MQTT_PORT", "GEOFENCE_EXTRA"))
    assert c.amqp_url == AMQP
    with pytest.raises(ConfigError, match=r"unknown setting GEOFENCE_EXTRA( \(did you mean \w+\?\))?;"):
        SidecarConfig.from_env("x-ingress", "", env, also_known=["GEOFENCE_MQTT_PORT"])


@pytest.mark.parametrize(("key", "raw", "why"), [
    ("GEOFENCE_DRAIN_S", "0", "must be positive"),
    ("GEOFENCE_DRAIN_S", "-1", "must be positive"),
    ("GEOFENCE_DRAIN_S", "nan", "must be positive"),
    ("GEOFENCE_DRAIN_S", "ten", "not a number"),
    ("GEOFENCE_DRAIN_S", "", "not a number"),
    ("GEOFENCE_BATCH_MAX", "0", "must be positive"),
    ("GEOFENCE_BATCH_MAX", "-5", "must be positive"),
    ("GEOFENCE_BATCH_MAX", "1.5", "not a number"),
    ("GEOFENCE_PREFETCH", "0", "must be positive"),
    ("GEOFENCE_PREFETCH", "many", "not a number"),
])
def test_non_positive_or_non_numbers_refused(key: str, raw: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{key}={raw!r}: {why}')}$"):
        config(**{key: raw})


@pytest.mark.parametrize("url", ["http://u:amqp-s3cret@host/", "localhost:5672", "mqtt://u:amqp-s3cret@h/",
                                 "postgresql://u:amqp-s3cret@h/db"])
def test_bad_amqp_scheme_is_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match=r"GEOFENCE_AMQP_URL=.*not an amqp:// URL") as info:
        config(GEOFENCE_AMQP_URL=url)
    assert "amqp-s3cret" not in str(info.value)


@pytest.mark.parametrize("url", ["mysql://u:pg-pa55word@h/db", "amqp://u:pg-pa55word@h/", "localhost/db"])
def test_bad_postgres_scheme_is_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match=r"GEOFENCE_POSTGRES_URL=.*not a postgresql:// URL") as info:
        config(GEOFENCE_POSTGRES_URL=url)
    assert "pg-pa55word" not in str(info.value)


def test_amqps_and_postgres_schemes_accepted() -> None:
    c = config(GEOFENCE_AMQP_URL="amqps://u:p@h/", GEOFENCE_POSTGRES_URL="postgres://u:p@h/db")
    assert c.amqp_url == "amqps://u:p@h/" and c.postgres_url == "postgres://u:p@h/db"


@pytest.mark.parametrize(("key", "value"), [
    ("GEOFENCE_REGIONS", "a,,b"),
    ("GEOFENCE_REGIONS", ""),
    ("GEOFENCE_REGIONS", "a,a"),
    ("GEOFENCE_REGIONS", "a_b"),
    ("GEOFENCE_REGIONS", "a.b,c"),
    ("GEOFENCE_WORKERS", "w0,w0"),
    ("GEOFENCE_WORKERS", "w0, ,w1"),
    ("GEOFENCE_WORKERS", "w 0"),
])
def test_bad_regions_or_workers_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=r"^GEOFENCE_REGIONS / GEOFENCE_WORKERS: "):
        config(**{key: value})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# --------------------------------------------------------------------------- amqp_for, describe


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_amqp_for_sets_the_vhost_and_names_the_connection() -> None:
    url = config().amqp_for("gf-region-a")
    assert url == "amqp://geofence:amqp-s3cret@localhost:5672/gf-region-a?name=x-geo-a"


def test_amqp_for_quotes_the_vhost() -> None:
    c = config()
    assert urlsplit(c.amqp_for("/")).path == "/%2F"
    assert urlsplit(c.amqp_for("a/b c")).path == "/a%2Fb%20c"
    assert urlsplit(c.amqp_for("x?y#z")).path == "/x%3Fy%23z"


def test_amqp_for_replaces_the_path_of_the_url() -> None:
    c = config(GEOFENCE_AMQP_URL="amqp://u:p@h:5672/some-vhost")
    assert urlsplit(c.amqp_for("gf-fences")).path == "/gf-fences"


def test_amqp_for_keeps_a_given_connection_name_and_other_parameters() -> None:
    c = config(GEOFENCE_AMQP_URL="amqp://u:p@h:5672/?heartbeat=30&name=my%20sidecar")
    url = c.amqp_for("gf-ingress")
    assert query(url) == {"heartbeat": ["30"], "name": ["my sidecar"]}
    assert urlsplit(url).netloc == "u:p@h:5672"


def test_amqp_for_name_without_instance_is_the_role() -> None:
    c = SidecarConfig.from_env("x-ingress", "", ENV)
    assert c.name == "x-ingress"
    assert query(c.amqp_for("gf-ingress")) == {"name": ["x-ingress"]}


def test_describe_never_contains_the_passwords() -> None:
    c = config(GEOFENCE_REGIONS="a,b,c", GEOFENCE_DRAIN_S="2.5")
    d = c.describe()
    assert "amqp-s3cret" not in d and "pg-pa55word" not in d
    assert "amqp://geofence:****@localhost:5672/" in d
    assert "postgresql://geofence:****@localhost:5433/geofence" in d
    assert d.startswith("x-geo-a: ")
    assert "regions a,b,c" in d and "workers w0,w1" in d
    assert "batch <= 5000" in d and "prefetch 10000" in d and "drain 2.5s" in d


def test_describe_hides_a_password_given_as_a_dsn_parameter() -> None:
    c = config(GEOFENCE_POSTGRES_URL="postgresql://geofence@localhost:5433/geofence?password=pg-pa55word")
    assert "pg-pa55word" not in c.describe()


# --------------------------------------------------------------------------- reason_key, counters


@pytest.mark.parametrize(("reason", "key"), [
    ("malformed JSON: unexpected character: line 1 column 2", "malformed JSON"),
    ("bad define message: KeyError: 'fence'", "bad define message"),
    ("unknown control message kind 'x'", "unknown control message kind '…'"),
    ("x" * 100, "x" * 60),
    ("y" * 100 + ": detail", "y" * 60),
    ("", ""),
])
def test_reason_key(reason: str, key: str) -> None:
    assert reason_key(reason) == key


def test_reason_key_groups_reasons_that_differ_after_the_colon() -> None:
    assert reason_key("malformed msgpack: ExtraData: 3") == reason_key("malformed msgpack: ValueError: x")


def test_reason_key_drops_the_variable_part_of_a_value_reason() -> None:
    assert reason_key("lat 91 is outside [-90, 90]") == reason_key("lat 95.5 is outside [-90, 90]")


def test_counters_batch_and_json() -> None:
    c = Counters()
    assert c.to_json() == {"received": 0, "positions": 0, "published": 0, "events": 0, "batches": 0,
                           "largest_batch": 0, "dead_lettered": 0, "dead_letter_reasons": {},
                           "publish_retries": 0}
    c.batch(3)
    c.batch(10)
    c.batch(2)
    c.positions, c.published, c.events, c.retries = 40, 12, 5, 2
    c.dead_lettered["malformed JSON"] += 2
    c.dead_lettered["lat"] += 1
    j = c.to_json()
    assert j["received"] == 15 and j["batches"] == 3 and j["largest_batch"] == 10
    assert j["positions"] == 40 and j["published"] == 12 and j["events"] == 5 and j["publish_retries"] == 2
    assert j["dead_lettered"] == 3
    assert j["dead_letter_reasons"] == {"malformed JSON": 2, "lat": 1}
    assert list(j["dead_letter_reasons"]) == ["malformed JSON", "lat"]  # most common first


def test_counters_json_keeps_the_20_most_common_reasons_but_counts_all() -> None:
    c = Counters()
    for i in range(30):
        c.dead_lettered[f"reason {i:02d}"] += i + 1
    j = c.to_json()
    assert j["dead_lettered"] == sum(range(1, 31))
    assert len(j["dead_letter_reasons"]) == 20
    assert set(j["dead_letter_reasons"]) == {f"reason {i:02d}" for i in range(10, 30)}


def test_counters_line() -> None:
    assert Counters().line() == ("received 0 msgs in 0 batches (mean 0.0, max 0), positions 0, published 0, "
                                 "events 0, dead-lettered 0, publish retries 0")
    c = Counters()
    c.batch(1)
    c.batch(4)
    c.positions, c.published, c.events, c.retries = 7, 6, 3, 1
    c.dead_lettered["x"] += 2
    assert c.line() == ("received 5 msgs in 2 batches (mean 2.5, max 4), positions 7, published 6, events 3, "
                        "dead-lettered 2, publish retries 1")


def test_counters_are_independent() -> None:
    a, b = Counters(), Counters()
    a.dead_lettered["x"] += 1
    assert b.dead_lettered == {}


# --------------------------------------------------------------------------- backoff


def test_backoff_grows_doubling_to_the_cap_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        calls.append((a, b))
        return 1.0

    monkeypatch.setattr(random, "uniform", uniform)
    b = Backoff(0.5, 5.0)
    assert [b.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert set(calls) == {(0.8, 1.2)}
    b.reset()
    assert [b.next() for _ in range(2)] == [0.5, 1.0]


def test_backoff_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda a, b: 1.0)
    b = Backoff()
    delays = [b.next() for _ in range(10)]
    assert delays[0] == 0.2
    assert max(delays) == 10.0 and delays[-1] == 10.0


def test_backoff_jitter_stays_within_20_percent() -> None:
    b = Backoff(1.0, 8.0)
    nominal = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for n in nominal:
        d = b.next()
        assert 0.8 * n <= d <= 1.2 * n


# --------------------------------------------------------------------------- intake and settle


class FakeMessage:
    def __init__(self, n: int, deliveries: int = 0) -> None:
        self.n = n
        self.acks: list[bool] = []
        self.headers: dict[str, Any] = {"x-delivery-count": deliveries} if deliveries else {}
        self.body = b"m%d" % n
        self.content_type = "application/json"
        self.message_id = None
        self.routing_key = "rk"

    async def ack(self, multiple: bool = False) -> None:
        self.acks.append(multiple)

    def __repr__(self) -> str:
        return f"FakeMessage({self.n})"


class FakeQueue:
    name = "x-fence.w0"

    def __init__(self) -> None:
        self.callback: Callable[[Any], Awaitable[None]] | None = None
        self.consume_kwargs: dict[str, Any] = {}
        self.cancelled: list[str] = []
        self.consumers = 0

    async def consume(self, callback: Callable[[Any], Awaitable[None]], **kwargs: Any) -> str:
        self.callback = callback
        self.consume_kwargs = kwargs
        self.consumers += 1
        return f"ctag-{self.consumers}"

    async def cancel(self, tag: str) -> None:
        self.cancelled.append(tag)

    async def deliver(self, *messages: FakeMessage) -> None:
        assert self.callback is not None, "not consuming"
        for m in messages:
            await self.callback(m)


async def started(max_batch: int) -> tuple[Intake, FakeQueue]:
    q = FakeQueue()
    intake = Intake(cast(AbstractQueue, q), max_batch)
    await intake.start()
    return intake, q


def batches(intake: Intake) -> AsyncGenerator[list[AbstractIncomingMessage], None]:
    return cast(AsyncGenerator[list[AbstractIncomingMessage], None], intake.batches())


def numbers(batch: list[AbstractIncomingMessage]) -> list[int]:
    return [cast(FakeMessage, m).n for m in batch]


async def test_intake_consumes_exclusively() -> None:
    _, q = await started(10)
    assert q.callback is not None
    assert q.consume_kwargs == {"exclusive": True}


async def test_intake_batches_what_arrived_up_to_max_batch_in_order() -> None:
    intake, q = await started(4)
    await q.deliver(*(FakeMessage(i) for i in range(10)))
    it = batches(intake)
    assert numbers(await anext(it)) == [0, 1, 2, 3]
    assert numbers(await anext(it)) == [4, 5, 6, 7]
    assert numbers(await anext(it)) == [8, 9]
    await q.deliver(FakeMessage(10))
    assert numbers(await anext(it)) == [10]
    await it.aclose()


async def test_intake_waits_for_a_message_then_hands_it_out() -> None:
    intake, q = await started(100)
    it = batches(intake)
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):  # let the iterator reach its wait on the empty buffer
        await asyncio.sleep(0)
    assert not pending.done()
    await q.deliver(FakeMessage(1), FakeMessage(2))
    assert numbers(await asyncio.wait_for(pending, 5)) == [1, 2]
    await it.aclose()


async def test_intake_stop_drains_the_buffer_then_ends() -> None:
    intake, q = await started(3)
    await q.deliver(*(FakeMessage(i) for i in range(5)))
    await intake.stop()
    assert q.cancelled == ["ctag-1"]
    got = [numbers(b) async for b in intake.batches()]
    assert got == [[0, 1, 2], [3, 4]]


async def test_intake_stop_wakes_a_waiting_consumer() -> None:
    intake, _ = await started(10)
    got: list[list[int]] = []

    async def consume() -> None:
        async for b in intake.batches():
            got.append(numbers(b))

    task = asyncio.ensure_future(consume())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    await intake.stop()
    await asyncio.wait_for(task, 5)
    assert got == []


async def test_intake_stop_before_start_does_not_cancel() -> None:
    q = FakeQueue()
    intake = Intake(cast(AbstractQueue, q), 10)
    await intake.stop()
    assert q.cancelled == []
    assert [b async for b in intake.batches()] == []


async def test_intake_stop_survives_a_failing_cancel() -> None:
    intake, q = await started(10)

    async def broken(tag: str) -> None:
        raise ConnectionError("broker gone")

    q.cancel = broken  # type: ignore[method-assign]
    await q.deliver(FakeMessage(1))
    await intake.stop()
    assert [numbers(b) async for b in intake.batches()] == [[1]]


def as_messages(ms: list[FakeMessage]) -> list[AbstractIncomingMessage]:
    return cast(list[AbstractIncomingMessage], ms)


async def test_settle_acks_only_the_last_message_with_multiple() -> None:
    ms = [FakeMessage(i) for i in range(4)]
    ran = False
    async with shell.settle(as_messages(ms)):
        ran = True
        assert all(m.acks == [] for m in ms)  # not before the block is done
    assert ran
    assert [m.acks for m in ms] == [[], [], [], [True]]


async def test_settle_acks_nothing_when_the_block_raises() -> None:
    ms = [FakeMessage(i) for i in range(3)]
    with pytest.raises(ConnectionError):
        async with shell.settle(as_messages(ms)):
            raise ConnectionError("broker gone")
    assert all(m.acks == [] for m in ms)


async def test_settle_with_no_messages_does_nothing() -> None:
    async with shell.settle([]):
        pass


async def test_intake_and_settle_together() -> None:
    intake, q = await started(2)
    ms = [FakeMessage(i) for i in range(5)]
    await q.deliver(*ms)
    await intake.stop()
    async for batch in intake.batches():
        async with shell.settle(batch):
            pass
    assert [m.acks for m in ms] == [[], [True], [], [True], [True]]


# --------------------------------------------------------------------------- suspects


async def started_managed(max_batch: int, prefetch: int) -> tuple[Intake, FakeQueue, list[int]]:
    q = FakeQueue()
    qos: list[int] = []

    async def set_prefetch(n: int) -> None:
        qos.append(n)

    intake = Intake(cast(AbstractQueue, q), max_batch, prefetch=prefetch, set_prefetch=set_prefetch)
    await intake.start()
    return intake, q, qos


async def next_after(it: AsyncGenerator[list[AbstractIncomingMessage], None], q: FakeQueue,
                     *messages: FakeMessage) -> list[int]:
    """The next batch when `messages` arrive once the caller asked for it (the buffer empty)."""
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):  # let the iterator reach its wait on the empty buffer
        await asyncio.sleep(0)
    await q.deliver(*messages)
    return numbers(await pending)


async def test_a_managed_intake_starts_at_prefetch_one_and_opens_at_the_first_normal_message() -> None:
    intake, q, qos = await started_managed(10, 500)
    assert qos == [1]
    await q.deliver(FakeMessage(0, deliveries=3), FakeMessage(1, deliveries=2))
    it = batches(intake)
    assert [numbers(await anext(it)) for _ in range(2)] == [[0], [1]]
    assert qos == [1]  # suspects keep it at one
    await q.deliver(FakeMessage(2, deliveries=1))  # delivered once before: not a suspect
    assert numbers(await anext(it)) == [2]
    assert qos == [1] and q.cancelled == ["ctag-1"]  # cancelled; the next consumer once [2] is settled
    assert await next_after(it, q, FakeMessage(3, deliveries=4)) == [3]
    assert qos == [1, 500] and q.consumers == 2
    assert await next_after(it, q, FakeMessage(4, deliveries=4)) == [4]
    assert qos == [1, 500] and q.consumers == 2  # opened once
    await intake.stop()


async def test_one_consumer_holds_messages_at_a_time() -> None:
    """A prefetch change cancels the consumer and creates the next only once everything the
    old one delivered was handed out: a crash can never leave two consumers holding messages
    (the queue would give them back consumer by consumer, out of order)."""
    intake, q, qos = await started_managed(2, 1000)
    await q.deliver(FakeMessage(0))
    it = batches(intake)
    assert numbers(await anext(it)) == [0]  # consumer 1 cancelled before it is handed out
    assert q.cancelled == ["ctag-1"] and q.consumers == 1
    await q.deliver(FakeMessage(1))  # a delivery read before the cancel-ok: still consumer 1's
    assert numbers(await anext(it)) == [1]
    assert q.consumers == 1  # not before the buffer is empty
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):
        await asyncio.sleep(0)
    assert q.consumers == 2 and qos == [1, 1000]
    await q.deliver(*(FakeMessage(i) for i in range(2, 7)))
    assert numbers(await pending) == [2, 3]
    await intake.confirm_lag(3.0)  # halve: consumer 2 still holds 4, 5, 6
    assert numbers(await anext(it)) == [4, 5]
    assert q.cancelled == ["ctag-1", "ctag-2"] and q.consumers == 2
    assert numbers(await anext(it)) == [6]
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):
        await asyncio.sleep(0)
    assert q.consumers == 3 and qos == [1, 1000, 500]
    pending.cancel()
    await intake.stop()


async def test_a_returned_message_behind_a_first_delivery_is_counted() -> None:
    intake, q = await started(10)
    first, returned = FakeMessage(0), FakeMessage(1, deliveries=1)
    returned.redelivered = True  # type: ignore[attr-defined]
    early = FakeMessage(2, deliveries=1)
    early.redelivered = True  # type: ignore[attr-defined]
    await q.deliver(early, first)
    assert intake.late_returns == 0  # returns first, then first deliveries: in order
    await q.deliver(returned)
    assert intake.late_returns == 1
    await intake.stop()


async def test_suspects_are_handed_out_alone_and_others_batched_around_them() -> None:
    intake, q, _ = await started_managed(10, 100)
    await q.deliver(FakeMessage(0, 2), FakeMessage(1, 5), FakeMessage(2, 1), FakeMessage(3),
                    FakeMessage(4, 2), FakeMessage(5), FakeMessage(6))
    await intake.stop()
    got = [numbers(b) async for b in intake.batches()]
    assert got == [[0], [1], [2, 3], [4], [5, 6]]
    assert intake.suspects == 3


class FakeExchange:
    name = "dead-letters"


async def test_a_failing_batch_ends_the_sidecar_without_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    intake, q = await started(10)
    ms = [FakeMessage(i) for i in range(2)] + [FakeMessage(2, deliveries=1)]
    await q.deliver(*ms)
    await intake.stop()

    async def handle(batch: list[AbstractIncomingMessage]) -> None:
        raise ValueError("a bug")

    sent: list[shell.Out] = []

    async def publish_all(outs: list[shell.Out], counters: Counters, deadline: float | None = None) -> None:
        sent.extend(outs)

    monkeypatch.setattr(shell.publish, "publish_all", publish_all)  # where run_batches looks it up
    with pytest.raises(shell.SidecarFault, match="a bug"):
        await shell.run_batches(intake, handle, Counters(), cast(Any, FakeExchange()))
    assert all(m.acks == [] for m in ms) and sent == []


async def test_a_suspect_failing_alone_is_dead_lettered_with_the_error_then_the_sidecar_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    intake, q, _ = await started_managed(10, 100)
    m = FakeMessage(7, deliveries=2)
    await q.deliver(m)
    await intake.stop()
    sent: list[shell.Out] = []

    async def publish_all(outs: list[shell.Out], counters: Counters, deadline: float | None = None) -> None:
        sent.extend(outs)

    monkeypatch.setattr(shell.publish, "publish_all", publish_all)  # where run_batches looks it up

    async def handle(batch: list[AbstractIncomingMessage]) -> None:
        raise KeyError("boom")

    counters = Counters()
    with pytest.raises(shell.SidecarFault):
        await shell.run_batches(intake, handle, counters, cast(Any, FakeExchange()))
    assert len(sent) == 1 and sent[0].body == b"m7"
    headers = dict(sent[0].headers or {})
    assert headers[t.REASON_HEADER].startswith("internal error on delivery 3: KeyError('boom')")
    assert headers["x-geofence-source"] == q.name
    assert m.acks == [False]  # settled after the dead letter was confirmed
    assert sum(counters.dead_lettered.values()) == 1


async def test_a_lost_broker_is_not_a_fault() -> None:
    intake, q = await started(10)
    ms = [FakeMessage(0, deliveries=5)]
    await q.deliver(*ms)
    await intake.stop()

    async def handle(batch: list[AbstractIncomingMessage]) -> None:
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError):
        await shell.run_batches(intake, handle, Counters(), cast(Any, FakeExchange()))
    assert ms[0].acks == []


# --------------------------------------------------------------------------- durability settings


def test_journal_dir_and_persistence() -> None:
    c = SidecarConfig.from_env("x-fence", "w0", ENV)
    assert (c.journal_dir, c.persistence) == ("", True)
    c = SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_JOURNAL_DIR": "/srv/x",
                                                 "GEOFENCE_PERSISTENCE": "OFF"})
    assert (c.journal_dir, c.persistence) == ("/srv/x", False)
    assert "PERSISTENCE OFF" in c.describe() and "journal /srv/x" in c.describe()
    with pytest.raises(ConfigError, match="not absolute"):
        SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_JOURNAL_DIR": "rel/dir"})
    with pytest.raises(ConfigError, match="on or off"):
        SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_PERSISTENCE": "maybe"})


def test_x_fence_refuses_to_run_durably_without_a_journal_dir() -> None:
    from fence.x_fence.sidecar import FenceSidecar

    with pytest.raises(ConfigError, match="GEOFENCE_JOURNAL_DIR"):
        FenceSidecar(SidecarConfig.from_env("x-fence", "w0", ENV))
    fast = SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_PERSISTENCE": "off"})
    assert FenceSidecar(fast).journal is None


async def test_confirm_lag_halves_the_prefetch_and_restores_it() -> None:
    intake, q, qos = await started_managed(10, 1000)
    await intake.confirm_lag(5.0)  # not opened yet (no message): nothing to slow
    assert qos == [1]
    await q.deliver(FakeMessage(0))
    it = batches(intake)
    assert numbers(await anext(it)) == [0]
    assert await next_after(it, q, FakeMessage(1)) == [1]
    assert qos == [1, 1000]
    for _ in range(6):
        await intake.confirm_lag(2.0)
    assert intake.current_prefetch == 64  # halved down to the floor, not below
    assert await next_after(it, q, FakeMessage(2)) == [2]
    assert qos == [1, 1000, 64]  # one new consumer, between batches
    await intake.confirm_lag(0.5)  # in between: kept
    assert intake.current_prefetch == 64
    for _ in range(6):
        await intake.confirm_lag(0.01)
    assert intake.current_prefetch == 1000
    assert await next_after(it, q, FakeMessage(3)) == [3]
    assert qos == [1, 1000, 64, 1000] and q.consumers == 4
    await intake.stop()


class FakeUnderlay:
    """aiormq's channel under an exchange: basic_publish fails with `exc`; closed or not."""

    def __init__(self, exc: BaseException, closed: bool) -> None:
        self.exc, self.is_closed, self.publisher_confirms = exc, closed, True

    async def basic_publish(self, *args: Any, **kwargs: Any) -> None:
        raise self.exc


def out_on(underlay: FakeUnderlay) -> shell.Out:
    class Channel:
        async def get_underlay_channel(self) -> FakeUnderlay:
            return underlay

    class Exchange:
        name, channel = "x", Channel()

    return shell.Out(cast(Any, Exchange()), "k", b"{}")


@pytest.mark.parametrize(("exc", "closed"), [(Exception(), False), (Exception(), True),
                                             (RuntimeError("late"), True)])
async def test_a_confirm_lost_with_its_channel_is_the_broker_gone(exc: BaseException, closed: bool) -> None:
    # aiormq fails pending confirms with a bare Exception when their channel closes: the
    # sidecar reconnects (BROKER_GONE), it does not end as if it had a bug
    with pytest.raises(shell.BROKER_GONE, match="publish lost with its channel"):
        await shell.publish_all([out_on(FakeUnderlay(exc, closed))], Counters())


async def test_a_publish_error_on_an_open_channel_is_not_taken_for_the_broker_gone() -> None:
    with pytest.raises(KeyError):
        await shell.publish_all([out_on(FakeUnderlay(KeyError("bug"), False))], Counters())


class LockConnection:
    """A connection whose queue declares are refused (locked) while `locked` says so."""

    def __init__(self) -> None:
        self.locked = True
        self.declared: list[tuple[str, dict[str, Any]]] = []

    async def channel(self, **kwargs: Any) -> Any:
        conn = self

        class Channel:
            is_closed = False

            async def declare_queue(self, name: str, **kw: Any) -> None:
                if conn.locked:
                    raise aiormq.exceptions.ChannelLockedResource("locked")
                conn.declared.append((name, kw))

            async def close(self) -> None:
                self.is_closed = True

        return Channel()


async def test_the_instance_lock_stands_by_while_held_and_restarts_after_taking_over() -> None:
    import contextlib

    lock, conn = shell.InstanceLock("lock.x-geo"), LockConnection()
    conn.locked = False
    async with contextlib.AsyncExitStack() as stack:  # free at the start: taken, serve on
        await lock.acquire(cast(Any, conn), stack)
    assert conn.declared == [("lock.x-geo", {"exclusive": True, "auto_delete": True, "durable": False})]
    conn.locked = True
    for _ in range(2):  # held by another: BROKER_GONE (serve backs off and tries again)
        with pytest.raises(shell.BROKER_GONE, match="held by another instance"):
            async with contextlib.AsyncExitStack() as stack:
                await lock.acquire(cast(Any, conn), stack)
    conn.locked = False  # the other went: what this process holds is stale
    with pytest.raises(shell.TookOver):
        async with contextlib.AsyncExitStack() as stack:
            await lock.acquire(cast(Any, conn), stack)


async def test_a_connection_closed_under_a_channel_opening_ends_the_session_not_the_process() -> None:
    """aiormq raises RuntimeError('<Connection ...> closed') when the broker closed the
    connection while a session opened its channels (a broker restart): a ConnectionError, which
    ends the session (the next one reconnects); any other RuntimeError stays a bug."""
    from exchanges.shell.connections import open_channel

    class Conn:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        async def channel(self, **kwargs: Any) -> Any:
            raise self.exc

    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(ConnectionError, match="closed while a channel was opened"):
            await open_channel(cast(Any, Conn(RuntimeError('<Connection: "amqp://x"> closed'))), stack)
        with pytest.raises(RuntimeError, match="something else"):
            await open_channel(cast(Any, Conn(RuntimeError("something else"))), stack)
