"""A fence's binding on an x-geo region: its Hilbert ranges at INDEX_BITS (pure data).

The vocabulary every part shares about bindings: the fence service computes them
(fence/spec.py), the store keeps them (fence/store.py), control messages carry them
(exchanges/control.py), x-geo routes on them (exchanges/x_geo/), the nightly job rebuilds them
(spark_jobs/). Here, not in x-geo, so that none of those imports a routing core for a type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

INDEX_BITS = 26  # bits per axis of the indices routed (positions are encoded at 26 bits)


@dataclass(frozen=True, eq=False)
class FenceBinding:
    """A fence's ranges in one region: sorted, disjoint, inclusive, at INDEX_BITS."""

    fence_id: str
    version: int
    ranges: npt.NDArray[np.uint64]
    interior: npt.NDArray[np.bool_]
    # the fence's bounding box when it detects CROSS (FenceDef.cross_box, exchanges/fence_options/cross.py):
    # segments between an object's positions here are tested against it
    cross: tuple[float, float, float, float] | None = None
