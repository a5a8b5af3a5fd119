/* babelfeed's planning kernel, part three: the length order by buckets of (cost, src), and a window's rows
 * written straight into that order (sorted_rows), carried through the sort rather than moved at random
 * afterwards; the module is in _plan.c. */
#include "_plan.h"
#ifndef _WIN32
#include <pthread.h>
#endif

/* Sort n unique uint64 values ascending by their 16 bits at ``shift`` (the bits below are already in order):
 * insertion for a few, else two stable 8-bit counting passes through ``tmp``. */
/* Two byte histograms -> the first output slot of every byte value (exclusive prefix sums), for two passes of
   a least-significant-byte radix sort. */
static void starts(int64_t h[2][256]) {
    for (int p = 0; p < 2; p++) {
        int64_t sum = 0;
        for (int k = 0; k < 256; k++) {
            int64_t c = h[p][k];
            h[p][k] = sum;
            sum += c;
        }
    }
}

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
    starts(h);
    for (int64_t i = 0; i < n; i++)
        tmp[h[0][(v[i] >> shift) & 255]++] = v[i];
    for (int64_t i = 0; i < n; i++)
        v[h[1][(tmp[i] >> (shift + 8)) & 255]++] = tmp[i];
}

/* One counting pass by bucket ck[i] < 2^LENGTH_BITS (stable: indices ascend within a bucket), then each bucket,
 * small and in cache, sorted by (rkey, index): v receives (rk[i] << ib) | i in (ck, rkey, index) order, using
 * end (2^LENGTH_BITS entries). -1: no memory. Runs without the GIL. */
