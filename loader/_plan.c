/* babelfeed's optional planning kernel: the integer loops of planning a window, compiled.
 *
 * Five functions, each the same integers as its numpy path (plan_kernel.py says which):
 *   stratified(pos, which, table, okeys, ekeys, out)  rows of stratified draws (mixing.StratifiedDraw.rows,
 *                                                     mixing.stratified_rows; permute.permute is the case
 *                                                     n = count = full): 4-round Feistel networks with
 *                                                     cycle-walking, evaluated in blocks that stay in L1
 *   length_order(src, tgt, rkey, out)                 batching.length_order's three stable 16-bit sorts as
 *                                                     one counting pass by (cost, src) and bucket sorts in
 *                                                     cache (or LSD passes over the four fields packed into
 *                                                     64 bits), reading int32 lengths in place
 *   batch_ends(cost, max_tokens, cap, multiple, out)  batching.batch_sorted's greedy token-budget cut
 *   take_lengths(src, tgt, rows, plens, pairs)        sources.Component.lengths, both sides in one prefetched
 *                                                     pass
 *   take_rows(src, idx, out)                          np.take(src, idx, axis=0), prefetched
 *
 * Arrays come through the buffer protocol (int64 unless said otherwise); outputs are written into arrays the
 * caller allocated. The loops run without the GIL. Built by setup.py as an optional extension; when it is
 * missing, or BABELFEED_KERNEL=0, the numpy paths give the same plans.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static int bit_length(uint64_t x) {
    int b = 0;
    while (x) {
        b++;
        x >>= 1;
    }
    return b;
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
    po = malloc((size_t)k * sizeof(perm_t));
    pe = malloc((size_t)k * sizeof(perm_t));
    if (!po || !pe) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t c = 0; c < k; c++) {
        perm_init(&po[c], tb[3 * c + 1], (const uint64_t *)okeys.buf + 4 * c);
        perm_init(&pe[c], tb[3 * c], (const uint64_t *)ekeys.buf + 4 * c);
    }
    uint64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    uint64_t slot[BLOCK], extra[BLOCK], walked[BLOCK];
    int32_t at[BLOCK];
    int64_t i = 0;
    while (i < n) {
        int64_t c = wh ? wh[i] : 0, m = 1;
        while (i + m < n && m < BLOCK && (!wh || wh[i + m] == c))
            m++;
        const uint64_t cn = (uint64_t)tb[3 * c], full = (uint64_t)tb[3 * c + 2];
        perm_block(&po[c], (const uint64_t *)ps + i, slot, m);
        int64_t ne = 0;
        for (int64_t j = 0; j < m; j++) {
            uint64_t s = slot[j];
            if (s < full) {
                o[i + j] = s < cn ? s : s % cn;
            } else {
                extra[ne] = s - full;
                at[ne++] = (int32_t)j;
            }
        }
        if (ne) {
            perm_block(&pe[c], extra, walked, ne);
            for (int64_t j = 0; j < ne; j++)
                o[i + at[j]] = walked[j];
        }
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
    if (which.obj)
        PyBuffer_Release(&which);
    return result;
}

/* ------------------------------------------------------------------------------------------- order */
static int known_code(char code) { return code && strchr("HhiIql", code) != NULL; }

static char code_of(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return f[1] ? 0 : *f;
}

/* Sort n unique uint64 values ascending by their 16 bits at ``shift`` (the bits below are already in order):
 * insertion for a few, else two stable 8-bit counting passes through ``tmp``. */
