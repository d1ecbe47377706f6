"""Tenants: who a name belongs to, inside the pipeline (pure, no I/O).

Trade-off: a tenant's names are *qualified* inside the pipeline, `<tenant>:<name>` (an object
`fleet:car-1`, a fence `fleet:depot`, a subscription `fleet:rs-1`), instead of a tenant field
carried beside every id. Every role already keys its state by these strings, opaquely, so two
tenants' `car-1` are two objects in x-ingress, x-geo and x-fence without a change to their
cores, a lookup by a qualified id can never reach another tenant's row (scoping by
construction, not by a check someone may forget), and the one comparison that is new, a
fence against a position (x-fence, `same_tenant`), is one array operation on codes. The price:
the edges translate. x-ingress qualifies what a credential published (its tenant is in the
routing key, which RabbitMQ's topic permissions tie to the credential); the API qualifies
what a member names and unqualifies what it returns; the events carry `tenant` beside the
names as the tenant gave them.

A name without a tenant (no `:`) belongs to the tenant "" (`NO_TENANT`): the platform's own
(a hive's fixed point, the tests of the cores). No credential publishes into it: x-ingress
always qualifies, and "" is not a tenant id anyone can create.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

SEP = ":"
NO_TENANT = ""
TENANT_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
TENANT_RULE = "1-32 characters from a-z 0-9 -, starting with a letter or digit"
ROLES = ("viewer", "editor", "admin")  # each may do what the one before it may


class InvalidTenant(ValueError):
    """A tenant id that is not one (see TENANT_RULE)."""


def is_tenant(value: object) -> bool:
    return isinstance(value, str) and TENANT_RE.fullmatch(value) is not None


def check_tenant(value: object) -> str:
    if not is_tenant(value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise InvalidTenant(f"tenant {shown}: {TENANT_RULE}")
    assert isinstance(value, str)
    return value


def qualify(tenant: str, name: str) -> str:
    """`<tenant>:<name>`; the name itself for NO_TENANT."""
    return f"{tenant}{SEP}{name}" if tenant else name


def split(key: str) -> tuple[str, str]:
    """(tenant, name) of a qualified key; (NO_TENANT, key) for a key without one."""
    tenant, sep, name = key.partition(SEP)
    return (tenant, name) if sep else (NO_TENANT, key)


def tenant_of(key: str) -> str:
    tenant, sep, _ = key.partition(SEP)
    return tenant if sep else NO_TENANT


def name_of(key: str) -> str:
    _, sep, name = key.partition(SEP)
    return name if sep else key


def is_qualified_as(key: str, tenant: str) -> bool:
    """Whether `key` is one of `tenant`'s names."""
    return tenant_of(key) == tenant


def unqualified(keys: Iterable[str], tenant: str) -> list[str]:
    """The names of `tenant`'s keys among `keys` (the others dropped), in order."""
    prefix = f"{tenant}{SEP}" if tenant else ""
    if not prefix:
        return [k for k in keys if SEP not in k]
    n = len(prefix)
    return [k[n:] for k in keys if k.startswith(prefix)]


class TenantCodes:
    """Tenant id -> a small dense code (0 is NO_TENANT), for comparing tenants as arrays. Codes
    are local to a process and never reused; nothing stores them."""

    def __init__(self) -> None:
        self._code: dict[str, int] = {NO_TENANT: 0}

    def code(self, tenant: str) -> int:
        found = self._code.get(tenant)
        if found is None:
            found = self._code[tenant] = len(self._code)
        return found

    def of_keys(self, keys: Sequence[str]) -> npt.NDArray[np.int32]:
        """The code of each key's tenant."""
        code = self.code
        return np.fromiter((code(tenant_of(k)) for k in keys), np.int32, len(keys))
