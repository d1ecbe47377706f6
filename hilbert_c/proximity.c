/* The roaming matcher's inner loop (fence/x_fence/roaming.py `_pairs`): for each mover of a
 * batch, the positions valid at its row in its boxes, each pair's state before and after the
 * mover's row under every subscription on either side, and the changes this worker reports.
 *
 * A mover is two places, not the area between them: its boxes are around its old and its new
 * position, each searched on its own (the second skips what the first saw). A box is read
 * through whichever of two sorted orders of the entries needs fewer searches: by column
 * (x * side + y: one range per column) or by row (y * side + x: one range per row, two where
 * it wraps around the antimeridian), so a box that spans every longitude near a pole costs a
 * few rows, not a search per cell. The mover's own subscriptions look at every entry within
 * its own largest radius; the others' subscriptions only at the entries of subscribers, within
 * the largest radius of any: a crowd of plain objects costs a mover nothing unless it carries
 * a subscription itself.
 *
 * Distances are haversine in double, as the reference computes them; a pair within a
 * micrometre of a radius is handed back as unsure and decided by the caller with numpy's
 * haversine, so a last-bit difference between libm and numpy never decides an event.
 */
#include <math.h>

#include "hilbert.h"

#define EARTH_RADIUS_M 6371008.8
#define DEG 0.017453292519943295

