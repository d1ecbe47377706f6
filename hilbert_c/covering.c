/* Polygon covering: a quadtree descent along the Hilbert curve.
 *
 * Every node is a cell of the curve at some level, visited in curve order, so
 * ranges come out sorted and adjacent ones merge on the fly. A node keeps the
 * polygon edges that touch it (filtered from its parent's list, so deep nodes
 * test a handful of edges, not the whole polygon):
 *   - edges touch the cell  -> boundary: recurse, or emit at the last level;
 *   - no edge touches it    -> wholly inside or wholly outside: one
 *                              point-in-polygon test at its centre decides.
 * Trade-off: the "touch" test is done against the cell grown by EPS cell units,
 * so a cell whose border only grazes an edge within floating-point noise is
 * kept as boundary. That costs a few extra boundary cells and buys the two
 * guarantees exactly: no inside point is ever outside the covering (no false
 * negatives) and an interior cell never holds an outside point. The centre test
 * of an untouched cell is robust because its centre is half a cell from any edge.
 * Point-in-polygon uses horizontal bands of edges so that it costs O(edges in
 * one band), not O(all edges).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hilbert.h"

/* Touch tolerance in cell units: well above the rounding of coordinates that
 * reach 2^31 (ulp 2.4e-7), far below a cell. */
#define EPS (1.0 / 65536.0)

typedef struct {
    double x0, y0, x1, y1;
    double minx, maxx, miny, maxy;
} edge_t;

typedef struct {
    const edge_t *edges;
    int64_t n_edges;
    /* point-in-polygon bands */
    double band_y0, band_inv_h;
    int64_t n_bands;
    int64_t *band_start; /* n_bands + 1 offsets into band_edges */
    int32_t *band_edges;
    /* per-level edge-index buffers */
    int32_t **level_buf;
    int64_t *level_cap;
    int bits, max_level;
    int64_t max_nodes, nodes, boundary_cells;
    /* output */
    uint64_t *ranges;
    uint8_t *interior;
    int64_t n, cap;
    int err;
} ctx_t;

/* Hilbert state machine for the convention (0,0)->0 (0,1)->1 (1,1)->2 (1,0)->3.
 * States are the four orientations {I, transpose, rotate 180, anti-transpose}
 * of the base order; child k of a state-s cell lies in quadrant QUAD[s][k]
 * (x bit << 1 | y bit) and has state NEXT[s][k]. */
static const uint8_t QUAD[4][4] = {
    {0, 1, 3, 2}, /* I:  (0,0) (0,1) (1,1) (1,0) */
    {0, 2, 3, 1}, /* T:  (0,0) (1,0) (1,1) (0,1) */
    {3, 2, 0, 1}, /* R:  (1,1) (1,0) (0,0) (0,1) */
    {3, 1, 0, 2}, /* A:  (1,1) (0,1) (0,0) (1,0) */
};
static const uint8_t NEXT[4][4] = {
    {1, 0, 0, 3},
    {0, 1, 1, 2},
    {3, 2, 2, 1},
    {2, 3, 3, 0},
};

static inline int64_t band_of(const ctx_t *c, double y)
{
    double b = (y - c->band_y0) * c->band_inv_h;
    if (!(b >= 0.0))
        return 0;
    if (b >= (double)(c->n_bands - 1))
        return c->n_bands - 1;
    return (int64_t)b;
}

/* Even-odd crossing test of a horizontal ray to +x, half-open in y. */
static int point_inside(const ctx_t *c, double px, double py)
{
    if (c->n_bands == 0)
        return 0;
    int64_t b = band_of(c, py);
    int inside = 0;
    for (int64_t k = c->band_start[b]; k < c->band_start[b + 1]; k++) {
        const edge_t *e = &c->edges[c->band_edges[k]];
        if ((e->y0 > py) != (e->y1 > py)) {
            double xi = e->x0 + (py - e->y0) * (e->x1 - e->x0) / (e->y1 - e->y0);
            if (px < xi)
                inside = !inside;
        }
    }
    return inside;
}