static int bucket_sort(const uint32_t *ck, const uint16_t *rk, int64_t n, int ib, uint64_t *v, int64_t *end) {
    const int64_t nb = (int64_t)1 << LENGTH_BITS;
    int64_t big = 0;
    memset(end, 0, (size_t)nb * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        end[ck[i]]++;
    for (int64_t k = 0, sum = 0; k < nb; k++) {
        int64_t c = end[k];
        big = c > big ? c : big;
        end[k] = sum;
        sum += c;
    }
    for (int64_t i = 0; i < n; i++)
        v[end[ck[i]]++] = ((uint64_t)rk[i] << ib) | (uint64_t)i;
    uint64_t *tmp = malloc((size_t)(big ? big : 1) * sizeof(uint64_t));
    if (!tmp)
        return -1;
    for (int64_t k = 0, lo = 0; k < nb; k++) { /* end[k] is now the end of bucket k */
        sort_bucket(v + lo, end[k] - lo, ib, tmp);
        lo = end[k];
    }
    free(tmp);
    return 0;
}

/* sorted_rows' entries: key = target << 48 | rkey << 32 | sample; rs = source << 48 | row. */
typedef struct {
    uint64_t key, rs;
} entry_t;

/* length_order's order for lengths of at most LENGTH_BITS bits of (cost, src) together (sc[i] = cost << 16 | src,
 * sb the bits of src, 0 without a target): the same order as its LSD passes, with one pass over memory at random
 * instead of three. -1: no memory. */
int plan_bucket_order(const uint32_t *sc, int has_t, const uint16_t *rk, int64_t n, int sb, int ib, int64_t *o) {
    int64_t *end = malloc(((size_t)1 << LENGTH_BITS) * sizeof(int64_t));
    uint32_t *ck = malloc((size_t)n * sizeof(uint32_t));
    int rc = -1;
    if (end && ck) {
        Py_BEGIN_ALLOW_THREADS
        for (int64_t i = 0; i < n; i++)
            ck[i] = ((sc[i] >> 16) << sb) | (has_t ? (sc[i] & 0xFFFFU) : 0);
        rc = bucket_sort(ck, rk, n, ib, (uint64_t *)o, end);
        const uint64_t imask = ib ? (~0ULL >> (64 - ib)) : 0;
        for (int64_t i = 0; rc == 0 && i < n; i++)
            o[i] = (int64_t)((uint64_t)o[i] & imask);
        Py_END_ALLOW_THREADS
    }
    free(end);
    free(ck);
    return rc;
}

/* sorted_rows(lens, has_t, keep, rkey, rows, span_ends, span_pairs, out, threads=1, span_sums=None) -> bool
 *
 * The planner's window rows in length order, written in place of sorting them and moving 24-byte rows at random.
 * Sample j of the selection is window sample i = keep[j] (keep None: i = j; keep ascends), lengths lens[i] (int32
 * [N, 2]: src, tgt), row rows[i] (int64 [N]), in the span s with span_ends[s-1] <= i < span_ends[s] whose
 * (direction, component) int32 pair is span_pairs[s] (as int64). The selection is ordered as
 * batching.length_order orders it (by cost = max(src, tgt) (src when not has_t), src, rkey[j], j), and out [n, 3]
 * receives per sample in that order the planner's row: (direction, component), (src, tgt), row. ``span_sums``
 * (optional, int64 [S, 3]) receives per span its selected samples, source tokens and target tokens (the window's
 * totals, from the pass that checks the lengths, instead of a pass over the rows).
 *
 * Each sample travels as one 16-byte entry carrying its lengths, key and row: one stable scatter by cost (a few
 * hundred streams, in cache) into the output's memory, then per cost, in cache, three stable counting passes by
 * rkey and src (costs split between ``threads`` threads: they are independent), and last the rows written out
 * from the highest cost down. Nothing is read at random. False, with nothing written (every check comes before
 * the first write: lengths in the output's top third are still there for the caller's other way), where this
 * does not apply (a length outside [0, 65535], (cost, src) over LENGTH_BITS bits, a window over 2^32 samples or a
 * row over 2^48): the caller orders them its other way. */

/* fn(jobs + t * size) for t < k: job 0 in the calling thread, the others in their own threads where they can
 * be started (else here, one after another). */
static void run_jobs(void *(*fn)(void *), char *jobs, size_t size, int k) {
#ifndef _WIN32
    enum { MAX_THREADS = 16 };
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < k && t < MAX_THREADS; t++)
        started[t] = pthread_create(&ids[t], NULL, fn, jobs + t * size) == 0;
    fn(jobs);
    for (int t = 1; t < k; t++) {
        if (t < MAX_THREADS && started[t])
            pthread_join(ids[t], NULL);
        else
            fn(jobs + t * size);
    }
#else
    for (int t = 0; t < k; t++)
        fn(jobs + t * size);
#endif
}

/* The entries of costs [c_lo, c_hi) (bucket c at [at[c-1], at[c]) of v, at[-1] = 0), each sorted in place by
 * (src, rkey, sample): samples already ascend in a bucket, so three stable counting passes do it, least
 * significant digit first (rkey's low byte, its high byte, src), their three histograms made in one pass; the
 * src pass is left out where one src holds the whole bucket, as it always does without a target (cost = src:
 * ``hs`` NULL, no src histogram). A few entries: an insertion sort by (src, rkey). ``tmp`` (room for ``big``
 * entries) is given, or allocated here. */
typedef struct {
    entry_t *v, *tmp;
    const int64_t *at;
    int64_t c_lo, c_hi, ns, big;
    int has_t, failed;
} sort_job_t;

#define SRC_RKEY(e) ((((e).rs >> 48) << 16) | (((e).key >> 32) & 0xFFFFU))

