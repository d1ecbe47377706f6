"""The Hilbert kernel: 2D Hilbert index in C (cffi, API mode), lon/lat grid, polygon covering.

Grid: lon [-180, 180] and lat [-90, 90] map linearly onto [0, 2**bits) per axis. One cell is
360/2**bits degrees of longitude by 180/2**bits of latitude; at 47 N (`cell_size_m`):

    bits  cell (W x H)         bits  cell (W x H)
    17    209 m x 153 m        22    6.5 m x 4.8 m
    19    52 m x 38 m          24    1.6 m x 1.2 m
    20    26 m x 19 m          26    0.41 m x 0.30 m
"""

from hilbert_c.covering import (
    Covering,
    InvalidGeometry,
    as_geometry,
    cell_size_m,
    circle,
    coarsen,
    cover,
    geometry_area_m2,
    ranges_contain,
    ranges_lookup,
)
from hilbert_c.kernel import (
    COORD_SLACK_DEG,
    MAX_BITS,
    MIN_BITS,
    clamp_lonlat,
    decode,
    decode_many,
    encode,
    encode_many,
    grid_to_lonlat,
    lonlat_to_grid,
)

__all__ = [
    "COORD_SLACK_DEG",
    "MAX_BITS",
    "MIN_BITS",
    "Covering",
    "InvalidGeometry",
    "as_geometry",
    "cell_size_m",
    "circle",
    "clamp_lonlat",
    "coarsen",
    "cover",
    "decode",
    "decode_many",
    "encode",
    "encode_many",
    "geometry_area_m2",
    "grid_to_lonlat",
    "lonlat_to_grid",
    "ranges_contain",
    "ranges_lookup",
]