/* Does the edge touch the box [x0,x1]x[y0,y1] (already grown by EPS)? */
static inline int edge_touches(const edge_t *e, double x0, double y0, double x1, double y1)
{
    if (e->maxx < x0 || e->minx > x1 || e->maxy < y0 || e->miny > y1)
        return 0;
    double dx = e->x1 - e->x0, dy = e->y1 - e->y0;
    double f00 = dx * (y0 - e->y0) - dy * (x0 - e->x0);
    double f10 = dx * (y0 - e->y0) - dy * (x1 - e->x0);
    double f01 = dx * (y1 - e->y0) - dy * (x0 - e->x0);
    double f11 = dx * (y1 - e->y0) - dy * (x1 - e->x0);
    if (f00 > 0 && f10 > 0 && f01 > 0 && f11 > 0)
        return 0;
    if (f00 < 0 && f10 < 0 && f01 < 0 && f11 < 0)
        return 0;
    return 1;
}

static void emit(ctx_t *c, uint64_t start, uint64_t end, uint8_t interior)
{
    if (c->n > 0 && c->interior[c->n - 1] == interior && c->ranges[2 * c->n - 1] + 1 == start) {
        c->ranges[2 * c->n - 1] = end;
        return;
    }
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 256;
        uint64_t *r = realloc(c->ranges, (size_t)cap * 2 * sizeof(uint64_t));
        if (!r) { c->err = HK_E_NOMEM; return; }
        c->ranges = r;
        uint8_t *f = realloc(c->interior, (size_t)cap);
        if (!f) { c->err = HK_E_NOMEM; return; }
        c->interior = f;
        c->cap = cap;
    }
    c->ranges[2 * c->n] = start;
    c->ranges[2 * c->n + 1] = end;
    c->interior[c->n] = interior;
    c->n++;
}

/* Visit the cell (cx, cy) of `level` whose curve prefix is `prefix`; `parent`
 * holds the indices of the edges touching the parent cell. */
static void visit(ctx_t *c, int level, uint64_t cx, uint64_t cy, int state, uint64_t prefix,
                  const int32_t *parent, int64_t n_parent)
{
    if (c->err)
        return;
    if (++c->nodes > c->max_nodes) {
        c->err = HK_E_BUDGET;
        return;
    }
    const int shift = c->bits - level;
    const double size = ldexp(1.0, shift);
    const double x0 = (double)cx * size, y0 = (double)cy * size;

    if (c->level_cap[level] < n_parent) {
        int32_t *b = realloc(c->level_buf[level], (size_t)n_parent * sizeof(int32_t));
        if (!b) { c->err = HK_E_NOMEM; return; }
        c->level_buf[level] = b;
        c->level_cap[level] = n_parent;
    }
    int32_t *mine = c->level_buf[level];
    int64_t n_mine = 0;
    const double gx0 = x0 - EPS, gy0 = y0 - EPS, gx1 = x0 + size + EPS, gy1 = y0 + size + EPS;
    for (int64_t k = 0; k < n_parent; k++) {
        int32_t i = parent[k];
        if (edge_touches(&c->edges[i], gx0, gy0, gx1, gy1))
            mine[n_mine++] = i;
    }

    const uint64_t start = prefix << (2 * shift);
    const uint64_t end = ((prefix + 1) << (2 * shift)) - 1;
    if (n_mine == 0) {
        if (point_inside(c, x0 + 0.5 * size, y0 + 0.5 * size))
            emit(c, start, end, 1);
        return;
    }
    if (level == c->max_level) {
        c->boundary_cells++;
        emit(c, start, end, 0);
        return;
    }
    for (int k = 0; k < 4; k++) {
        int q = QUAD[state][k];
        visit(c, level + 1, 2 * cx + (uint64_t)(q >> 1), 2 * cy + (uint64_t)(q & 1),
              NEXT[state][k], 4 * prefix + (uint64_t)k, mine, n_mine);
        if (c->err)
            return;
    }
}