static void sort_bucket_by_src(entry_t *v, int64_t m, int64_t ns, entry_t *tmp, int64_t *hs) {
    if (m <= 32) {
        for (int64_t i = 1; i < m; i++) {
            const entry_t x = v[i];
            const uint64_t xk = SRC_RKEY(x);
            int64_t j = i;
            for (; j > 0 && SRC_RKEY(v[j - 1]) > xk; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
        return;
    }
    int64_t h[2][256];
    memset(h, 0, sizeof(h));
    if (hs)
        memset(hs, 0, (size_t)ns * sizeof(int64_t));
    for (int64_t k = 0; k < m; k++) {
        h[0][(v[k].key >> 32) & 255]++;
        h[1][(v[k].key >> 40) & 255]++;
        if (hs)
            hs[v[k].rs >> 48]++;
    }
    starts(h);
    int one_src = !hs;
    for (int64_t k = 0, sum = 0; hs && k < ns; k++) {
        const int64_t x = hs[k];
        one_src |= x == m;
        hs[k] = sum;
        sum += x;
    }
    for (int64_t k = 0; k < m; k++)
        tmp[h[0][(v[k].key >> 32) & 255]++] = v[k];
    for (int64_t k = 0; k < m; k++)
        v[h[1][(tmp[k].key >> 40) & 255]++] = tmp[k];
    if (one_src)
        return;
    for (int64_t k = 0; k < m; k++)
        tmp[hs[v[k].rs >> 48]++] = v[k];
    memcpy(v, tmp, (size_t)m * sizeof(entry_t));
}

static void *sort_costs(void *arg) {
    sort_job_t *job = arg;
    entry_t *tmp = job->tmp ? job->tmp : malloc((size_t)(job->big ? job->big : 1) * sizeof(entry_t));
    int64_t *hs = job->has_t ? malloc((size_t)job->ns * sizeof(int64_t)) : NULL;
    if (!tmp || (job->has_t && !hs)) {
        job->failed = 1;
        goto out;
    }
    for (int64_t c = job->c_lo; c < job->c_hi; c++) {
        const int64_t lo = c ? job->at[c - 1] : 0, m = job->at[c] - lo;
        if (m < 2)
            continue;
        sort_bucket_by_src(job->v + lo, m, job->ns, tmp, hs);
    }
out:
    if (!job->tmp)
        free(tmp);
    free(hs);
    return NULL;
}

/* sort_costs over ``threads`` threads (at most 16), each a run of costs holding about as many entries; 0, or
 * -1: no memory, and nothing reliable sorted. */
static int sort_all_costs(entry_t *v, const int64_t *at, int64_t nc, int64_t ns, int64_t big, int has_t, int threads,
                          entry_t *spare, int64_t room) {
    sort_job_t jobs[16];
    const int64_t n = at[nc - 1];
    threads = threads < 1 ? 1 : threads > 16 ? 16 : threads;
    const int in_spare = (int64_t)threads * (big ? big : 1) <= room; /* each thread's tmp in the spare room */
    int64_t c = 0;
    for (int t = 0; t < threads; t++) {
        const int64_t goal = n * (t + 1) / threads;
        int64_t e = c;
        while (e < nc && (t == threads - 1 || at[e] <= goal))
            e++;
        jobs[t] = (sort_job_t){v, in_spare ? spare + t * (big ? big : 1) : NULL, at, c, e, ns, big, has_t, 0};
        c = e;
    }
    run_jobs(sort_costs, (char *)jobs, sizeof(sort_job_t), threads);
    for (int t = 0; t < threads; t++)
        if (jobs[t].failed)
            return -1;
    return 0;
}

#define ROW_MASK ((1ULL << 48) - 1)

/* A selected sample's cost: max(src, tgt), src without a target */
static inline uint32_t cost_of(const int32_t *ln, int64_t i, int has_t) {
    const int32_t s = ln[2 * i], t = ln[2 * i + 1];
    return (uint32_t)(has_t && t > s ? t : s);
}

/* One part [lo, hi) of the selection, three passes by as many threads: ``check`` (every length in [0, 65535] and
 * row under 2^48; the bits the costs and sources take), ``count`` (this part's count of every cost, into off) and
 * ``scatter`` (the stable scatter by cost into entries: sample j goes to v[off[cost]++], off being by then this
 * part's first slot of every cost, after the slots of the parts before it: the same order as one pass). */
typedef struct {
    entry_t *v;
    int64_t *off;
    const uint16_t *rk;
    const int64_t *kp, *rw;
    const int32_t *ln;
    int64_t lo, hi;
    int has_t, ok;
    uint32_t orc, ors;
    int64_t *acc;       /* check: this part's (samples, source tokens, target tokens) per span, or NULL */
    const int64_t *se;  /* the spans' cumulative ends, S of them */
    int64_t S;
} scatter_job_t;

static void *check_part(void *arg) {
    scatter_job_t *job = arg;
    uint32_t orc = 0, ors = 0, bad = 0;
    int64_t a = 0; /* the span of the part's first sample (samples ascend: later ones lie in it or after) */
    if (job->acc && job->lo < job->hi) {
        const int64_t first = job->kp ? job->kp[job->lo] : job->lo;
        for (int64_t z = job->S - 1; a < z;) {
            const int64_t h = (a + z) >> 1;
            if (job->se[h] > first)
                z = h;
            else
                a = h + 1;
        }
    }
    int64_t count = 0, ssum = 0, tsum = 0, end = job->acc ? job->se[a] : INT64_MAX; /* span a's, in registers */
    for (int64_t j = job->lo; j < job->hi; j++) {
        const int64_t i = job->kp ? job->kp[j] : j;
        const int32_t s = job->ln[2 * i], t = job->ln[2 * i + 1];
        bad |= (uint32_t)s | (uint32_t)t;                    /* a negative length sets the top bits */
        bad |= (uint32_t)((uint64_t)job->rw[i] >> 48) << 16; /* as does a row over 2^48 (or negative) */
        orc |= cost_of(job->ln, i, job->has_t);
        ors |= (uint32_t)s;
        if (i >= end) { /* a later span: this one's sums out, once */
            job->acc[3 * a] += count, job->acc[3 * a + 1] += ssum, job->acc[3 * a + 2] += tsum;
            count = ssum = tsum = 0;
            while (i >= job->se[a])
                a++;
            end = job->se[a];
        }
        count++;
        ssum += s;
        tsum += t;
    }
    if (job->acc && count)
        job->acc[3 * a] += count, job->acc[3 * a + 1] += ssum, job->acc[3 * a + 2] += tsum;
    job->ok = (bad >> 16) == 0;
    job->orc = orc;
    job->ors = ors;
    return NULL;
}

static void *count_part(void *arg) {
    const scatter_job_t *job = arg;
    for (int64_t j = job->lo; j < job->hi; j++)
        job->off[cost_of(job->ln, job->kp ? job->kp[j] : j, job->has_t)]++;
    return NULL;
}

static void *scatter_costs(void *arg) {
    const scatter_job_t *job = arg;
    for (int64_t j = job->lo; j < job->hi; j++) {
        const int64_t i = job->kp ? job->kp[j] : j;
        const uint64_t s = (uint32_t)job->ln[2 * i], t = (uint32_t)job->ln[2 * i + 1];
        const entry_t e = {(t << 48) | ((uint64_t)job->rk[j] << 32) | (uint64_t)i, (s << 48) | (uint64_t)job->rw[i]};
        job->v[job->off[job->has_t && t > s ? t : s]++] = e;
    }
    return NULL;
}

/* Entries [lo, hi) written out as the planner's rows (three uint64 each, over the same memory), from the last:
 * row g covers the bytes of entries g and above only. */
typedef struct {
    uint64_t *o;
    const entry_t *v;
    const int64_t *se, *sp;
    int64_t S, lo, hi;
} expand_job_t;

static void *expand_rows(void *arg) {
    const expand_job_t *job = arg;
    for (int64_t g = job->hi - 1; g >= job->lo; g--) {
        const entry_t e = job->v[g];
        const int64_t i = (int64_t)(e.key & 0xFFFFFFFFU);
        int64_t a = 0, z = job->S - 1; /* the first span ending after i */
        while (a < z) {
            int64_t h = (a + z) >> 1;
            if (job->se[h] > i)
                z = h;
            else
                a = h + 1;
        }
        uint64_t *r = job->o + 3 * g;
        r[0] = (uint64_t)job->sp[a];
        r[1] = (e.rs >> 48) | ((e.key >> 48) << 32);
        r[2] = e.rs & ROW_MASK;
    }
    return NULL;
}

/* All n entries written out as rows, in chunks from the top: chunk [g1, g2) with g2 <= 1.5 g1 lands at bytes
 * 24 g1 and up, above every entry not yet read (below 16 g2), so its rows are written by ``threads`` threads at
 * once; the last small chunk by one. */
static void expand_all(uint64_t *o, const entry_t *v, const int64_t *se, const int64_t *sp, int64_t S, int64_t n,
                       int threads) {
    threads = threads < 1 ? 1 : threads > 16 ? 16 : threads;
    expand_job_t jobs[16];
    int64_t g2 = n;
    while (g2 > 0) {
        const int64_t g1 = threads > 1 && g2 >= 4096 ? g2 - g2 / 3 : 0; /* g2 - g2/3 >= 2 g2 / 3 */
        const int k = g1 ? threads : 1;
        for (int t = 0; t < k; t++)
            jobs[t] = (expand_job_t){o, v, se, sp, S, g1 + (g2 - g1) * t / k, g1 + (g2 - g1) * (t + 1) / k};
        run_jobs(expand_rows, (char *)jobs, sizeof(expand_job_t), k);
        g2 = g1;
    }
}

PyObject *plan_sorted_rows(PyObject *self, PyObject *args) {
    Py_buffer lens, keep = {0}, rkey, rows, ends, pairs, out, sums = {0};
    PyObject *keep_obj, *sums_obj = Py_None;
    int has_t, threads = 1;
    if (!PyArg_ParseTuple(args, "y*pOy*y*y*y*w*|iO", &lens, &has_t, &keep_obj, &rkey, &rows, &ends, &pairs, &out,
                          &threads, &sums_obj))
        return NULL;
    PyObject *result = NULL;
    int64_t *at = NULL, *offs = NULL, *acc = NULL;
    if (keep_obj != Py_None && PyObject_GetBuffer(keep_obj, &keep, PyBUF_SIMPLE) < 0)
        goto done;
    if (sums_obj != Py_None && PyObject_GetBuffer(sums_obj, &sums, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    const int64_t N = rows.len / 8, n = rkey.len / 2, S = ends.len / 8;
    if (lens.len != N * 8 || (keep.obj ? keep.len != n * 8 : n != N) || out.len != n * 24 || pairs.len != S * 8 ||
        S < 1 || ((const int64_t *)ends.buf)[S - 1] != N || (sums.obj && sums.len != S * 24)) {
        PyErr_SetString(PyExc_ValueError, "sorted_rows: mismatched argument lengths");
        goto done;
    }
    const int32_t *ln = lens.buf;
    const int64_t *kp = keep.obj ? keep.buf : NULL, *rw = rows.buf, *se = ends.buf, *sp = pairs.buf;
    const uint16_t *rk = rkey.buf;
    for (int64_t j = 0; kp && j < n; j++) {
        if (kp[j] < 0 || kp[j] >= N || (j && kp[j] <= kp[j - 1])) {
            PyErr_SetString(PyExc_ValueError, "sorted_rows: kept indices must ascend inside the window");
            goto done;
        }
    }
    if (n == 0) {
        if (sums.obj)
            memset(sums.buf, 0, (size_t)sums.len);
        result = Py_NewRef(Py_True);
        goto done;
    }
    /* The output (24 bytes a sample) holds the entries (16 bytes a sample) until the rows are written out; its
     * top third may hold the lengths (the planner reads them there: no buffer of their own), and is each thread's
     * sort space once they are scattered: memory written anyway instead of fresh allocations, whose first touch
     * costs more than the passes here on a VM that takes idle memory back. */
    const char *ob = out.buf, *lb = lens.buf;
#define OVERLAPS(b) ((b).obj && (const char *)(b).buf < ob + 24 * n && (const char *)(b).buf + (b).len > ob)
    if ((lb < ob + 16 * n && lb + lens.len > ob) || OVERLAPS(rows) || OVERLAPS(rkey) || OVERLAPS(keep) ||
        OVERLAPS(ends) || OVERLAPS(pairs) || OVERLAPS(sums)) {
        PyErr_SetString(PyExc_ValueError, "sorted_rows: the lengths may lie in the output's top third only, no "
                                          "other argument in it at all");
        goto done;
    }
#undef OVERLAPS
    const int parts = threads < 1 ? 1 : threads > 16 ? 16 : threads;
    if (sums.obj && !(acc = calloc((size_t)(parts * S * 3), sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    scatter_job_t jobs[16];
    for (int p = 0; p < parts; p++)
        jobs[p] = (scatter_job_t){(entry_t *)out.buf, NULL, rk, kp, rw, ln, n * p / parts, n * (p + 1) / parts,
                                  has_t, 1, 0, 0, acc ? acc + p * S * 3 : NULL, se, S};
    Py_BEGIN_ALLOW_THREADS
    run_jobs(check_part, (char *)jobs, sizeof(scatter_job_t), parts);
    Py_END_ALLOW_THREADS
    uint32_t orc = 0, ors = 0;
    int ok = N <= ((int64_t)1 << 32);
    for (int p = 0; p < parts; p++) {
        ok &= jobs[p].ok;
        orc |= jobs[p].orc;
        ors |= jobs[p].ors;
    }
    if (ok && acc) { /* every part's span sums, added up: the same integers whatever the thread count */
        int64_t *st = sums.buf;
        memset(st, 0, (size_t)sums.len);
        for (int p = 0; p < parts; p++)
            for (int64_t k = 0; k < 3 * S; k++)
                st[k] += acc[p * S * 3 + k];
    }
    const int cb = bit_length(orc), sb = has_t ? bit_length(ors) : 0;
    if (!ok || cb + sb > LENGTH_BITS) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    const int64_t nc = (int64_t)1 << cb, ns = (int64_t)1 << sb;
    at = calloc((size_t)nc + 1, sizeof(int64_t));
    offs = calloc((size_t)(parts * nc), sizeof(int64_t));
    if (!at || !offs) {
        PyErr_NoMemory();
        goto done;
    }
    for (int p = 0; p < parts; p++) /* each part's count of every cost */
        jobs[p].off = offs + p * nc;
    Py_BEGIN_ALLOW_THREADS
    run_jobs(count_part, (char *)jobs, sizeof(scatter_job_t), parts);
    Py_END_ALLOW_THREADS
    int64_t big = 0;
    for (int64_t c = 0, run = 0; c < nc; c++) { /* each part's first slot of cost c; at[c]: the end of cost c */
        const int64_t first = run;
        for (int p = 0; p < parts; p++) {
            const int64_t x = offs[p * nc + c];
            offs[p * nc + c] = run;
            run += x;
        }
        at[c] = run;
        big = run - first > big ? run - first : big;
    }
    /* The entries (16 bytes a sample) are scattered into the output's own memory (24 bytes a sample), sorted in
     * place cost by cost, and the rows written out from the last: row g overwrites entries g and above only, which
     * have been read by then. No other window-sized buffer. */
    uint64_t *o = out.buf;
    entry_t *v = (entry_t *)out.buf;
    int sorted;
    Py_BEGIN_ALLOW_THREADS
    run_jobs(scatter_costs, (char *)jobs, sizeof(scatter_job_t), parts);
    sorted = sort_all_costs(v, at, nc, ns, big, has_t, threads, v + n, n / 2); /* at[c]: the end of cost c */
    if (sorted == 0)
        expand_all(o, v, se, sp, S, n, threads);
    Py_END_ALLOW_THREADS
    if (sorted < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_True);
done:
    free(at);
    free(offs);
    free(acc);
    release_if(&sums);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&rkey);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&pairs);
    PyBuffer_Release(&out);
    release_if(&keep);
    return result;
}
