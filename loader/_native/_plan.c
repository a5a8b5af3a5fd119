/* babelfeed's optional planning kernel: the integer loops of planning a window, compiled.
 *
 * Nine functions (length_order, batch_ends, take_lengths, pair_sizes and take_rows in _plan_rows.c, sorted_rows in
 * _plan_order.c, deferred_cut in _plan_copies.c), each the same integers as its numpy path (plan_kernel.py
 * says which):
 *   stratified(pos, which, table, okeys, ekeys, out)  rows of stratified draws (mixing.StratifiedDraw.rows,
 *                                                     mixing.stratified_rows; permute.permute is the case
 *                                                     n = count = full): 4-round Feistel networks with
 *                                                     cycle-walking, evaluated in blocks that stay in L1
 *   stratified_spans(spans, table, okeys, ekeys, out) the same over runs of consecutive positions (a window's
 *                                                     slice of each direction), no position array
 *   length_order(src, tgt, rkey, out)                 batching.length_order's three stable 16-bit sorts as
 *                                                     one counting pass by (cost, src) and bucket sorts in
 *                                                     cache (or LSD passes over the four fields packed into
 *                                                     64 bits), reading int32 lengths in place
 *   batch_ends(cost, other, max_tokens, cap, mult, out) batching.batch_sorted's greedy token-budget cut
 *   take_lengths(src, tgt, rows, plens, pairs)        sources.Component.lengths, both sides in one prefetched
 *                                                     pass
 *   pair_sizes(src, tgt, out)                         sources.RowCache.copy_pair: both sides' sizes as
 *                                                     interleaved uint16 in one pass
 *   take_rows(src, idx, out)                          np.take(src, idx, axis=0), prefetched
 *   sorted_rows(lens, has_t, keep, rkey, rows, ...,   length_order, then the window's rows taken in that order,
 *               threads)                              rebuilt from the sort key, the spans and the row numbers;
 *                                                     its scatter and per-cost sorts shared among threads
 *   deferred_cut(row, cost, src, tgt, lims, ...,      copies.deferred_cut: batches in which no row is twice
 *                order, ends)                         (copies wait for the next batch that holds them)
 *
 * Arrays come through the buffer protocol (int64 unless said otherwise); outputs are written into arrays the
 * caller allocated. The loops run without the GIL, so plan_kernel.split runs the per-element passes
 * (stratified_spans, take_lengths) over parts of a big window in threads; every result is the same whatever
 * the number of threads. Built by setup.py as an optional extension; when it is
 * missing, or BABELFEED_KERNEL=0, the numpy paths give the same plans.
 */
#include "_plan.h"

#define BLOCK 2048

/* ------------------------------------------------------------------------------------------- Feistel */
typedef struct {
    uint64_t n, mask64;
    uint32_t mask32;
    int half, narrow, trivial;
    uint64_t k64[4];
    uint32_t k32[4];
} perm_t;

static inline uint32_t mix32(uint32_t x) { /* murmur3 finaliser (permute._mix32) */
    x ^= x >> 16;
    x *= 0x85EBCA6BU;
    x ^= x >> 13;
    x *= 0xC2B2AE35U;
    return x ^ (x >> 16);
}

static inline uint64_t mix64(uint64_t x) { /* splitmix64 finaliser (permute._mix) */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}


static void perm_init(perm_t *p, int64_t n, const uint64_t *key) {
    int bits = bit_length(n > 1 ? (uint64_t)(n - 1) : 0);
    if (bits < 2)
        bits = 2;
    bits += bits % 2;
    p->n = n > 0 ? (uint64_t)n : 0;
    p->trivial = n <= 1;
    p->half = bits / 2;
    p->narrow = bits <= 32;
    p->mask64 = (1ULL << p->half) - 1;
    p->mask32 = (uint32_t)p->mask64;
    for (int r = 0; r < 4; r++) {
        p->k64[r] = key[r];
        p->k32[r] = (uint32_t)key[r];
    }
}