static int build_bands(ctx_t *c)
{
    if (c->n_edges == 0) {
        c->n_bands = 0;
        return HK_OK;
    }
    double lo = c->edges[0].miny, hi = c->edges[0].maxy;
    for (int64_t i = 1; i < c->n_edges; i++) {
        if (c->edges[i].miny < lo) lo = c->edges[i].miny;
        if (c->edges[i].maxy > hi) hi = c->edges[i].maxy;
    }
    int64_t nb = c->n_edges < 4096 ? c->n_edges : 4096;
    if (nb < 1) nb = 1;
    c->n_bands = nb;
    c->band_y0 = lo;
    c->band_inv_h = hi > lo ? (double)nb / (hi - lo) : 0.0;
    c->band_start = calloc((size_t)nb + 1, sizeof(int64_t));
    if (!c->band_start)
        return HK_E_NOMEM;
    for (int64_t i = 0; i < c->n_edges; i++) {
        int64_t b0 = band_of(c, c->edges[i].miny), b1 = band_of(c, c->edges[i].maxy);
        for (int64_t b = b0; b <= b1; b++)
            c->band_start[b + 1]++;
    }
    for (int64_t b = 0; b < nb; b++)
        c->band_start[b + 1] += c->band_start[b];
    c->band_edges = malloc((size_t)(c->band_start[nb] ? c->band_start[nb] : 1) * sizeof(int32_t));
    int64_t *fill = malloc((size_t)nb * sizeof(int64_t));
    if (!c->band_edges || !fill) {
        free(fill);
        return HK_E_NOMEM;
    }
    memcpy(fill, c->band_start, (size_t)nb * sizeof(int64_t));
    for (int64_t i = 0; i < c->n_edges; i++) {
        int64_t b0 = band_of(c, c->edges[i].miny), b1 = band_of(c, c->edges[i].maxy);
        for (int64_t b = b0; b <= b1; b++)
            c->band_edges[fill[b]++] = (int32_t)i;
    }
    free(fill);
    return HK_OK;
}

int hk_cover(const double *lon, const double *lat, const int64_t *ring_ends, int64_t n_rings,
             int bits, int max_level, int64_t max_nodes, hk_covering *out)
{
    memset(out, 0, sizeof(*out));
    if (bits < HK_MIN_BITS || bits > HK_MAX_BITS || max_level < 0 || max_level > bits)
        return HK_E_BITS;
    if (n_rings < 1)
        return HK_E_RINGS;
    int64_t n_vertices = ring_ends[n_rings - 1];
    if (n_vertices < 0 || n_vertices > INT32_MAX)
        return HK_E_RINGS;

    int rc = HK_OK;
    ctx_t c;
    memset(&c, 0, sizeof(c));
    double *u = malloc((size_t)(n_vertices ? n_vertices : 1) * sizeof(double));
    double *v = malloc((size_t)(n_vertices ? n_vertices : 1) * sizeof(double));
    edge_t *edges = malloc((size_t)(n_vertices ? n_vertices : 1) * sizeof(edge_t));
    int32_t *all = malloc((size_t)(n_vertices ? n_vertices : 1) * sizeof(int32_t));
    c.level_buf = calloc((size_t)max_level + 1, sizeof(int32_t *));
    c.level_cap = calloc((size_t)max_level + 1, sizeof(int64_t));
    if (!u || !v || !edges || !all || !c.level_buf || !c.level_cap) {
        rc = HK_E_NOMEM;
        goto done;
    }
    if (hk_lonlat_to_unit(lon, lat, u, v, (size_t)n_vertices, bits) != -1) {
        rc = HK_E_COORD;
        goto done;
    }
    int64_t ne = 0, first = 0;
    for (int64_t r = 0; r < n_rings; r++) {
        int64_t last = ring_ends[r];
        if (last < first || last > n_vertices) {
            rc = HK_E_RINGS;
            goto done;
        }
        for (int64_t i = first; i < last; i++) {
            int64_t j = (i + 1 < last) ? i + 1 : first; /* closes the ring */
            if (u[i] == u[j] && v[i] == v[j])
                continue;
            edge_t *e = &edges[ne++];
            e->x0 = u[i]; e->y0 = v[i]; e->x1 = u[j]; e->y1 = v[j];
            e->minx = fmin(e->x0, e->x1); e->maxx = fmax(e->x0, e->x1);
            e->miny = fmin(e->y0, e->y1); e->maxy = fmax(e->y0, e->y1);
        }
        first = last;
    }
    c.edges = edges;
    c.n_edges = ne;
    c.bits = bits;
    c.max_level = max_level;
    c.max_nodes = max_nodes > 0 ? max_nodes : INT64_MAX;
    rc = build_bands(&c);
    if (rc != HK_OK)
        goto done;
    for (int64_t i = 0; i < ne; i++)
        all[i] = (int32_t)i;
    visit(&c, 0, 0, 0, 0, 0, all, ne);
    rc = c.err;
    if (rc == HK_OK) {
        out->ranges = c.ranges;
        out->interior = c.interior;
        out->n = c.n;
        c.ranges = NULL;
        c.interior = NULL;
    }
    out->nodes = c.nodes;
    out->boundary_cells = c.boundary_cells;
    out->max_level = max_level;
done:
    free(c.ranges);
    free(c.interior);
    free(c.band_start);
    free(c.band_edges);
    if (c.level_buf)
        for (int l = 0; l <= max_level; l++)
            free(c.level_buf[l]);
    free(c.level_buf);
    free(c.level_cap);
    free(u);
    free(v);
    free(edges);
    free(all);
    return rc;
}

