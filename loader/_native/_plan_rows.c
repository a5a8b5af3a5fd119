/* babelfeed's planning kernel, part two: a window's rows (their lengths, their order by LSD passes, their
 * reorder) and the batches cut from them; the module and the rest are in _plan.c, which says what each
 * function matches in numpy. */
#include "_plan.h"

/* ------------------------------------------------------------------------------------------- order */
/* length_order(src, tgt, rkey, out)
 *
 * The order of samples by (cost, src, rkey, index) ascending, cost = max(src, tgt) (src without tgt), each
 * length taken as uint16 as numpy's astype does, rkey uint16: batching.length_order's three stable sorts. The
 * four fields are packed into one uint64 and sorted by the bits above the index (the index is already in order
 * and LSD passes are stable), in passes of at most 12 bits. Returns True, or False where it cannot (a cost
 * above 65535, or more than 64 bits), leaving the numpy path to answer. */
PyObject *plan_length_order(PyObject *self, PyObject *args) {
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
        if (plan_bucket_order(sc, has_t, rk, n, sb, ib, o) < 0) {
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
    release_if(&src);
    PyBuffer_Release(&rkey);
    PyBuffer_Release(&out);
    release_if(&tgt);
    return result;
}

/* ------------------------------------------------------------------------------------------- lengths */
/* One size, read with memcpy: a fairseq .idx holds its int32 sizes from byte 26 (Megatron's from 34), so a
 * mapped sizes array need not be aligned (the compiler makes this one plain load). */
#define LOAD_AS(T) { T x_; memcpy(&x_, base + r * (int64_t)sizeof(T), sizeof(T)); *v = (int64_t)x_; return 1; }
static int load_size(const char *base, char code, int64_t r, int64_t *v) {
    switch (code) {
    case 'H': LOAD_AS(uint16_t)
    case 'h': LOAD_AS(int16_t)
    case 'i': LOAD_AS(int32_t)
    case 'I': LOAD_AS(uint32_t)
    case 'q': case 'l': LOAD_AS(int64_t)
    }
    return 0;
}

/* take_lengths(src_sizes, tgt_sizes, rows, src_plen, tgt_plen, pairs) -> bool
 *
 * pairs[i, -2] = src_sizes[rows[i]] + src_plen and, with tgt_sizes, pairs[i, -1] = tgt_sizes[rows[i]] + tgt_plen,
 * as int32 (sizes 1-D and pairs an int32 [n, >= 2] view, any strides: the last two columns of the planner's
 * sample rows, or a window's [n, 2] lengths): Component.lengths in one pass whose random reads of the two size
 * arrays are prefetched a few rows ahead. False (numpy answers) for a row outside the sizes or a size dtype it
 * does not read. */
PyObject *plan_take_lengths(PyObject *self, PyObject *args) {
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
        pairs.shape[0] != n || pairs.shape[1] < 2) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    /* sizes of any stride: both sides interleaved in one array read one cache line per row */
    const int64_t *rw = rows.buf, slen = sz.shape[0], tlen = tz.obj ? tz.shape[0] : 0;
    const Py_ssize_t sst = sz.strides[0], tst = tz.obj ? tz.strides[0] : 0;
    const char *sb = sz.buf, *tb = tz.obj ? tz.buf : NULL;
    char *pb = pairs.buf;
    const Py_ssize_t s0 = pairs.strides[0], s1 = pairs.strides[1], c0 = pairs.shape[1] - 2;
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
        *(int32_t *)(pb + i * s0 + c0 * s1) = (int32_t)(v + splen);
        if (tb) {
            load_size(tb + r * tst, tc, 0, &v);
            *(int32_t *)(pb + i * s0 + (c0 + 1) * s1) = (int32_t)(v + tplen);
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(ok ? Py_True : Py_False);
done:
    release_if(&sz);
    release_if(&tz);
    release_if(&rows);
    release_if(&pairs);
    return result;
}

/* pair_sizes(src_sizes, tgt_sizes, out) -> bool
 *
 * out[i] = (src_sizes[i], tgt_sizes[i]) as uint16 (out C-contiguous uint16 [n, 2]; sizes 1-D of any dtype
 * take_lengths reads, any stride): RowCache.copy_pair's interleaved copy of a corpus's lengths in one pass, where
 * numpy takes four passes to find the range and two strided copies. False (out unspecified; numpy answers) where
 * a size lies outside [0, 65535] or an array is one it does not read. */
PyObject *plan_pair_sizes(PyObject *self, PyObject *args) {
    PyObject *src_obj, *tgt_obj;
    Py_buffer sz = {0}, tz = {0}, out;
    if (!PyArg_ParseTuple(args, "OOw*", &src_obj, &tgt_obj, &out))
        return NULL;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(src_obj, &sz, PyBUF_RECORDS_RO) < 0 ||
        PyObject_GetBuffer(tgt_obj, &tz, PyBUF_RECORDS_RO) < 0)
        goto done;
    const char sc = code_of(&sz), tc = code_of(&tz);
    const int64_t n = sz.ndim == 1 ? sz.shape[0] : -1;
    if (!known_code(sc) || !known_code(tc) || n < 0 || tz.ndim != 1 || tz.shape[0] != n || out.len != n * 4) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    const char *sb = sz.buf, *tb = tz.buf;
    const Py_ssize_t sst = sz.strides[0], tst = tz.strides[0];
    uint16_t *o = out.buf;
    int64_t bad = 0;
    Py_BEGIN_ALLOW_THREADS
    if (sc == 'i' && tc == 'i') { /* the common index: int32 sizes (at byte 34 of a fairseq .idx: unaligned) */
        for (int64_t i = 0; i < n; i++) {
            int32_t a, b;
            memcpy(&a, sb + i * sst, sizeof(a));
            memcpy(&b, tb + i * tst, sizeof(b));
            bad |= (int64_t)((uint32_t)a | (uint32_t)b) >> 16;
            o[2 * i] = (uint16_t)a;
            o[2 * i + 1] = (uint16_t)b;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t a = 0, b = 0;
            load_size(sb + i * sst, sc, 0, &a);
            load_size(tb + i * tst, tc, 0, &b);
            bad |= (a < 0 || a > 65535 || b < 0 || b > 65535);
            o[2 * i] = (uint16_t)a;
            o[2 * i + 1] = (uint16_t)b;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(bad ? Py_False : Py_True);
done:
    release_if(&sz);
    release_if(&tz);
    PyBuffer_Release(&out);
    return result;
}

/* take_rows(src, idx, out) -> bool
 *
 * out[i] = src[idx[i]] for C-contiguous 2-D arrays of the same row width (the planner's 24-byte sample rows):
 * numpy's take, with the rows 16 ahead prefetched so that the random reads of a large window overlap. False
 * (numpy answers) for an index outside [0, rows) or mismatched shapes. */
PyObject *plan_take_rows(PyObject *self, PyObject *args) {
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

/* ------------------------------------------------------------------------------------------- batches */
/* batch_ends(cost, other, max_tokens, cap, multiple, out, ordered=False) -> number of batches, or -1 where cost
 * decreases somewhere
 *
 * batching.batch_sorted's greedy cut over non-decreasing costs in [1, max_tokens] (the caller checks the ends):
 * each batch takes the largest k <= cap with k * cost[i + k - 1] <= max_tokens, cut to a multiple of
 * ``multiple`` when k >= multiple. cost[i] is max(cost[i], other[i]) where ``other`` is given (the planner's
 * int32 source and target columns, read in place: 1-D int32 or int64, any stride). ``out`` has room for one end
 * per sample. ``ordered``: the caller ordered the costs itself (the planner's length order), so the pass that
 * checks every pair is left out and only the costs the cut reads are compared (each batch's first and last
 * against the batch before): a cut that reads a few thousand costs instead of every one. */
PyObject *plan_batch_ends(PyObject *self, PyObject *args) {
    PyObject *cost_obj, *other_obj;
    Py_buffer cost = {0}, other = {0}, out;
    long long max_tokens, cap, multiple;
    int ordered = 0;
    if (!PyArg_ParseTuple(args, "OOLLLw*|p", &cost_obj, &other_obj, &max_tokens, &cap, &multiple, &out, &ordered))
        return NULL;
    column_t ca, cb;
    if (PyObject_GetBuffer(cost_obj, &cost, PyBUF_RECORDS_RO) < 0 ||
        (other_obj != Py_None && PyObject_GetBuffer(other_obj, &other, PyBUF_RECORDS_RO) < 0)) {
        release_if(&cost);
        PyBuffer_Release(&out);
        return NULL;
    }
    int64_t n = cost.ndim == 1 ? cost.shape[0] : 0, nb = 0, *o = out.buf;
    if (!column_of(&cost, &ca) || (other.obj && (!column_of(&other, &cb) || other.shape[0] != n)) ||
        out.len < n * 8 || multiple < 1 || cap < 1) {
        PyBuffer_Release(&cost);
        release_if(&other);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "batch_ends: bad arguments");
        return NULL;
    }
    const column_t *cob = other.obj ? &cb : &ca;
#define COST(i) (column_get(&ca, i) > column_get(cob, i) ? column_get(&ca, i) : column_get(cob, i))
    if (n > 0 && COST(0) < 1) { /* the first cost is the smallest (checked below): none may be 0 */
        PyBuffer_Release(&cost);
        release_if(&other);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "batch_ends: costs must be >= 1");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 1; !ordered && i < n; i++) {
        if (COST(i) < COST(i - 1)) {
            nb = -1;
            break;
        }
    }
    for (int64_t i = 0, last = 0; nb >= 0 && i < n;) {
        int64_t lo = 1, hi = n - i;
        if (cap < hi)
            hi = cap;
        if (COST(i) < 1) { /* (ordered: the pass that saw every cost >= the first, checked >= 1, is left out) */
            nb = -1;
            break;
        }
        if (max_tokens / COST(i) < hi)
            hi = max_tokens / COST(i);
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) >> 1;
            if (mid * COST(i + mid - 1) <= max_tokens)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo >= multiple)
            lo -= lo % multiple;
        if (ordered) { /* the costs this batch was cut by, against the batch before */
            const int64_t first = COST(i), end = COST(i + lo - 1);
            if (first < last || end < first) {
                nb = -1;
                break;
            }
            last = end;
        }
        i += lo;
        o[nb++] = i;
    }
    Py_END_ALLOW_THREADS
#undef COST
    PyBuffer_Release(&cost);
    release_if(&other);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(nb);
}
