"""`counts_from`: the tenants whose objects a fence also counts (the venue case: a hive's fence,
of the venue's tenant, counting the phones of the app's users who consented, of the app's
tenant). Cross-tenant presence exists only where both sides opted in: the fence's tenant names
the other tenant here, and the fence service accepts the name only while that tenant shares
its presence with the fence's (fence/tenants.py `presence_shares`, `PUT /tenants/{t}/shares/
{to}`); a share withdrawn takes the name off every such fence.

And then only as counts, never identities. x-fence lets such an object in (the tenant wall,
fence/x_fence/decisions.py, passes a pair whose object's tenant the fence counts from), and its
ENTER / LEAVE are presence events: no object id (a pseudonym per stay, `anon-<visit>`), on a
key no tenant may bind (`presence.<tenant>.<fence>.<kind>`), archived as shared (the events API
leaves them out), left out of the live map's events and of the occupants a tenant reads (which
give their number only). The sensor sidecar counts a hive's phones from them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import FenceOption, InvalidFence, shown
from exchanges.tenancy import is_tenant

MAX_TENANTS = 16
ANON_PREFIX = "anon-"  # a presence event's object: a pseudonym of the stay, never the object


def check_counts_from(value: Any) -> tuple[str, ...]:
    """A list of tenant ids (at most MAX_TENANTS), sorted, each once; null or [] for none."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > MAX_TENANTS:
        raise InvalidFence(f"counts_from {shown(value)}: a list of at most {MAX_TENANTS} tenant ids")
    bad = [v for v in value if not is_tenant(v)]
    if bad:
        raise InvalidFence(f"counts_from: {shown(bad[0])} is not a tenant id")
    return tuple(sorted(set(value)))


class CountsFrom(FenceOption):
    key: ClassVar[str] = "counts_from"
    default: ClassVar[Any] = ()

    def check(self, raw: Any, geometry: BaseGeometry) -> tuple[str, ...]:
        return check_counts_from(raw)

    def encode(self, value: Any) -> Any:
        return list(value)

    def decode(self, raw: Any) -> tuple[str, ...]:
        return tuple(raw)

    def is_set(self, value: Any) -> bool:
        return bool(value)

    def column(self, value: Any) -> float:
        return 1.0 if value else 0.0


OPTION = CountsFrom()
