/* Exact point-in-polygon for x-fence's post-filter, deferring only what it cannot decide.
 *
 * x-fence's exact test is shapely's `contains_xy` (GEOS: strictly inside, a point on
 * the boundary is out). GEOS locates a point by counting the crossings of a rightward
 * ray with every edge (RayCrossingCounter), each crossing decided by the sign of an
 * orientation determinant: computed in double when a floating-point filter proves the
 * sign, else in double-double arithmetic. This file counts the same crossings with the
 * same determinant and the same filter, and where the filter cannot prove the sign, or
 * the point may lie on the boundary (an exact coordinate tie), it answers HK_PIP_UNSURE
 * instead of computing further: the caller asks GEOS for those points. Every answer
 * given is therefore GEOS's answer; the unsure ones are points within ~1e-15 relative
 * of an edge, or on a vertex's exact y, which random positions essentially never are.
 */
#include <math.h>
#include "hilbert.h"

/* GEOS's DP_SAFE_EPSILON (CGAlgorithmsDD::orientationIndexFilter). */
#define SAFE_EPSILON 1e-15

/* Sign of the orientation of (a, b, c), or 2 when the double filter cannot prove it;
 * the determinant is spelt as GEOS spells it, so it rounds the same way. */
static int orientation_filter(double ax, double ay, double bx, double by, double cx, double cy)
{
    double detleft = (ax - cx) * (by - cy);
    double detright = (ay - cy) * (bx - cx);
    double det = detleft - detright;
    double detsum;
    if (detleft > 0.0) {
        if (detright <= 0.0)
            return (det > 0.0) - (det < 0.0);
        detsum = detleft + detright;
    } else if (detleft < 0.0) {
        if (detright >= 0.0)
            return (det > 0.0) - (det < 0.0);
        detsum = -detleft - detright;
    } else {
        return (det > 0.0) - (det < 0.0);
    }
    double errbound = SAFE_EPSILON * detsum;
    if (det >= errbound || -det >= errbound)
        return (det > 0.0) - (det < 0.0);
    return 2;
}

static uint8_t locate(const double *ax, const double *ay, const double *bx, const double *by,
                      int64_t lo, int64_t hi, double x, double y)
{
    if (lo < 0 || !isfinite(x) || !isfinite(y))
        return HK_PIP_UNSURE;
    int crossings = 0;
    for (int64_t e = lo; e < hi; e++) {
        double y1 = ay[e], y2 = by[e];
        if ((y1 > y) == (y2 > y)) {
            /* not spanning the ray's line (most edges): touched only if the point
             * shares an endpoint's y and lies within the edge's x extent */
            if ((y == y1 || y == y2) && x >= fmin(ax[e], bx[e]) && x <= fmax(ax[e], bx[e]))
                return HK_PIP_UNSURE;
            continue;
        }
        double x1 = ax[e], x2 = bx[e];
        if (x1 < x && x2 < x)
            continue; /* wholly left of the point: not crossed */
        int sign = orientation_filter(x1, y1, x2, y2, x, y);
        if (sign == 2 || sign == 0)
            return HK_PIP_UNSURE; /* unproven, or on the edge's line: GEOS decides */
        if (y2 < y1)
            sign = -sign; /* a downward edge is crossed when the point is on its right */
        if (sign > 0)
            crossings++;
    }
    return (uint8_t)(crossings & 1);
}

void hk_points_in_polygons(const double *ax, const double *ay, const double *bx, const double *by,
                           const int64_t *edge_lo, const int64_t *edge_hi,
                           const double *px, const double *py, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = locate(ax, ay, bx, by, edge_lo[i], edge_hi[i], px[i], py[i]);
}
