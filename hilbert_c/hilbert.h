/* Hilbert kernel: 2D Hilbert index, lon/lat grid mapping and polygon covering.
 *
 * Convention (Nokia design, identical to PyPI `hilbertcurve`): at order 1,
 * (0,0)->0, (0,1)->1, (1,1)->2, (1,0)->3; the top-level quadrant order is the
 * same at every order, so an index at `bits` bits per axis is the top 2*bits
 * bits of the index at 32 bits of the same point shifted to the top.
 */
#ifndef GEOFENCE_HILBERT_H
#define GEOFENCE_HILBERT_H

#include <stddef.h>
#include <stdint.h>

#define HK_MIN_BITS 1
#define HK_MAX_BITS 31
#define HK_INVALID UINT64_MAX

/* Scalar: HK_INVALID if bits or a coordinate is out of range. */
uint64_t hk_encode(int64_t x, int64_t y, int bits);
/* Scalar: (x << 32) | y, or HK_INVALID if bits or h is out of range. */
uint64_t hk_decode(uint64_t h, int bits);

/* The design's NIF names, 26 bits per axis. */
uint64_t axes_to_line_2D_26b(uint32_t x, uint32_t y);
void line_to_axes_2D_26b(uint64_t h, uint32_t *x, uint32_t *y);

/* Batch over buffers. Return -1 on success, else the index of the first
 * element out of range (nothing is guaranteed about the outputs then). */
int64_t hk_encode_many(const uint32_t *xs, const uint32_t *ys, uint64_t *hs, size_t n, int bits);
int64_t hk_decode_many(const uint64_t *hs, uint32_t *xs, uint32_t *ys, size_t n, int bits);

/* WGS84 degrees <-> grid. lon in [-180, 180] maps to x in [0, 2^bits)
 * (lon = 180 to the last column), lat in [-90, 90] likewise to y.
 * Return -1 on success, else the index of the first invalid coordinate
 * (NaN, infinite or out of range). */
int64_t hk_lonlat_to_grid(const double *lon, const double *lat, uint32_t *xs, uint32_t *ys,
                          size_t n, int bits);
/* Continuous grid coordinates (cell units, x = floor(u)): the covering's space. */
int64_t hk_lonlat_to_unit(const double *lon, const double *lat, double *us, double *vs,
                          size_t n, int bits);
/* Cell centres back to degrees. -1 or the index of the first cell out of range. */
int64_t hk_grid_to_lonlat(const uint32_t *xs, const uint32_t *ys, double *lon, double *lat,
                          size_t n, int bits);

/* Polygon covering. */
typedef struct {
    uint64_t *ranges;    /* n x 2, inclusive [start, end], sorted, disjoint */
    uint8_t *interior;   /* n flags: 1 when every cell of the range lies inside */
    int64_t n;
    int64_t nodes;       /* quadtree nodes visited */
    int64_t boundary_cells;
    int max_level;       /* level the descent stopped at (== bits unless coarsened) */
} hk_covering;

#define HK_OK 0
#define HK_E_BITS -1
#define HK_E_COORD -2
#define HK_E_NOMEM -3
#define HK_E_BUDGET -4
#define HK_E_RINGS -5

/* lon/lat vertices of every ring of every polygon, ring i spanning
 * [ring_ends[i-1], ring_ends[i]) (closing vertex optional). Inside is the
 * even-odd rule over all rings: holes and multipolygon parts need no flags for
 * a valid (OGC) geometry. Descends to `max_level` (<= bits); fails with
 * HK_E_BUDGET once more than `max_nodes` quadtree nodes would be visited.
 * On HK_OK the caller owns `out` and frees it with hk_covering_free. */
int hk_cover(const double *lon, const double *lat, const int64_t *ring_ends, int64_t n_rings,
             int bits, int max_level, int64_t max_nodes, hk_covering *out);
void hk_covering_free(hk_covering *c);
/* Polygon p of n_polys: rings [poly_rings[p], poly_rings[p + 1]) of ring_ends (vertex
 * counts from the start of lon/lat), covered at bits[p]; every range expressed at out_bits
 * and appended to `out` in polygon order; counts, status (HK_OK or that polygon's error)
 * and nodes per polygon. HK_OK unless out_bits is invalid or memory runs out. */