static inline uint32_t feistel32(uint32_t x, int half, uint32_t mask, const uint32_t *k) {
    uint32_t l = x >> half, r = x & mask;
    for (int i = 0; i < 4; i++) {
        uint32_t t = r;
        r = l ^ (mix32(r ^ k[i]) & mask);
        l = t;
    }
    return (l << half) | r;
}

static inline uint64_t feistel64(uint64_t x, int half, uint64_t mask, const uint64_t *k) {
    uint64_t l = x >> half, r = x & mask;
    for (int i = 0; i < 4; i++) {
        uint64_t t = r;
        r = l ^ (mix64(r ^ k[i]) & mask);
        l = t;
    }
    return (l << half) | r;
}

/* Where the compiler can, the block loop is built twice, with AVX2 (8 lanes of 32-bit multiplies) and without,
 * and the loader picks the one the CPU runs. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define WIDE_SIMD __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef WIDE_SIMD
#define WIDE_SIMD
#endif

/* out[i] = pi(x[i]) for m <= BLOCK values in [0, n): one vectorisable pass, then the values that left the domain
 * walk again, compacted, until every one is inside (permute.permute's cycle-walk, element by element). */
WIDE_SIMD static void perm_block(const perm_t *p, const uint64_t *x, uint64_t *out, int64_t m) {
    if (p->trivial) {
        memset(out, 0, (size_t)m * sizeof(uint64_t));
        return;
    }
    uint64_t vals[BLOCK];
    int32_t at[BLOCK];
    int64_t nb = 0;
    const uint64_t n = p->n;
    if (p->narrow) {
        uint32_t v[BLOCK], w[BLOCK];
        const int half = p->half;
        const uint32_t mask = p->mask32, k0 = p->k32[0], k1 = p->k32[1], k2 = p->k32[2], k3 = p->k32[3];
        const uint32_t keys[4] = {k0, k1, k2, k3};
        for (int64_t i = 0; i < m; i++)
            v[i] = feistel32((uint32_t)x[i], half, mask, keys);
        for (int64_t i = 0; i < m; i++) {
            out[i] = v[i];
            w[nb] = v[i];
            at[nb] = (int32_t)i;
            nb += v[i] >= n;
        }
        while (nb) {
            for (int64_t j = 0; j < nb; j++)
                w[j] = feistel32(w[j], half, mask, keys);
            int64_t k = 0;
            for (int64_t j = 0; j < nb; j++) {
                out[at[j]] = w[j];
                w[k] = w[j];
                at[k] = at[j];
                k += w[j] >= n;
            }
            nb = k;
        }
    } else {
        for (int64_t i = 0; i < m; i++) {
            out[i] = feistel64(x[i], p->half, p->mask64, p->k64);
            if (out[i] >= n) {
                vals[nb] = out[i];
                at[nb++] = (int32_t)i;
            }
        }
        while (nb) {
            int64_t k = 0;
            for (int64_t j = 0; j < nb; j++) {
                uint64_t w = feistel64(vals[j], p->half, p->mask64, p->k64);
                if (w >= n) {
                    vals[k] = w;
                    at[k++] = at[j];
                } else {
                    out[at[j]] = w;
                }
            }
            nb = k;
        }
    }
}

/* Rows of m <= BLOCK positions x of corpus c (permutations po, pe; tb = its (n, count, full)): slot = pi_order(x);
 * row = slot % n below full, else pi_extra(slot - full). */
/* Each corpus's two permutations (its order over the draws, its extra rows), from the table and key arrays;
   -1 with ValueError (an inconsistent table: a draw could never land in [0, n)) or MemoryError set (the caller
   frees whatever was allocated). */