static void sort_bucket(uint64_t *v, int64_t n, int shift, uint64_t *tmp) {
    if (n < 2)
        return;
    if (n <= 32) {
        for (int64_t i = 1; i < n; i++) {
            uint64_t x = v[i];
            int64_t j = i;
            for (; j > 0 && v[j - 1] > x; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
        return;
    }
    int64_t h[2][256];
    memset(h, 0, sizeof(h));
    for (int64_t i = 0; i < n; i++) {
        h[0][(v[i] >> shift) & 255]++;
        h[1][(v[i] >> (shift + 8)) & 255]++;
    }
    for (int p = 0; p < 2; p++) {
        int64_t sum = 0;
        for (int k = 0; k < 256; k++) {
            int64_t c = h[p][k];
            h[p][k] = sum;
            sum += c;
        }
    }
    for (int64_t i = 0; i < n; i++)
        tmp[h[0][(v[i] >> shift) & 255]++] = v[i];
    for (int64_t i = 0; i < n; i++)
        v[h[1][(tmp[i] >> (shift + 8)) & 255]++] = tmp[i];
}

/* length_order for lengths of at most LENGTH_BITS bits of (cost, src) together: one counting pass by (cost, src)
 * (stable: indices ascend within a bucket), then each bucket, small and in cache, sorted by (rkey, index). The
 * same order as the LSD passes below, with one pass over memory at random instead of three. -1: no memory. */
#define LENGTH_BITS 18
static int bucket_order(const uint32_t *sc, int has_t, const uint16_t *rk, int64_t n, int sb, int ib, int64_t *o) {
    int64_t nb = (int64_t)1 << LENGTH_BITS;
    int64_t *start = calloc((size_t)nb + 1, sizeof(int64_t));
    uint32_t *ck = malloc((size_t)n * sizeof(uint32_t));
    if (!start || !ck) {
        free(start);
        free(ck);
        return -1;
    }
    uint64_t *v = (uint64_t *)o, *tmp = NULL;
    int64_t big = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) {
        ck[i] = ((sc[i] >> 16) << sb) | (has_t ? (sc[i] & 0xFFFFU) : 0);
        start[ck[i] + 1]++;
    }
    for (int64_t k = 0; k < nb; k++) {
        big = start[k + 1] > big ? start[k + 1] : big;
        start[k + 1] += start[k];
    }
    for (int64_t i = 0; i < n; i++)
        v[start[ck[i]]++] = ((uint64_t)rk[i] << ib) | (uint64_t)i;
    Py_END_ALLOW_THREADS
    tmp = malloc((size_t)(big ? big : 1) * sizeof(uint64_t));
    if (!tmp) {
        free(start);
        free(ck);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    int64_t lo = 0; /* start[k] is now the end of bucket k */
    for (int64_t k = 0; k < nb; k++) {
        int64_t hi = start[k];
        sort_bucket(v + lo, hi - lo, ib, tmp);
        lo = hi;
    }
    const uint64_t imask = ib ? (~0ULL >> (64 - ib)) : 0;
    for (int64_t i = 0; i < n; i++)
        o[i] = (int64_t)(v[i] & imask);
    Py_END_ALLOW_THREADS
    free(start);
    free(ck);
    free(tmp);
    return 0;
}

/* length_order(src, tgt, rkey, out)
 *
 * The order of samples by (cost, src, rkey, index) ascending, cost = max(src, tgt) (src without tgt), each
 * length taken as uint16 as numpy's astype does, rkey uint16: batching.length_order's three stable sorts. The
 * four fields are packed into one uint64 and sorted by the bits above the index (the index is already in order
 * and LSD passes are stable), in passes of at most 12 bits. Returns True, or False where it cannot (a cost
 * above 65535, or more than 64 bits), leaving the numpy path to answer. */
typedef struct {
    const char *p;
    Py_ssize_t stride;
    int item;
} column_t;

/* a 1-D int32 or int64 array of any stride (the planner's int32 length columns, read in place) */
static int column_of(Py_buffer *b, column_t *c) {
    char code = code_of(b);
    if (b->ndim != 1 || !((code == 'i' && b->itemsize == 4) || ((code == 'q' || code == 'l') && b->itemsize == 8)))
        return 0;
    c->p = b->buf;
    c->stride = b->strides ? b->strides[0] : b->itemsize;
    c->item = (int)b->itemsize;
    return 1;
}

static inline int64_t column_get(const column_t *c, int64_t i) {
    const char *q = c->p + i * c->stride;
    return c->item == 4 ? (int64_t) * (const int32_t *)q : *(const int64_t *)q;
}

static PyObject *length_order(PyObject *self, PyObject *args) {
    PyObject *src_obj, *tgt_obj;
    Py_buffer src = {0}, rkey = {0}, out = {0}, tgt = {0};
    if (!PyArg_ParseTuple(args, "OOy*w*", &src_obj, &tgt_obj, &rkey, &out))
        return NULL;
    PyObject *result = NULL;
    uint64_t *a = NULL, *b = NULL;
    uint32_t *sc = NULL;
    int64_t *hist = NULL;
    column_t cs, ct;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_RECORDS_RO) < 0 ||
        (tgt_obj != Py_None && PyObject_GetBuffer(tgt_obj, &tgt, PyBUF_RECORDS_RO) < 0))
        goto done;
    if (!column_of(&src, &cs) || (tgt.obj && !column_of(&tgt, &ct))) {
        PyErr_SetString(PyExc_ValueError, "length_order: lengths must be 1-D int32 or int64");
        goto done;
    }
    int64_t n = src.ndim ? src.shape[0] : 0;
    if (out.len != n * 8 || rkey.len != n * 2 || (tgt.obj && tgt.shape[0] != n)) {
        PyErr_SetString(PyExc_ValueError, "length_order: mismatched argument lengths");
        goto done;
    }
    const int has_t = tgt.obj != NULL;
    const uint16_t *rk = rkey.buf;
    int64_t *o = out.buf;
    if (n == 0) {
        result = Py_NewRef(Py_True);
        goto done;
    }
    sc = malloc((size_t)n * sizeof(uint32_t));
    if (!sc) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t maxc = INT64_MIN;
    uint32_t orc = 0, ors = 0;
    for (int64_t i = 0; i < n; i++) { /* (cost, src) as uint16 each, packed: all the passes below read */
        int64_t sl = column_get(&cs, i), tl = has_t ? column_get(&ct, i) : sl, c = tl > sl ? tl : sl;
        maxc = c > maxc ? c : maxc;
        orc |= (uint16_t)c;
        ors |= (uint16_t)sl;
        sc[i] = ((uint32_t)(uint16_t)c << 16) | (uint16_t)sl;
    }
    int cb = bit_length(orc), sb = has_t ? bit_length(ors) : 0, ib = bit_length((uint64_t)(n - 1));
    int kb = cb + sb + 16;
    if (maxc > 65535) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (cb + sb <= LENGTH_BITS) {
        if (bucket_order(sc, has_t, rk, n, sb, ib, o) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        result = Py_NewRef(Py_True);
        goto done;
    }
    if (kb + ib > 64) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    int passes = (kb + 11) / 12, d = (kb + passes - 1) / passes; /* digits of at most 12 bits */
    int64_t buckets = (int64_t)1 << d;
    a = (uint64_t *)o; /* the output is one of the two buffers: half the fresh pages to fault in */
    b = malloc((size_t)n * 8);
    hist = calloc((size_t)(4 * buckets), sizeof(int64_t));
    if (!b || !hist) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    const uint64_t dmask = (uint64_t)buckets - 1;
    const int cshift = sb + 16;
    for (int64_t i = 0; i < n; i++) {
        uint64_t key = ((uint64_t)(sc[i] >> 16) << cshift) | (has_t ? (uint64_t)(sc[i] & 0xFFFFU) << 16 : 0) | rk[i];
        a[i] = (key << ib) | (uint64_t)i;
    }
    for (int p = 0; p < passes; p++) {
        /* the digit's histogram in four interleaved copies: runs of one digit (the length digits come in long
         * runs) would otherwise wait on the previous increment of the same counter */
        int shift = ib + p * d, single = 0;
        int64_t *h0 = hist, *h1 = hist + buckets, *h2 = hist + 2 * buckets, *h3 = hist + 3 * buckets;
        memset(hist, 0, (size_t)(4 * buckets) * sizeof(int64_t));
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            h0[(a[i] >> shift) & dmask]++;
            h1[(a[i + 1] >> shift) & dmask]++;
            h2[(a[i + 2] >> shift) & dmask]++;
            h3[(a[i + 3] >> shift) & dmask]++;
        }
        for (; i < n; i++)
            h0[(a[i] >> shift) & dmask]++;
        int64_t sum = 0;
        for (int64_t v = 0; v < buckets; v++) {
            int64_t c = h0[v] + h1[v] + h2[v] + h3[v];
            single |= c == n;
            h0[v] = sum;
            sum += c;
        }
        if (single)
            continue; /* every key has the same digit here: the pass would not move anything */
        for (i = 0; i < n; i++)
            b[h0[(a[i] >> shift) & dmask]++] = a[i];
        uint64_t *tmp = a;
        a = b;
        b = tmp;
    }
    const uint64_t imask = ib ? (~0ULL >> (64 - ib)) : 0;
    for (int64_t i = 0; i < n; i++)
        o[i] = (int64_t)(a[i] & imask); /* in place when the last pass left the keys in the output */
    if ((int64_t *)b == o)
        b = a; /* free the malloc'd buffer, whichever the passes left it as */
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_True);
done:
    free(b);
    free(hist);
    free(sc);
    if (src.obj)
        PyBuffer_Release(&src);
    PyBuffer_Release(&rkey);
    PyBuffer_Release(&out);
    if (tgt.obj)
        PyBuffer_Release(&tgt);
    return result;
}