static int64_t lower_bound(const int64_t *a, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static double haversine_m(double p0, double l0, double c0, double lat, double lon)
{
    double p1 = lat * DEG, s1 = sin((p1 - p0) / 2), s2 = sin((lon * DEG - l0) / 2);
    double a = s1 * s1 + c0 * cos(p1) * s2 * s2;
    if (a > 1.0)
        a = 1.0;
    return 2 * EARTH_RADIUS_M * asin(sqrt(a));
}

typedef struct {
    const hk_roam_segment *g;
    /* the mover */
    int64_t k, o;
    int had;
    double po, lo, co, pn, ln, cn;
    /* the search */
    int side_a;     /* 1: the mover's subscriptions against the entry; 0: the entry's against the mover */
    double lim;     /* entries farther than this from both of the mover's places are no pair */
    const int64_t *skip; /* a box already searched (NULL: none) */
    /* the output */
    int64_t *o_k, *o_j, *o_i;
    uint8_t *o_flags;
    double *o_d;
    int64_t cap, cnt, searches, looked;
} ctx_t;

static int in_box(const int64_t *b, int64_t side, int64_t x, int64_t y)
{
    if (b[0] > b[1] || y < b[2] || y > b[3])
        return 0;
    return ((x - b[0]) % side + side) % side <= b[1] - b[0];
}

static void pair(ctx_t *c, int64_t i)
{
    const hk_roam_segment *g = c->g;
    const int64_t n = g->n_slots, m = g->n_movers, k = c->k;
    const int64_t xs = g->e_slot[i], kx = g->e_row[i];
    c->looked++;
    if (xs == c->o || !(g->e_from[i] < k && k < g->e_to[i]))
        return; /* itself, or not where the other object is as of row k */
    if (c->skip && in_box(c->skip, g->side, g->e_cell[i] / g->side, g->e_cell[i] % g->side))
        return; /* seen in the other box */
    const double d_now = haversine_m(c->pn, c->ln, c->cn, g->e_lat[i], g->e_lon[i]);
    const double d_was = c->had ? haversine_m(c->po, c->lo, c->co, g->e_lat[i], g->e_lon[i]) : INFINITY;
    if (d_now > c->lim && d_was > c->lim)
        return;
    const int side_a = c->side_a;
    const int64_t owner = side_a ? c->o : xs;
    for (int64_t j = g->s_ptr[owner]; j < g->s_ptr[owner + 1]; j++) {
        const int64_t f = g->s_filter[j];
        const double r = g->s_radius[j];
        int p_was, p_now;
        if (side_a) { /* the other object is b: its flag as of row k */
            p_now = kx < 0 ? g->pass_held[f * n + xs]
                    : (g->e_ver[i] ? g->pass_new[f * m + kx] : g->pass_old[f * m + kx]);
            p_was = p_now;
        } else { /* the mover is b */
            p_was = g->pass_old[f * m + k];
            p_now = g->pass_new[f * m + k];
        }
        const int was = p_was && d_was <= r, now = p_now && d_now <= r;
        const int unsure = (p_was && fabs(d_was - r) <= 1e-6) || (p_now && fabs(d_now - r) <= 1e-6);
        if (was == now && !unsure)
            continue;
        if (!unsure) {
            int own = side_a ? g->e_own[i] : (now ? g->m_own_new[k] : g->m_own_old[k]);
            if (!own)
                continue;
        }
        if (c->cnt < c->cap) {
            c->o_k[c->cnt] = k;
            c->o_j[c->cnt] = j;
            c->o_i[c->cnt] = i;
            c->o_flags[c->cnt] = (uint8_t)(side_a | (now << 1) | (unsure << 2) | (p_was << 3) | (p_now << 4));
            c->o_d[c->cnt] = d_now;
        }
        c->cnt++;
    }
}

/* The entries whose keys are in [lo, hi]. */
static void scan(ctx_t *c, const int64_t *key, const int64_t *ent, int64_t n, int64_t lo, int64_t hi)
{
    c->searches++;
    for (int64_t at = lower_bound(key, n, lo); at < n && key[at] <= hi; at++)
        pair(c, ent[at]);
}

/* Every entry of the index in `box`, by columns or by rows, whichever takes fewer searches. */
static void search(ctx_t *c, const int64_t *box, const int64_t *xkey, const int64_t *xent,
                   const int64_t *ykey, const int64_t *yent, int64_t n)
{
    const int64_t side = c->g->side;
    if (box[0] > box[1] || n == 0)
        return;
    const int64_t nx = box[1] - box[0] + 1, ny = box[3] - box[2] + 1;
    if (nx <= ny) {
        for (int64_t x = box[0]; x <= box[1]; x++) {
            const int64_t xm = ((x % side) + side) % side;
            scan(c, xkey, xent, n, xm * side + box[2], xm * side + box[3]);
        }
        return;
    }
    const int64_t x0 = ((box[0] % side) + side) % side, x1 = x0 + nx - 1;
    for (int64_t y = box[2]; y <= box[3]; y++) {
        if (x1 < side) {
            scan(c, ykey, yent, n, y * side + x0, y * side + x1);
        } else { /* across the antimeridian: two ranges */
            scan(c, ykey, yent, n, y * side + x0, y * side + side - 1);
            scan(c, ykey, yent, n, y * side, y * side + (x1 - side));
        }
    }
}

/* See hilbert.h. One mover after the other, each against the entries valid at its row. */
int64_t hk_roam_pairs(const hk_roam_segment *g, int64_t *o_k, int64_t *o_j, int64_t *o_i, uint8_t *o_flags,
                      double *o_d, int64_t cap, int64_t *work)
{
    ctx_t c = {0};
    c.g = g;
    c.o_k = o_k;
    c.o_j = o_j;
    c.o_i = o_i;
    c.o_flags = o_flags;
    c.o_d = o_d;
    c.cap = cap;
    for (int64_t k = 0; k < g->n_movers; k++) {
        const int64_t *q = g->q + 16 * k;
        c.k = k;
        c.o = g->m_slot[k];
        c.had = g->m_had_old[k];
        c.po = g->m_olat[k] * DEG;
        c.lo = g->m_olon[k] * DEG;
        c.co = cos(c.po);
        c.pn = g->m_nlat[k] * DEG;
        c.ln = g->m_nlon[k] * DEG;
        c.cn = cos(c.pn);
        /* the mover's subscriptions, against every entry near its new or old place */
        c.side_a = 1;
        c.lim = g->m_rmax[k] * (1.0 + 1e-9) + 1e-6;
        c.skip = NULL;
        search(&c, q, g->ax_key, g->ax_ent, g->ay_key, g->ay_ent, g->n_a);
        c.skip = q;
        search(&c, q + 4, g->ax_key, g->ax_ent, g->ay_key, g->ay_ent, g->n_a);
        /* the subscribers near either place, against the mover */
        c.side_a = 0;
        c.lim = g->r_max * (1.0 + 1e-9) + 1e-6;
        c.skip = NULL;
        search(&c, q + 8, g->sx_key, g->sx_ent, g->sy_key, g->sy_ent, g->n_s);
        c.skip = q + 8;
        search(&c, q + 12, g->sx_key, g->sx_ent, g->sy_key, g->sy_ent, g->n_s);
    }
    work[0] = c.searches;
    work[1] = c.looked;
    return c.cnt;
}