static int perm_tables(int64_t k, const int64_t *tb, const void *okeys, const void *ekeys, perm_t **po, perm_t **pe) {
    for (int64_t c = 0; c < k; c++) { /* (n, count, full): rows to draw from, draws, draws covering every row */
        if (tb[3 * c] < 0 || tb[3 * c + 1] < 0 || tb[3 * c + 2] < 0 || tb[3 * c + 2] > tb[3 * c + 1] ||
            (tb[3 * c + 1] > 0 && tb[3 * c] < 1) || tb[3 * c + 1] - tb[3 * c + 2] > tb[3 * c]) {
            PyErr_SetString(PyExc_ValueError, "stratified: a corpus's (n, count, full) is inconsistent");
            return -1;
        }
    }
    *po = malloc((size_t)k * sizeof(perm_t));
    *pe = malloc((size_t)k * sizeof(perm_t));
    if (!*po || !*pe) {
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t c = 0; c < k; c++) {
        perm_init(&(*po)[c], tb[3 * c + 1], (const uint64_t *)okeys + 4 * c);
        perm_init(&(*pe)[c], tb[3 * c], (const uint64_t *)ekeys + 4 * c);
    }
    return 0;
}

static void draw_block(const perm_t *po, const perm_t *pe, const int64_t *tb, const uint64_t *x, int64_t m,
                       uint64_t *o) {
    uint64_t slot[BLOCK], extra[BLOCK], walked[BLOCK];
    int32_t at[BLOCK];
    const uint64_t cn = (uint64_t)tb[0], full = (uint64_t)tb[2];
    perm_block(po, x, slot, m);
    int64_t ne = 0;
    for (int64_t j = 0; j < m; j++) {
        uint64_t s = slot[j];
        if (s < full) {
            o[j] = s < cn ? s : s % cn;
        } else {
            extra[ne] = s - full;
            at[ne++] = (int32_t)j;
        }
    }
    if (ne) {
        perm_block(pe, extra, walked, ne);
        for (int64_t j = 0; j < ne; j++)
            o[at[j]] = walked[j];
    }
}

/* stratified(pos, which, table, okeys, ekeys, out)
 *
 * Per position i of corpus c = which[i] (or 0 when which is None), with table[c] = (n, count, full) and round keys
 * okeys[c], ekeys[c] (uint64 [k, 4]): slot = pi_order(pos[i]) over [0, count); row = slot % n when slot < full,
 * else pi_extra(slot - full) over [0, n). Returns None; ValueError for a position outside [0, count) (count > 1)
 * or a corpus outside the table. */
