"""cffi build scripts (API / out-of-line mode) for the compiled modules of `hilbert_c`.

Run by setuptools at install (`cffi_modules` in setup.py). The default build is portable
`-O3` (no `-march=native`): GEOFENCE_KERNEL_CFLAGS adds flags for a local build.

Two modules from the same C sources, because of one trade-off:
- `hilbert_c._kernel`: batch calls and the covering. cffi releases the GIL around each call,
  so batches run in parallel with other Python threads.
- `hilbert_c._scalar`: the scalar encode/decode, a ~5 ns computation. Releasing the GIL and
  saving errno around it (what cffi emits for every call) costs ~190 ns on this machine, 3x
  the call itself, so this module keeps the GIL.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

CDEF = """
typedef struct {
    uint64_t *ranges;
    uint8_t *interior;
    int64_t n;
    int64_t nodes;
    int64_t boundary_cells;
    int max_level;
} hk_covering;

void line_to_axes_2D_26b(uint64_t h, uint32_t *x, uint32_t *y);
int64_t hk_encode_many(const uint32_t *xs, const uint32_t *ys, uint64_t *hs, size_t n, int bits);
int64_t hk_decode_many(const uint64_t *hs, uint32_t *xs, uint32_t *ys, size_t n, int bits);
int64_t hk_lonlat_to_grid(const double *lon, const double *lat, uint32_t *xs, uint32_t *ys,
                          size_t n, int bits);
int64_t hk_lonlat_to_unit(const double *lon, const double *lat, double *us, double *vs,
                          size_t n, int bits);
int64_t hk_grid_to_lonlat(const uint32_t *xs, const uint32_t *ys, double *lon, double *lat,
                          size_t n, int bits);
int hk_cover(const double *lon, const double *lat, const int64_t *ring_ends, int64_t n_rings,
             int bits, int max_level, int64_t max_nodes, hk_covering *out);
void hk_covering_free(hk_covering *c);
int hk_cover_many(const double *lon, const double *lat, const int64_t *ring_ends,
                  const int64_t *poly_rings, int64_t n_polys, const int32_t *bits, int out_bits,
                  int64_t max_nodes, hk_covering *out, int64_t *counts, int32_t *status,
                  int64_t *nodes);
void hk_points_in_polygons(const double *ax, const double *ay, const double *bx, const double *by,
                           const int64_t *edge_lo, const int64_t *edge_hi,
                           const double *px, const double *py, size_t n, uint8_t *out);
int64_t hk_match_sorted(const uint64_t *keys, size_t n_keys, const uint64_t *needles, size_t n,
                        int64_t *hit, int64_t *at);

#define HK_OK ...
#define HK_E_BITS ...
#define HK_E_COORD ...
#define HK_E_NOMEM ...
#define HK_E_BUDGET ...
#define HK_E_RINGS ...
#define HK_PIP_OUT ...
#define HK_PIP_IN ...
#define HK_PIP_UNSURE ...
#define HK_MIN_BITS ...
#define HK_MAX_BITS ...
"""

SCALAR_CDEF = """
uint64_t hk_encode(int64_t x, int64_t y, int bits);
uint64_t hk_decode(uint64_t h, int bits);
uint64_t axes_to_line_2D_26b(uint32_t x, uint32_t y);
"""

# Appended after cffi's own helper macros and before the wrappers it generates: the
# wrappers of this module then neither drop the GIL nor touch errno.
KEEP_GIL = """
#undef Py_BEGIN_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#undef Py_END_ALLOW_THREADS
#define Py_END_ALLOW_THREADS }
#undef _cffi_restore_errno
#define _cffi_restore_errno() ((void)0)
#undef _cffi_save_errno
#define _cffi_save_errno() ((void)0)
"""


def _options() -> dict[str, object]:
    return {
        "include_dirs": ["hilbert_c"],
        "extra_compile_args": ["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-math-errno",
                               "-ffp-contract=off",
                               *os.environ.get("GEOFENCE_KERNEL_CFLAGS", "").split()],
        "libraries": ["m"],
    }


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "hilbert_c._kernel",
    '#include "hilbert.h"',
    sources=[str(Path("hilbert_c") / name) for name in ("curve.c", "covering.c", "contains.c", "search.c")],
    **_options(),
)

scalar_builder = FFI()
scalar_builder.cdef(SCALAR_CDEF)
scalar_builder.set_source(
    "hilbert_c._scalar",
    '#include "hilbert.h"\n' + KEEP_GIL,
    sources=[str(Path("hilbert_c") / "curve.c")],
    **_options(),
)

if __name__ == "__main__":
    os.chdir(HERE.parent)
    ffibuilder.compile(verbose=True)
    scalar_builder.compile(verbose=True)
