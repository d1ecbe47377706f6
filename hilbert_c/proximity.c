/* The roaming matcher's inner loop (fence/x_fence/roaming.py `_pairs`): for each mover of a
 * segment, the held positions in its box, each pair's state before and after the mover's row
 * under every subscription on either side, and the changes this worker reports.
 *
 * The positions are sorted by their grid cell (x * side + y at the matcher's index level); a
 * mover's box is the cells around its old and new positions (x wrapping around the
 * antimeridian). Each cell is found by a binary search. Distances are haversine in double, as
 * the reference computes them; a pair within a micrometre of a radius is handed back as unsure
 * and decided by the caller with numpy's haversine, so a last-bit difference between libm and
 * numpy never decides an event.
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

/* See hilbert.h. One mover after the other, each against the entries valid at its row. */
int64_t hk_roam_pairs(const hk_roam_segment *g, int64_t *o_k, int64_t *o_j, int64_t *o_i, uint8_t *o_flags,
                      double *o_d, int64_t cap)
{
    const int64_t n = g->n_slots, m = g->n_movers, side = g->side;
    int64_t cnt = 0;
    for (int64_t k = 0; k < m; k++) {
        const int64_t o = g->m_slot[k];
        const int had = g->m_had_old[k];
        const double po = g->m_olat[k] * DEG, lo = g->m_olon[k] * DEG, co = cos(po);
        const double pn = g->m_nlat[k] * DEG, ln = g->m_nlon[k] * DEG, cn = cos(pn);
        const double lim = g->r_max * (1.0 + 1e-9) + 1e-6;
        for (int64_t x = g->q_x0[k]; x <= g->q_x1[k]; x++) {
            int64_t xm = ((x % side) + side) % side;
            for (int64_t y = g->q_y0[k]; y <= g->q_y1[k]; y++) {
                int64_t cell = xm * side + y;
                for (int64_t i = lower_bound(g->e_cell, g->n_entries, cell);
                     i < g->n_entries && g->e_cell[i] == cell; i++) {
                    const int64_t xs = g->e_slot[i], kx = g->e_row[i];
                    if (xs == o)
                        continue;
                    /* the other object's position as of row k: its row's new one if that row
                     * came first, its old one if it comes later, else the one held */
                    if (kx >= 0 && (g->e_ver[i] ? kx > k : kx < k))
                        continue;
                    const double d_now = haversine_m(pn, ln, cn, g->e_lat[i], g->e_lon[i]);
                    const double d_was = had ? haversine_m(po, lo, co, g->e_lat[i], g->e_lon[i]) : INFINITY;
                    if (d_now > lim && d_was > lim)
                        continue;
                    for (int side_a = 1; side_a >= 0; side_a--) {
                        const int64_t owner = side_a ? o : xs;
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
                            if (cnt < cap) {
                                o_k[cnt] = k;
                                o_j[cnt] = j;
                                o_i[cnt] = i;
                                o_flags[cnt] = (uint8_t)(side_a | (now << 1) | (unsure << 2) | (p_was << 3)
                                                         | (p_now << 4));
                                o_d[cnt] = d_now;
                            }
                            cnt++;
                        }
                    }
                }
            }
        }
    }
    return cnt;
}