int hk_cover_many(const double *lon, const double *lat, const int64_t *ring_ends,
                  const int64_t *poly_rings, int64_t n_polys, const int32_t *bits, int out_bits,
                  int64_t max_nodes, hk_covering *out, int64_t *counts, int32_t *status,
                  int64_t *nodes);

/* Strictly inside (GEOS contains_xy), point i against the polygon whose edges are
 * (ax, ay) -> (bx, by) for e in [edge_lo[i], edge_hi[i]) (every ring, even-odd rule):
 * HK_PIP_OUT, HK_PIP_IN, or HK_PIP_UNSURE when only exact arithmetic could tell (the
 * point may be on an edge), when edge_lo[i] < 0 or the point is not finite. */
#define HK_PIP_OUT 0
#define HK_PIP_IN 1
#define HK_PIP_UNSURE 2
void hk_points_in_polygons(const double *ax, const double *ay, const double *bx, const double *by,
                           const int64_t *edge_lo, const int64_t *edge_hi,
                           const double *px, const double *py, size_t n, uint8_t *out);

/* For keys sorted ascending and distinct: the needles equal to some key, as (needle
 * index, key index) pairs in needle order; returns how many. Fastest with needles
 * sorted ascending (each search starts from the previous answer). */
int64_t hk_match_sorted(const uint64_t *keys, size_t n_keys, const uint64_t *needles, size_t n,
                        int64_t *hit, int64_t *at);

/* A batch of the roaming matcher (fence/x_fence/roaming.py): movers in row order (an object
 * may move more than once) against the positions valid at each row. Entries are the held
 * positions (e_row -1), each moving object's position before its first row (e_ver 0, e_row =
 * that row) and each row's new position (e_ver 1, e_row = its row); entry i is the position of
 * its object for the rows k with e_from[i] < k < e_to[i]. e_cell = x * side + y at the
 * matcher's index grid; e_own says whether an entry's position is in a block of this worker.
 * Two indexes of the entries, each sorted both ways (by x * side + y and by y * side + x,
 * keys with the entry of each): `a` every entry, `s` the entries of objects that carry
 * subscriptions. Per mover, four boxes of index cells q[k][b] = {x0, x1, y0, y1} (x may run
 * past the antimeridian, to be taken modulo side; x0 > x1: no box): 0 / 1 the mover's own
 * largest circle at its new / old position, searched in `a` (its subscriptions against the
 * others), 2 / 3 the largest circle of any subscriber, searched in `s` (the others'
 * subscriptions against the mover). Subscriptions by subscriber slot (CSR s_ptr over slots):
 * radius and filter number; filter flags are [filter][slot] for the held, [filter][row]
 * before and after for the movers. */
typedef struct {
    int64_t n_slots, n_movers, n_entries, side, n_a, n_s;
    double r_max;
    const int64_t *m_slot;
    const double *m_olon, *m_olat, *m_nlon, *m_nlat, *m_rmax;
    const uint8_t *m_had_old, *m_own_old, *m_own_new;
    const int64_t *q;
    const int64_t *e_cell, *e_slot, *e_row, *e_from, *e_to;
    const double *e_lon, *e_lat;
    const uint8_t *e_ver, *e_own;
    const int64_t *ax_key, *ax_ent, *ay_key, *ay_ent, *sx_key, *sx_ent, *sy_key, *sy_ent;
    const int64_t *s_ptr, *s_filter;
    const double *s_radius;
    const uint8_t *pass_held, *pass_old, *pass_new;
} hk_roam_segment;

/* The pairs whose state a mover's row changes and whose report falls to this worker, plus
 * those within 1e-6 m of a radius (flag 4: the caller decides them with its own haversine):
 * (row k, subscription j, entry i of the other object, flags: 1 the subscription is the
 * mover's, 2 near after, 4 unsure, 8 / 16 the filter passed before / after, distance after).
 * Writes up to cap; returns how many there are. work[0] counts the index searches, work[1]
 * the entries looked at: the cost, which depends on the boxes' sizes and the entries in them,
 * never on how far a mover went. */
int64_t hk_roam_pairs(const hk_roam_segment *g, int64_t *o_k, int64_t *o_j, int64_t *o_i, uint8_t *o_flags,
                      double *o_d, int64_t cap, int64_t *work);

#endif
