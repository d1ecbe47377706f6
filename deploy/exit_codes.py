"""The `geofence` command's exit codes, one table for every subcommand (README, "The
`geofence` command"):

    0  done
    1  the operation failed (refused, not found, conflicting, or it went wrong on the way)
    2  bad usage or settings (arguments, GEOFENCE_* variables, a file that is not what it should be)
    3  a service it needs is unreachable (RabbitMQ, PostgreSQL, the API, the Firebase emulator ...)

An expected failure is one line on stderr, `geofence <command>: error: <what>`, never a
traceback; a traceback means a bug. `code_of` finds the code of an exception by its type and by
the exceptions it was raised from or while handling (a connection refused deep inside a client
library is a 3 whatever wraps it).
"""

from __future__ import annotations

import errno
import socket
import ssl
import sys
import urllib.error

from deploy.processes import ServiceUnreachable, StackError
from exchanges.settings import ConfigError

OK, FAILED, USAGE, UNREACHABLE = 0, 1, 2, 3

_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH,
                       errno.ETIMEDOUT, errno.ECONNABORTED, errno.EPIPE}


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in seen and len(seen) < 20:
        seen.append(at)
        at = at.__cause__ or at.__context__
    return seen


def _is_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, ServiceUnreachable | socket.gaierror | ConnectionError | TimeoutError):
        return not isinstance(exc, ssl.SSLError)
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, OSError):
        return _is_unreachable(exc.reason)
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS:
        return True
    module = type(exc).__module__
    name = type(exc).__name__
    # client libraries' own connection errors, by name (importing them here would load them
    # for every command)
    return (module.startswith("asyncpg") and name in ("CannotConnectNowError", "ConnectionDoesNotExistError",
                                                      "ConnectionFailureError", "TooManyConnectionsError")) \
        or (module.startswith("aiormq") and name in ("AMQPConnectionError", "IncompatibleProtocolError",
                                                     "ConnectionClosed")) \
        or (module.startswith("aio_pika") and name == "AMQPConnectionError")


def _is_usage(exc: BaseException) -> bool:
    return isinstance(exc, ConfigError) or getattr(exc, "exit_code", None) == USAGE


def code_of(exc: BaseException) -> int:
    """2 for a settings or usage error, 3 when a service is unreachable (anywhere in the
    exception's chain), else 1."""
    if _is_usage(exc):
        return USAGE
    if any(_is_unreachable(e) for e in _chain(exc)):
        return UNREACHABLE
    return FAILED


def expected(exc: BaseException) -> bool:
    """A failure the command reports in one line (not a bug): the stack's and the settings'
    errors, I/O and the services' errors, refusals of the operation itself."""
    if isinstance(exc, StackError | ConfigError | OSError | urllib.error.URLError):
        return True
    module = type(exc).__module__.split(".")[0]
    if module in ("asyncpg", "aiormq", "aio_pika"):
        return True
    return type(exc).__name__ in ("ApiError", "EmulatorError", "MigrationError", "InvalidFence",
                                  "InvalidTenant", "TextError", "UsageError", "BulkError")


def say(words: str, exc: BaseException, what: str | None = None, usage: bool = False,
        unreachable: bool = False) -> int:
    """`geofence <words>: error: <what>` on stderr; the exit code of `exc` (`usage`: the
    command's input was wrong, 2; `unreachable`: a service did not answer, 3)."""
    code = code_of(exc)
    if code == FAILED and (usage or unreachable):
        code = USAGE if usage else UNREACHABLE
    text = what if what is not None else (str(exc) or type(exc).__name__)
    if code == UNREACHABLE and "geofence status" not in text:
        text += " (is the stack up? `geofence status`)"
    print(f"geofence {words}: error: {text}", file=sys.stderr)
    return code
