"""Push notifications behind a small interface: `Sender.send(pushes) -> results`.

- `FcmSender`: Firebase Cloud Messaging through firebase-admin (`messaging.send_each`, run in a
  thread: the SDK is blocking). Needs a service account (GOOGLE_APPLICATION_CREDENTIALS).
- `LocalSender`: the local stack has no FCM credentials and no internet: nothing leaves the
  machine, each push is answered `local` (the notification log shows what would have gone).
  Cloud Messaging has no emulator; the unit tests use a recording double.

Results: `sent` (FCM's message id), `unregistered` (the token is dead: the caller deletes it),
`transient` (quota, unavailable, internal: retried with backoff), `failed` (anything else:
logged, not retried).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SENT, UNREGISTERED, TRANSIENT, FAILED, LOCAL = "sent", "unregistered", "transient", "failed", "local"


@dataclass(frozen=True)
class Push:
    token: str
    title: str
    body: str
    hive_id: str
    data: dict[str, str] = field(default_factory=dict)
    collapse: str = ""  # a newer push with this key replaces an unread one (default: the hive's)


@dataclass(frozen=True)
class PushResult:
    status: str
    message_id: str | None = None
    error: str | None = None


class Sender(Protocol):
    async def send(self, pushes: Sequence[Push]) -> list[PushResult]: ...


class LocalSender:
    async def send(self, pushes: Sequence[Push]) -> list[PushResult]:
        return [PushResult(LOCAL, f"local-{uuid.uuid4().hex}", "not sent: no FCM credentials (local stack)")
                for _ in pushes]


class FcmSender:
    def __init__(self, app: Any = None) -> None:
        from firebase_admin import messaging  # here: only a configured sender needs the SDK's messaging

        self.messaging = messaging
        self.app = app

    def _message(self, p: Push) -> Any:
        m = self.messaging
        collapse = p.collapse or f"hive-{p.hive_id}"  # a newer message of the hive replaces an unread one
        return m.Message(token=p.token, notification=m.Notification(title=p.title, body=p.body),
                         data={"hive_id": p.hive_id, **p.data} if p.hive_id else dict(p.data),
                         android=m.AndroidConfig(collapse_key=collapse, priority="normal"),
                         apns=m.APNSConfig(headers={"apns-collapse-id": collapse}))

    async def send(self, pushes: Sequence[Push]) -> list[PushResult]:
        if not pushes:
            return []
        batch = await asyncio.to_thread(self.messaging.send_each, [self._message(p) for p in pushes],
                                        False, self.app)
        return [self._result(r) for r in batch.responses]

    def _result(self, r: Any) -> PushResult:
        if r.success:
            return PushResult(SENT, r.message_id)
        exc = r.exception
        m = self.messaging
        if isinstance(exc, m.UnregisteredError | m.SenderIdMismatchError):
            return PushResult(UNREGISTERED, None, repr(exc))
        code = getattr(exc, "code", "")
        if isinstance(exc, m.QuotaExceededError) or code in ("UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"):
            return PushResult(TRANSIENT, None, repr(exc))
        return PushResult(FAILED, None, repr(exc))


def configured_sender(credentials: str | None) -> tuple[Sender, str]:
    """The sender of a process (the sensor sidecar's, the webhooks sidecar's): Cloud Messaging
    with a service account key (GOOGLE_APPLICATION_CREDENTIALS), else the local one; and a line
    saying which."""
    if not credentials:
        return LocalSender(), ("notifications: no GOOGLE_APPLICATION_CREDENTIALS, nothing leaves this "
                               "machine (logged as local)")
    import firebase_admin  # only a configured sender needs the SDK's messaging

    app = firebase_admin.initialize_app(firebase_admin.credentials.Certificate(credentials), name="push")
    return FcmSender(app), "notifications through Firebase Cloud Messaging"