void hk_covering_free(hk_covering *c)
{
    free(c->ranges);
    free(c->interior);
    c->ranges = NULL;
    c->interior = NULL;
    c->n = 0;
}

/* Many polygons in one call: the batch path of the nightly rebuild, which would otherwise
 * pay a foreign call, four buffers and a copy per fence. Polygon p owns rings
 * [poly_rings[p], poly_rings[p + 1]) of ring_ends, whose entries count vertices from the
 * start of lon/lat; it is covered at bits[p] (max_level = bits[p]) and its ranges are
 * expressed at out_bits, appended to `out` in polygon order. counts[p], status[p] (HK_OK
 * or the error of hk_cover for that polygon alone: it then has no ranges) and nodes[p] are
 * per polygon. Returns HK_OK, or HK_E_BITS / HK_E_NOMEM for the whole call. */
int hk_cover_many(const double *lon, const double *lat, const int64_t *ring_ends,
                  const int64_t *poly_rings, int64_t n_polys, const int32_t *bits, int out_bits,
                  int64_t max_nodes, hk_covering *out, int64_t *counts, int32_t *status,
                  int64_t *nodes)
{
    memset(out, 0, sizeof(*out));
    if (out_bits < HK_MIN_BITS || out_bits > HK_MAX_BITS || n_polys < 0)
        return HK_E_BITS;
    uint64_t *ranges = NULL;
    uint8_t *interior = NULL;
    int64_t *rel = NULL;
    int64_t n = 0, cap = 0, rel_cap = 0;
    for (int64_t p = 0; p < n_polys; p++) {
        counts[p] = 0;
        nodes[p] = 0;
        int64_t r0 = poly_rings[p], r1 = poly_rings[p + 1];
        if (r0 < 0 || r1 <= r0) {
            status[p] = HK_E_RINGS;
            continue;
        }
        if (bits[p] < HK_MIN_BITS || bits[p] > out_bits) {
            status[p] = HK_E_BITS;
            continue;
        }
        int64_t v0 = r0 > 0 ? ring_ends[r0 - 1] : 0;
        if (r1 - r0 > rel_cap) {
            int64_t *grown = realloc(rel, (size_t)(r1 - r0) * sizeof(int64_t));
            if (!grown)
                goto nomem;
            rel = grown;
            rel_cap = r1 - r0;
        }
        for (int64_t r = r0; r < r1; r++)
            rel[r - r0] = ring_ends[r] - v0;
        hk_covering one;
        int rc = hk_cover(lon + v0, lat + v0, rel, r1 - r0, bits[p], bits[p], max_nodes, &one);
        status[p] = rc;
        nodes[p] = one.nodes;
        if (rc == HK_E_NOMEM)
            goto nomem;
        if (rc != HK_OK)
            continue;
        if (n + one.n > cap) {
            int64_t want = cap ? cap : 4096;
            while (want < n + one.n)
                want *= 2;
            uint64_t *r2 = realloc(ranges, (size_t)want * 2 * sizeof(uint64_t));
            if (r2)
                ranges = r2;
            uint8_t *f2 = realloc(interior, (size_t)want);
            if (f2)
                interior = f2;
            if (!r2 || !f2) {
                hk_covering_free(&one);
                goto nomem;
            }
            cap = want;
        }
        int shift = 2 * (out_bits - bits[p]);
        for (int64_t i = 0; i < one.n; i++) {
            ranges[2 * (n + i)] = one.ranges[2 * i] << shift;
            ranges[2 * (n + i) + 1] = ((one.ranges[2 * i + 1] + 1) << shift) - 1;
        }
        memcpy(interior + n, one.interior, (size_t)one.n);
        counts[p] = one.n;
        n += one.n;
        hk_covering_free(&one);
    }
    free(rel);
    out->ranges = ranges;
    out->interior = interior;
    out->n = n;
    out->max_level = out_bits;
    return HK_OK;
nomem:
    free(rel);
    free(ranges);
    free(interior);
    return HK_E_NOMEM;
}
