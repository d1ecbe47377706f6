"""One way every process reads its settings, and one way a secret is hidden.

Each process builds one frozen dataclass from the environment, once, in its `main`: a
sidecar's `SidecarConfig` (exchanges/shell/config.py), the API's `ApiConfig`, a Spark job's
`JobConfig`, the local stack's `Settings` (deploy/). They all take their GEOFENCE_* keys
through `given`, which refuses a key that no part of the process knows (a typo fails loudly
instead of being ignored), raise `ConfigError` with the key and what is wrong, and show URLs
and secrets only through `mask`. Every key is declared once, with its type, default and the
processes that read it, in exchanges/settings_registry.py; each process's known keys are views
of it (`geofence settings` lists them).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

PREFIX = "GEOFENCE_"
MASK = "****"


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names it and says what is expected."""


def given(env: Mapping[str, str] | None, known: Iterable[str]) -> dict[str, str]:
    """The GEOFENCE_* settings of `env` (default: the process's environment); ConfigError
    naming every one not in `known`."""
    env = os.environ if env is None else env
    out = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    known = sorted(set(known))
    unknown = sorted(set(out) - set(known))
    if unknown:
        named = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            named.append(f"{key} (did you mean {close[0]}?)" if close else key)
        raise ConfigError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
                          f"known: {', '.join(known)}")
    return out


_USERINFO = re.compile(r"(://[^/:@\s]*):[^@/\s]*@")
_PASSWORD_PARAM = re.compile(r"(?i)([?&]password=)[^&#\s]*")


def mask(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with its secrets hidden: the password of every URL in it (user:password@ and a
    password= parameter) and each of `secrets`, plain or URL-quoted, replaced by ****."""
    variants = {v for s in secrets if s for v in (s, quote(s, safe=""))}
    for value in sorted(variants, key=len, reverse=True):
        text = text.replace(value, MASK)
    return _PASSWORD_PARAM.sub(rf"\1{MASK}", _USERINFO.sub(rf"\1:{MASK}@", text))


def positive(key: str, raw: str, kind: type[int] | type[float]) -> Any:
    """Setting `key` as a number > 0 (ConfigError otherwise)."""
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: not a number") from None
    if not value > 0:
        raise ConfigError(f"{key}={raw!r}: must be positive")
    return value