static PyObject *stratified(PyObject *self, PyObject *args) {
    Py_buffer pos, tab, okeys, ekeys, out, which = {0};
    PyObject *which_obj;
    if (!PyArg_ParseTuple(args, "y*Oy*y*y*w*", &pos, &which_obj, &tab, &okeys, &ekeys, &out))
        return NULL;
    PyObject *result = NULL;
    perm_t *po = NULL, *pe = NULL;
    if (which_obj != Py_None && PyObject_GetBuffer(which_obj, &which, PyBUF_SIMPLE) < 0)
        goto done;
    int64_t n = pos.len / 8, k = tab.len / 24;
    if (out.len != pos.len || (which.obj && which.len != pos.len) || okeys.len != k * 32 || ekeys.len != k * 32 ||
        k < 1) {
        PyErr_SetString(PyExc_ValueError, "stratified: mismatched argument lengths");
        goto done;
    }
    const int64_t *ps = pos.buf, *wh = which.obj ? which.buf : NULL, *tb = tab.buf;
    for (int64_t i = 0; wh && i < n; i++) {
        if (wh[i] < 0 || wh[i] >= k) {
            PyErr_SetString(PyExc_ValueError, "stratified: corpus outside the table");
            goto done;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t c = wh ? wh[i] : 0, count = tb[3 * c + 1];
        if (ps[i] < 0 || (count > 1 && ps[i] >= count)) {
            PyErr_Format(PyExc_ValueError, "positions must lie in [0, %lld)", (long long)count);
            goto done;
        }
    }
    if (perm_tables(k, tb, okeys.buf, ekeys.buf, &po, &pe) < 0)
        goto done;
    uint64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    int64_t i = 0;
    while (i < n) {
        int64_t c = wh ? wh[i] : 0, m = 1;
        while (i + m < n && m < BLOCK && (!wh || wh[i + m] == c))
            m++;
        draw_block(&po[c], &pe[c], tb + 3 * c, (const uint64_t *)ps + i, m, o + i);
        i += m;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    free(po);
    free(pe);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&tab);
    PyBuffer_Release(&okeys);
    PyBuffer_Release(&ekeys);
    PyBuffer_Release(&out);
    release_if(&which);
    return result;
}

/* stratified_spans(spans, table, okeys, ekeys, out)
 *
 * stratified() over consecutive positions without a position array: spans [S, 3] of (corpus c, first position,
 * count) fill out one after another with the rows of positions first .. first + count - 1 of corpus c. The
 * same checks and errors. */
static PyObject *stratified_spans(PyObject *self, PyObject *args) {
    Py_buffer sp, tab, okeys, ekeys, out;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*", &sp, &tab, &okeys, &ekeys, &out))
        return NULL;
    PyObject *result = NULL;
    perm_t *po = NULL, *pe = NULL;
    const int64_t S = sp.len / 24, k = tab.len / 24, *s = sp.buf, *tb = tab.buf;
    int64_t n = 0;
    for (int64_t j = 0; j < S; j++)
        n += s[3 * j + 2];
    if (out.len != n * 8 || okeys.len != k * 32 || ekeys.len != k * 32 || k < 1) {
        PyErr_SetString(PyExc_ValueError, "stratified_spans: mismatched argument lengths");
        goto done;
    }
    for (int64_t j = 0; j < S; j++) {
        int64_t c = s[3 * j], lo = s[3 * j + 1], m = s[3 * j + 2];
        if (c < 0 || c >= k || m < 0) {
            PyErr_SetString(PyExc_ValueError, "stratified_spans: corpus outside the table");
            goto done;
        }
        if (m && (lo < 0 || (tb[3 * c + 1] > 1 && lo > tb[3 * c + 1] - m))) {
            PyErr_Format(PyExc_ValueError, "positions must lie in [0, %lld)", (long long)tb[3 * c + 1]);
            goto done;
        }
    }
    if (perm_tables(k, tb, okeys.buf, ekeys.buf, &po, &pe) < 0)
        goto done;
    uint64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    uint64_t x[BLOCK];
    for (int64_t j = 0; j < S; j++) {
        const int64_t c = s[3 * j], lo = s[3 * j + 1], m = s[3 * j + 2];
        for (int64_t a = 0; a < m; a += BLOCK) {
            const int64_t b = m - a < BLOCK ? m - a : BLOCK;
            for (int64_t t = 0; t < b; t++)
                x[t] = (uint64_t)(lo + a + t);
            draw_block(&po[c], &pe[c], tb + 3 * c, x, b, o + a);
        }
        o += m;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    free(po);
    free(pe);
    PyBuffer_Release(&sp);
    PyBuffer_Release(&tab);
    PyBuffer_Release(&okeys);
    PyBuffer_Release(&ekeys);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"take_rows", plan_take_rows, METH_VARARGS, "Rows of a 2-D array at indices, prefetched."},
    {"take_lengths", plan_take_lengths, METH_VARARGS, "Sample lengths of rows into the planner's int32 pairs."},
    {"pair_sizes", plan_pair_sizes, METH_VARARGS, "Both sides' sizes interleaved as uint16 pairs."},
    {"stratified", stratified, METH_VARARGS, "Rows of stratified draws (keyed Feistel permutations)."},
    {"stratified_spans", stratified_spans, METH_VARARGS, "Rows of stratified draws over runs of positions."},
    {"sorted_rows", plan_sorted_rows, METH_VARARGS, "A window's planner rows written in length order."},
    {"length_order", plan_length_order, METH_VARARGS, "Order by (max(src, tgt), src, random key, index)."},
    {"batch_ends", plan_batch_ends, METH_VARARGS, "Greedy token-budget batch ends over non-decreasing costs."},
    {"deferred_cut", plan_deferred_cut, METH_VARARGS, "Token-budget batches in which no row is twice."},
    {"stream_totals", plan_stream_totals, METH_VARARGS, "Samples and tokens per stream of planned samples."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_plan", "babelfeed's optional planning kernel.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__plan(void) { return PyModule_Create(&module); }
