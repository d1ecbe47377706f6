/* Sorted lookups for x-geo's range index: which needles equal a key.
 *
 * numpy's searchsorted restarts a full binary search for every needle; the index asks
 * with needles sorted (a batch's Hilbert indices at one level), so each search here
 * gallops forward from the previous answer: O(log gap) steps over memory that is read
 * in increasing order. Needles out of order are still answered (the search restarts).
 */
#include "hilbert.h"

int64_t hk_match_sorted(const uint64_t *keys, size_t n_keys, const uint64_t *needles, size_t n,
                        int64_t *hit, int64_t *at)
{
    size_t lo = 0;
    int64_t m = 0;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t q = needles[i];
        if (q < prev)
            lo = 0;
        prev = q;
        /* every key before lo is < q; gallop to a hi with keys[hi] >= q (or the end) */
        size_t hi = lo, step = 1;
        while (hi < n_keys && keys[hi] < q) {
            lo = hi + 1;
            hi += step;
            step <<= 1;
        }
        if (hi > n_keys)
            hi = n_keys;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (keys[mid] < q)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < n_keys && keys[lo] == q) {
            hit[m] = (int64_t)i;
            at[m] = (int64_t)lo;
            m++;
        }
    }
    return m;
}