/* ------------------------------------------------------------------------------------------- batches */
/* batch_ends(cost, max_tokens, cap, multiple, out) -> number of batches, or -1 where cost decreases somewhere
 *
 * batching.batch_sorted's greedy cut over non-decreasing costs in [1, max_tokens] (the caller checks the ends):
 * each batch takes the largest k <= cap with k * cost[i + k - 1] <= max_tokens, cut to a multiple of
 * ``multiple`` when k >= multiple. ``out`` has room for one end per sample. */
static PyObject *batch_ends(PyObject *self, PyObject *args) {
    Py_buffer cost, out;
    long long max_tokens, cap, multiple;
    if (!PyArg_ParseTuple(args, "y*LLLw*", &cost, &max_tokens, &cap, &multiple, &out))
        return NULL;
    int64_t n = cost.len / 8, nb = 0;
    const int64_t *c = cost.buf;
    int64_t *o = out.buf;
    if (out.len < cost.len || multiple < 1 || cap < 1) {
        PyBuffer_Release(&cost);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "batch_ends: bad arguments");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 1; i < n; i++) {
        if (c[i] < c[i - 1]) {
            nb = -1;
            break;
        }
    }
    for (int64_t i = 0; nb >= 0 && i < n;) {
        int64_t lo = 1, hi = n - i;
        if (cap < hi)
            hi = cap;
        if (max_tokens / c[i] < hi)
            hi = max_tokens / c[i];
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) >> 1;
            if (mid * c[i + mid - 1] <= max_tokens)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo >= multiple)
            lo -= lo % multiple;
        i += lo;
        o[nb++] = i;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&cost);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(nb);
}

