"""`geofence dlq list | replay`: look at and replay the messages in every vhost's
`dead-letters` queue (what they are and how a replay is built: deploy/dead_letters.py).

- `list` removes nothing: it reads each queue with basic.get without acking, then closes the
  channel, so RabbitMQ puts every message back where it was; the queue's length is checked
  to be the same afterwards (not smaller).
- `replay` reads the same way; each matching message is published to the queue it came from
  (persistent, publisher confirms, mandatory) through a private fanout exchange bound to that
  queue alone (`gf-dlq-replay.<run>.<n>`, auto-delete: gone with its binding at the end), so
  its original routing key is kept; only once the broker confirmed it is it acked in the
  dead-letters queue. Anything else (no match, no known source, a refused or unconfirmed
  publish) stays there. A run reads at most the messages the queue held when it started and
  skips a message replayed since the run started, so what fails again is not replayed twice.

Where: the local stack's administrator (`geofence status --json`), or `--amqp-url` /
GEOFENCE_AMQP_URL (`amqp://user:password@host:port/`, the path replaced by each vhost; the
user needs configure, write and read rights there). Exit codes: 0 ok, 1 something failed
(cannot connect, a message not replayed, a queue shorter after `list`), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)
from pamqp.commands import Basic

from deploy import dead_letters as dl
from deploy import exit_codes
from deploy.processes import StackError
from deploy.progress import Progress
from deploy.settings import Settings, SettingsError, load_connection_settings
from exchanges import settings_registry
from exchanges import topology as t
from exchanges.settings import mask

CONNECT_TIMEOUT_S = 10.0
CONFIRM_TIMEOUT_S = 10.0
COUNT_SETTLE_S = 5.0  # how long `list` waits for the queue's length to come back
REASON_COLUMN = 100
CONNECTION_NAME = "geofence-dlq"
BROKER_GONE = (aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError, TimeoutError)


class UsageError(ValueError):
    """Bad arguments (exit 2)."""


class Unavailable(RuntimeError):
    """The broker cannot be reached or the stack is not set up (exit 1)."""


# --------------------------------------------------------------------------- arguments


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: must be at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in (
        ("list", "show the dead letters (nothing is removed) and a summary per vhost"),
        ("replay", "publish matching dead letters back to the queue each came from"),
    ):
        p = actions.add_parser(action, help=help_text, description=help_text)
        p.add_argument("--vhost", action="append", default=[], metavar="V",
                       help="only this vhost (repeatable; default: every vhost of the topology)")
        p.add_argument("--source", metavar="QUEUE", help="only messages that came from this queue")
        p.add_argument("--reason", metavar="TEXT",
                       help="only messages whose reason contains TEXT (case-insensitive)")
        p.add_argument("--message-id", metavar="ID", help="only the message(s) with this message id")
        p.add_argument("--limit", type=_positive_int, metavar="N",
                       help="show at most N (the summary still counts all)" if action == "list"
                       else "replay at most N (the first N matching, oldest first)")
        p.add_argument("--amqp-url", metavar="URL",
                       help="amqp://user:password@host:port/ (the path is replaced by each vhost); "
                            "default: GEOFENCE_AMQP_URL, else the local stack's administrator")
        if action == "list":
            p.add_argument("--json", action="store_true", help="one JSON object per message")
        else:
            p.add_argument("--dry-run", action="store_true", help="say what would be replayed, do nothing")


def _filter(args: argparse.Namespace) -> dl.Filter:
    return dl.Filter(frozenset(args.vhost), args.source, args.reason, args.message_id)


def vhost_url(base: str, vhost: str) -> str:
    """`base` with its path replaced by `vhost` and the connection named (unless it is)."""
    parts = urlsplit(base)
    query = parts.query
    if "name=" not in query:
        query = f"{query}&name={CONNECTION_NAME}" if query else f"name={CONNECTION_NAME}"
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe=""), query=query))


def targets(args: argparse.Namespace, environ: dict[str, str] | None = None) -> dict[str, str]:
    """{vhost: AMQP URL} for the vhosts asked for, in topology order."""
    env = dict(os.environ) if environ is None else environ
    try:
        settings = Settings.from_env(env)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    vhosts = settings.topology.vhosts
    unknown = [v for v in args.vhost if v not in vhosts]
    if unknown:
        raise UsageError(f"{', '.join(map(repr, unknown))}: not a vhost of the topology "
                         f"({', '.join(vhosts)}; GEOFENCE_REGIONS sets the regions)")
    wanted = [v for v in vhosts if not args.vhost or v in args.vhost]
    base = args.amqp_url or settings_registry.read("GEOFENCE_AMQP_URL", env)
    if base:
        if urlsplit(base).scheme not in ("amqp", "amqps"):
            raise UsageError(f"{mask(base)!r} is not an amqp:// URL")
        return {v: vhost_url(base, v) for v in wanted}
    try:
        conn = load_connection_settings(settings)
    except StackError as exc:
        raise Unavailable(f"the local stack is not set up ({exc}); start it with `geofence up`, "
                          "or pass --amqp-url for another broker") from None
    return {v: conn["amqp"][v] for v in wanted}


# --------------------------------------------------------------------------- AMQP


def _scrub(text: str, url: str) -> str:
    password = urlsplit(url).password
    return text.replace(password, "****") if password else text


async def connect(url: str, vhost: str) -> AbstractConnection:
    try:
        return await aio_pika.connect(url, timeout=CONNECT_TIMEOUT_S)
    except (aiormq.exceptions.ProbableAuthenticationError, aiormq.exceptions.AuthenticationError,
            aiormq.exceptions.ConnectionNotAllowed) as exc:  # refused login, unknown vhost
        raise Unavailable(f"{vhost}: the broker refused the login {mask(url)} "
                          f"({_scrub(str(exc), url) or type(exc).__name__})") from None
    except (*BROKER_GONE, aiormq.exceptions.AMQPError) as exc:
        why = _scrub(str(exc), url) or type(exc).__name__
        raise Unavailable(f"cannot connect to {mask(url)} ({why}): is the stack up? "
                          "(`geofence status`; `geofence up` starts it)") from None


def raw_message(vhost: str, m: AbstractIncomingMessage) -> dl.RawMessage:
    return dl.RawMessage(vhost, m.body, dict(m.headers or {}), m.routing_key, m.content_type, m.message_id)


def properties(m: AbstractIncomingMessage) -> dict[str, Any]:
    return {"content_type": m.content_type, "content_encoding": m.content_encoding,
            "message_id": m.message_id, "correlation_id": m.correlation_id, "timestamp": m.timestamp,
            "type": m.type, "app_id": m.app_id, "priority": m.priority, "reply_to": m.reply_to}


async def queue_length(conn: AbstractConnection, name: str = t.DEAD_LETTER_QUEUE) -> int:
    """Ready messages in a queue (passive declare on a channel of its own: a missing queue
    closes that channel, not the caller's)."""
    ch = await conn.channel()
    try:
        q = await ch.declare_queue(name, passive=True)
        count = q.declaration_result.message_count
        return int(count or 0)
    finally:
        with contextlib.suppress(Exception):
            await ch.close()


async def open_dead_letters(conn: AbstractConnection, vhost: str
                            ) -> tuple[AbstractChannel, AbstractQueue, int]:
    """A channel (manual acks: what it gets stays the broker's until acked, and comes back
    when the channel closes) on the vhost's dead-letters queue, and the queue's length."""
    try:
        before = await queue_length(conn)
    except aiormq.exceptions.ChannelNotFoundEntity:
        raise Unavailable(f"{vhost} has no {t.DEAD_LETTER_QUEUE} queue: is the topology applied? "
                          "(`geofence topology apply`)") from None
    ch = await conn.channel()
    return ch, await ch.get_queue(t.DEAD_LETTER_QUEUE, ensure=False), before


async def close_quietly(closable: AbstractChannel | AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(closable.close(), 5)


# --------------------------------------------------------------------------- list


@dataclass
class Listing:
    vhost: str
    before: int
    letters: list[dl.DeadLetter] = field(default_factory=list)  # the matching ones
    headers: list[dict[str, Any]] = field(default_factory=list)  # theirs, for --json
    after: int | None = None


async def read_vhost(conn: AbstractConnection, vhost: str, flt: dl.Filter, keep_headers: bool) -> Listing:
    ch, queue, before = await open_dead_letters(conn, vhost)
    listing = Listing(vhost, before)
    try:
        for _ in range(before):  # what the queue held when we came; later arrivals wait
            m = await queue.get(no_ack=False, fail=False)
            if m is None:
                break
            letter = dl.parse(raw_message(vhost, m))
            if flt.matches(letter):
                listing.letters.append(letter)
                if keep_headers:
                    listing.headers.append(dl.json_safe(dict(m.headers or {})))
    finally:
        await close_quietly(ch)  # never acked: all of them go back, in their order
    deadline = time.monotonic() + COUNT_SETTLE_S
    while True:
        listing.after = await queue_length(conn)
        if listing.after >= before or time.monotonic() > deadline:
            return listing
        await asyncio.sleep(0.05)


def _when(letter: dl.DeadLetter) -> str:
    return letter.time.strftime("%Y-%m-%d %H:%M:%SZ") if letter.time else "-"


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(letters: Sequence[dl.DeadLetter]) -> list[str]:
    rows = [("VHOST", "SOURCE", "KIND", "SIZE", "TIME", "MESSAGE-ID", "REASON")]
    rows += [(x.vhost, x.source or "-", x.kind, str(x.size), _when(x), x.message_id or "-",
              _cut(x.reason, REASON_COLUMN)) for x in letters]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        pairs = enumerate(zip(r[:-1], widths, strict=True))
        cells = [c.rjust(w) if i == 3 else c.ljust(w) for i, (c, w) in pairs]  # SIZE to the right
        lines.append("  ".join([*cells, r[-1]]))
    return lines


async def list_command(urls: dict[str, str], flt: dl.Filter, limit: int | None, as_json: bool) -> int:
    listings = []
    for vhost, url in urls.items():
        conn = await connect(url, vhost)
        try:
            listings.append(await read_vhost(conn, vhost, flt, as_json))
        finally:
            await close_quietly(conn)
    shown = [(x, h) for listing in listings
             for x, h in zip(listing.letters, listing.headers or [{}] * len(listing.letters), strict=True)]
    matching = len(shown)
    shown = shown[:limit] if limit is not None else shown
    filtered = any((flt.source, flt.reason, flt.message_id))
    summaries = [dl.summary(x.vhost, x.letters, x.before if filtered else None) for x in listings]
    if limit is not None and matching > limit:
        summaries.append(f"(showing {limit} of {matching}: --limit)")
    problems = [f"{x.vhost}: {t.DEAD_LETTER_QUEUE} held {x.before} messages before listing and {x.after} "
                "after; `list` removes nothing: another consumer took some meanwhile?"
                for x in listings if x.after is not None and x.after < x.before]
    if as_json:
        for letter, headers in shown:
            print(json.dumps({**letter.to_json(), "headers": headers}, ensure_ascii=False))
        for line in summaries:
            print(line, file=sys.stderr)
    else:
        if shown:
            print("\n".join(table([x for x, _ in shown])))
            print()
        print("\n".join(summaries))
    for line in problems:
        print(f"geofence dlq list: warning: {line}", file=sys.stderr)
    return 1 if problems else 0


# --------------------------------------------------------------------------- replay


@dataclass
class Outcome:
    vhost: str
    before: int
    replayed: Counter[str] = field(default_factory=Counter)  # by source queue
    refused: list[tuple[dl.DeadLetter, str]] = field(default_factory=list)
    skipped: int = 0  # replayed since this run started, back already
    after: int | None = None

    @property
    def matching(self) -> int:
        return sum(self.replayed.values()) + len(self.refused) + self.skipped


class Replayer:
    """Replays one vhost's dead letters (see the module docstring)."""

    def __init__(self, conn: AbstractConnection, vhost: str, run_id: str, dry_run: bool) -> None:
        self.conn, self.vhost, self.run_id, self.dry_run = conn, vhost, run_id, dry_run
        self.routes: dict[str, AbstractExchange | str] = {}  # queue -> its exchange, or why none
        self.checked: dict[str, str | None] = {}  # queue -> None if it exists, else why not
        self.publisher: AbstractChannel | None = None

    async def check(self, queue: str) -> None:
        """Raises NotReplayable unless `queue` exists."""
        if queue not in self.checked:
            try:
                await queue_length(self.conn, queue)
                self.checked[queue] = None
            except aiormq.exceptions.ChannelNotFoundEntity:
                self.checked[queue] = f"its source queue {queue!r} does not exist in {self.vhost}"
            except aiormq.exceptions.ChannelAccessRefused as exc:
                self.checked[queue] = f"no access to its source queue {queue!r}: {exc}"
        why = self.checked[queue]
        if why is not None:
            raise dl.NotReplayable(why)

    async def target(self, queue: str) -> AbstractExchange:
        """The private exchange that reaches `queue` alone (made once per run)."""
        route = self.routes.get(queue)
        if isinstance(route, str):
            raise dl.NotReplayable(route)
        if route is not None:
            return route
        await self.check(queue)
        name = f"gf-dlq-replay.{self.run_id}.{len(self.routes)}"
        try:
            if self.publisher is None or self.publisher.is_closed:
                self.publisher = await self.conn.channel(publisher_confirms=True, on_return_raises=True)
            ex = await self.publisher.declare_exchange(name, aio_pika.ExchangeType.FANOUT, durable=False,
                                                       auto_delete=True)
            self.routes[queue] = ex  # cleanup deletes it, even if the binding fails
            q = await self.publisher.get_queue(queue, ensure=False)
            await q.bind(ex)
        except aiormq.exceptions.AMQPChannelError as exc:
            self.routes[queue] = f"cannot route to {queue!r} through exchange {name!r}: {exc}"
            raise dl.NotReplayable(self.routes[queue]) from None
        return ex

    async def cleanup(self) -> None:
        """Delete the private exchanges (with their bindings), on a channel of their own."""
        made = [ex for ex in self.routes.values() if not isinstance(ex, str)]
        if self.publisher is not None:
            await close_quietly(self.publisher)
        for ex in made:  # a channel each: an error closes the channel it happens on
            ch = await self.conn.channel()
            try:
                await ch.exchange_delete(ex.name)
            except aiormq.exceptions.AMQPChannelError as exc:
                print(f"geofence dlq replay: warning: could not delete exchange {ex.name!r} in "
                      f"{self.vhost} ({exc}); delete it by hand", file=sys.stderr)
            finally:
                await close_quietly(ch)

    async def publish(self, replay: dl.Replay, body: bytes) -> str | None:
        """None once the broker confirmed it in the queue; else why not."""
        ex = await self.target(replay.queue)
        message = aio_pika.Message(body, headers=replay.headers,
                                   delivery_mode=aio_pika.DeliveryMode.PERSISTENT, **replay.properties)
        try:
            confirm = await ex.publish(message, replay.routing_key, mandatory=True, timeout=CONFIRM_TIMEOUT_S)
        except aiormq.exceptions.PublishError as exc:
            return f"returned by the broker: {exc.message.delivery.reply_text}"  # type: ignore[union-attr]
        except aiormq.exceptions.DeliveryError:
            return f"refused by the broker (nack: is {replay.queue} full?)"
        except TimeoutError:
            return f"no confirm within {CONFIRM_TIMEOUT_S:g}s (it may have been delivered too)"
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            return f"publish failed ({type(exc).__name__}: {exc})"
        if confirm is not None and not isinstance(confirm, Basic.Ack):
            return f"broker answered {type(confirm).__name__}"
        return None

    async def run(self, flt: dl.Filter, budget: int | None, since: float, say: Callable[[str], None],
                  step: Callable[[int, int], None] | None = None) -> Outcome:
        ch, queue, before = await open_dead_letters(self.conn, self.vhost)
        out = Outcome(self.vhost, before)
        try:
            for n in range(before):  # what the queue held when we came; later arrivals wait
                if step is not None:
                    step(n, before)
                if budget is not None and out.matching >= budget:
                    break
                m = await queue.get(no_ack=False, fail=False)
                if m is None:
                    break
                letter = dl.parse(raw_message(self.vhost, m))
                if not flt.matches(letter):
                    continue  # stays (unacked: back when the channel closes)
                if dl.replayed_since(letter, since):
                    out.skipped += 1
                    continue
                why = await self.replay_one(m, letter)
                if why is None:
                    out.replayed[letter.source or ""] += 1
                    say(f"{'would replay' if self.dry_run else 'replayed'}  {_describe(letter)}")
                else:
                    out.refused.append((letter, why))
                    say(f"NOT replayed  {_describe(letter)}: {why}; it stays in {t.DEAD_LETTER_QUEUE}")
        finally:
            await close_quietly(ch)  # what was not acked goes back, in its order
            await self.cleanup()
        if not self.dry_run:
            out.after = await queue_length(self.conn)
        return out

    async def replay_one(self, m: AbstractIncomingMessage, letter: dl.DeadLetter) -> str | None:
        try:
            replay = dl.replay_of(letter, dict(m.headers or {}), properties(m), time.time())
            if self.dry_run:
                await self.check(replay.queue)
                return None
            why = await self.publish(replay, m.body)
        except dl.NotReplayable as exc:
            return str(exc)
        if why is None:
            try:
                await m.ack()  # only now: the copy in its queue is the broker's
            except (*BROKER_GONE, aiormq.exceptions.AMQPError, RuntimeError) as exc:
                return (f"published to {replay.queue}, but removing it from {t.DEAD_LETTER_QUEUE} failed "
                        f"({type(exc).__name__}: {exc}): it is in both now")
        return why


def _describe(letter: dl.DeadLetter) -> str:
    return (f"{letter.vhost}  {letter.source or '-'}  {letter.message_id or '(no message id)'}  "
            f"({_cut(letter.reason, REASON_COLUMN)})")


def replay_summary(out: Outcome, dry_run: bool) -> str:
    verb = "would replay" if dry_run else "replayed"
    n = sum(out.replayed.values())
    line = f"{out.vhost}: {verb} {n} of {out.matching} matching dead letters"
    if out.replayed:
        line += " (" + ", ".join(f"{c} to {q}" for q, c in out.replayed.most_common()) + ")"
    if out.refused:
        line += f"; {len(out.refused)} could not be replayed and stay in {t.DEAD_LETTER_QUEUE}"
    if out.skipped:
        line += f"; {out.skipped} skipped (replayed by this run and dead-lettered again already)"
    return line


async def replay_command(urls: dict[str, str], flt: dl.Filter, limit: int | None, dry_run: bool) -> int:
    since = time.time()
    run_id = uuid.uuid4().hex[:12]
    outcomes: list[Outcome] = []
    for vhost, url in urls.items():
        budget = None if limit is None else limit - sum(o.matching for o in outcomes)
        if budget is not None and budget <= 0:
            break
        conn = await connect(url, vhost)
        try:
            with Progress(0, f"{vhost} dead letters", "letter") as bar:  # a bar and its ETA on a terminal
                outcomes.append(await Replayer(conn, vhost, run_id, dry_run).run(
                    flt, budget, since, bar.write, step=bar.to))
        finally:
            await close_quietly(conn)
    for out in outcomes:
        if out.matching:
            print(replay_summary(out, dry_run))
    replayed = sum(sum(o.replayed.values()) for o in outcomes)
    refused = sum(len(o.refused) for o in outcomes)
    verb = "would replay" if dry_run else "replayed"
    print(f"{verb} {replayed} dead letter{'s' if replayed != 1 else ''}"
          + (f"; {refused} could not be replayed (still in {t.DEAD_LETTER_QUEUE})" if refused else "")
          + ("" if replayed or refused else " (none matched)"))
    for o in outcomes:
        if o.after is not None and o.after < o.before - sum(o.replayed.values()):
            print(f"geofence dlq replay: warning: {o.vhost}: {t.DEAD_LETTER_QUEUE} went from {o.before} "
                  f"to {o.after} messages while {sum(o.replayed.values())} were replayed: another "
                  "consumer took some meanwhile?", file=sys.stderr)
    return 1 if refused else 0


# --------------------------------------------------------------------------- entry point


def run(args: argparse.Namespace) -> int:
    action: str = args.action
    try:
        urls = targets(args)
        if action == "list":
            return asyncio.run(list_command(urls, _filter(args), args.limit, bool(args.json)))
        return asyncio.run(replay_command(urls, _filter(args), args.limit, bool(args.dry_run)))
    except UsageError as exc:
        return exit_codes.say(f"dlq {action}", exc, usage=True)
    except Unavailable as exc:
        return exit_codes.say(f"dlq {action}", exc, unreachable=True)
    except (*BROKER_GONE, aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
        return exit_codes.say(f"dlq {action}", exc, f"{type(exc).__name__}: {exc}; nothing unconfirmed was "
                              f"removed from the {t.DEAD_LETTER_QUEUE} queues")