/* ------------------------------------------------------------------------------------------- lengths */
static int load_size(const char *base, char code, int64_t r, int64_t *v) {
    switch (code) {
    case 'H': *v = ((const uint16_t *)base)[r]; return 1;
    case 'h': *v = ((const int16_t *)base)[r]; return 1;
    case 'i': *v = ((const int32_t *)base)[r]; return 1;
    case 'I': *v = ((const uint32_t *)base)[r]; return 1;
    case 'q': case 'l': *v = ((const int64_t *)base)[r]; return 1;
    }
    return 0;
}

/* take_lengths(src_sizes, tgt_sizes, rows, src_plen, tgt_plen, pairs) -> bool
 *
 * pairs[i, 2] = src_sizes[rows[i]] + src_plen and, with tgt_sizes, pairs[i, 3] = tgt_sizes[rows[i]] + tgt_plen,
 * as int32 (sizes 1-D and pairs an int32 [n, >= 4] view, any strides): Component.lengths in one pass whose random reads of
 * the two size arrays are prefetched a few rows ahead. False (numpy answers) for a row outside the sizes or a
 * size dtype it does not read. */
#define AHEAD 16
static PyObject *take_lengths(PyObject *self, PyObject *args) {
    PyObject *src_obj, *tgt_obj, *rows_obj, *pairs_obj;
    long long splen, tplen;
    if (!PyArg_ParseTuple(args, "OOOLLO", &src_obj, &tgt_obj, &rows_obj, &splen, &tplen, &pairs_obj))
        return NULL;
    Py_buffer sz = {0}, tz = {0}, rows = {0}, pairs = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(src_obj, &sz, PyBUF_RECORDS_RO) < 0 ||
        (tgt_obj != Py_None && PyObject_GetBuffer(tgt_obj, &tz, PyBUF_RECORDS_RO) < 0) ||
        PyObject_GetBuffer(rows_obj, &rows, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0 ||
        PyObject_GetBuffer(pairs_obj, &pairs, PyBUF_RECORDS) < 0)
        goto done;
    char sc = code_of(&sz), tc = tz.obj ? code_of(&tz) : 'H', rc = code_of(&rows);
    int64_t n = rows.len / 8;
    if (!known_code(sc) || !known_code(tc) || (rc != 'q' && rc != 'l') || sz.ndim != 1 || (tz.obj && tz.ndim != 1) ||
        rows.itemsize != 8 || pairs.ndim != 2 || pairs.itemsize != 4 || code_of(&pairs) != 'i' ||
        pairs.shape[0] != n || pairs.shape[1] < 4) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    /* sizes of any stride: both sides interleaved in one array read one cache line per row */
    const int64_t *rw = rows.buf, slen = sz.shape[0], tlen = tz.obj ? tz.shape[0] : 0;
    const Py_ssize_t sst = sz.strides[0], tst = tz.obj ? tz.strides[0] : 0;
    const char *sb = sz.buf, *tb = tz.obj ? tz.buf : NULL;
    char *pb = pairs.buf;
    const Py_ssize_t s0 = pairs.strides[0], s1 = pairs.strides[1];
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            int64_t ra = rw[i + AHEAD];
            if (ra >= 0 && ra < slen)
                __builtin_prefetch(sb + ra * sst);
            if (tb && ra >= 0 && ra < tlen)
                __builtin_prefetch(tb + ra * tst);
        }
        int64_t r = rw[i], v = 0;
        if (r < 0 || r >= slen || (tb && r >= tlen)) {
            ok = 0;
            break;
        }
        load_size(sb + r * sst, sc, 0, &v);
        *(int32_t *)(pb + i * s0 + 2 * s1) = (int32_t)(v + splen);
        if (tb) {
            load_size(tb + r * tst, tc, 0, &v);
            *(int32_t *)(pb + i * s0 + 3 * s1) = (int32_t)(v + tplen);
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(ok ? Py_True : Py_False);
done:
    if (sz.obj)
        PyBuffer_Release(&sz);
    if (tz.obj)
        PyBuffer_Release(&tz);
    if (rows.obj)
        PyBuffer_Release(&rows);
    if (pairs.obj)
        PyBuffer_Release(&pairs);
    return result;
}

/* take_rows(src, idx, out) -> bool
 *
 * out[i] = src[idx[i]] for C-contiguous 2-D arrays of the same row width (the planner's 24-byte sample rows):
 * numpy's take, with the rows 16 ahead prefetched so that the random reads of a large window overlap. False
 * (numpy answers) for an index outside [0, rows) or mismatched shapes. */
static PyObject *take_rows(PyObject *self, PyObject *args) {
    Py_buffer src, idx, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &src, &idx, &out))
        return NULL;
    int64_t n = idx.len / 8;
    Py_ssize_t width = n ? out.len / n : 0;
    int ok = width > 0 && out.len == n * width && src.len % width == 0;
    if (n == 0)
        ok = out.len == 0;
    int64_t rows = ok && n ? src.len / width : 0;
    const int64_t *ix = idx.buf;
    const char *sb = src.buf;
    char *ob = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; ok && i < n; i++) {
        if (i + AHEAD < n) {
            int64_t ra = ix[i + AHEAD];
            if (ra >= 0 && ra < rows) {
                __builtin_prefetch(sb + ra * width);
                __builtin_prefetch(sb + ra * width + width - 1);
            }
        }
        int64_t r = ix[i];
        if (r < 0 || r >= rows) {
            ok = 0;
            break;
        }
        memcpy(ob + i * width, sb + r * width, (size_t)width);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&idx);
    PyBuffer_Release(&out);
    return Py_NewRef(ok ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"take_rows", take_rows, METH_VARARGS, "Rows of a 2-D array at indices, prefetched."},
    {"take_lengths", take_lengths, METH_VARARGS, "Sample lengths of rows into the planner's int32 pairs."},
    {"stratified", stratified, METH_VARARGS, "Rows of stratified draws (keyed Feistel permutations)."},
    {"length_order", length_order, METH_VARARGS, "Order by (max(src, tgt), src, random key, index)."},
    {"batch_ends", batch_ends, METH_VARARGS, "Greedy token-budget batch ends over non-decreasing costs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_plan", "babelfeed's optional planning kernel.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__plan(void) { return PyModule_Create(&module); }
