/* babelfeed's optional gather kernel: rows and pieces of a token space copied into padded arrays.
 *
 * The numpy gather (gather.py) reads each row through a fancy index and then makes several passes over the
 * batch (cast, padding, prefixes). Here each output cell is written once, each token read once, and the rows
 * a few ahead are prefetched, so the random reads of a batch overlap instead of waiting one after another.
 * Every address is checked against the space before it is read: a bad one raises IndexError instead of reading
 * outside it. A read that faults anyway (a data file truncated in place by another process while mapped, or
 * storage that fails under the mapping: SIGBUS, which kills a process silently) is caught around the copy and
 * raised as MappedReadError with the byte offset of the fault in the space, for gather/engine.py to name the file.
 *
 * Built by setup.py as an optional extension; when it is missing, gather.py's numpy path gives the same arrays.
 * It also holds ``blend``, Megatron's greedy blend for blending.py (the same rule: numpy without it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <signal.h>
#include <setjmp.h>

#define PREFETCH_ROWS 64

/* The bus-error guard. A thread copying from a mapped space sets bus_jump; a SIGBUS raised by one of its reads
 * jumps back to the kernel, which raises MappedReadError instead of the process dying. Any other SIGBUS goes to
 * the handler that was there before (faulthandler's, torch's worker handler) or takes the default action. The
 * handler is put back in front at each call, as a handler installed later (faulthandler.enable(), a DataLoader
 * worker's) would otherwise hide it. The kernels hold the GIL, so installing needs no lock. */
static PyObject *MappedReadError;
static _Thread_local sigjmp_buf *bus_jump;
static _Thread_local uintptr_t bus_addr;
static struct sigaction bus_prev;

static void on_bus(int sig, siginfo_t *info, void *ctx) {
    sigjmp_buf *jump = bus_jump;
    if (jump) {
        bus_jump = NULL;
        bus_addr = info ? (uintptr_t)info->si_addr : 0;
        siglongjmp(*jump, 1);
    }
    if (bus_prev.sa_flags & SA_SIGINFO) {
        if (bus_prev.sa_sigaction) {
            bus_prev.sa_sigaction(sig, info, ctx);
            return;
        }
    } else if (bus_prev.sa_handler != SIG_DFL && bus_prev.sa_handler != SIG_IGN) {
        bus_prev.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL); /* delivered when this handler returns (or the read faults again): the default action */
    raise(sig);
}

static int bus_guard(void) {
    struct sigaction cur, mine;
    if (sigaction(SIGBUS, NULL, &cur) != 0)
        return -1;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_bus)
        return 0;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = on_bus;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    return sigaction(SIGBUS, &mine, &bus_prev);
}

/* Arm the guard for the copy that follows, or raise and `goto done`. A macro: sigsetjmp must run in the frame of
 * the function that copies. The copy ends with `bus_jump = NULL`. */
#define GUARD_COPY(jump, sp)                                                                                    \
    if (bus_guard() != 0) {                                                                                     \
        PyErr_SetFromErrno(PyExc_OSError);                                                                      \
        goto done;                                                                                              \
    }                                                                                                           \
    if (sigsetjmp(jump, 1)) {                                                                                   \
        bus_error(sp);                                                                                          \
        goto done;                                                                                              \
    }                                                                                                           \
    bus_jump = &(jump);

/* Raise MappedReadError(message, byte offset of the faulting address from the space's first byte) */
static void bus_error(const char *space) {
    long long at = (long long)(bus_addr - (uintptr_t)space);
    PyObject *err = Py_BuildValue("(sL)", "a read of mapped token data faulted (SIGBUS)", at);
    if (err) {
        PyErr_SetObject(MappedReadError, err);
        Py_DECREF(err);
    }
}

/* Every cache line of [p, p + bytes): a row's tokens may span several, and rows lie at random in a space of
 * gigabytes, so the reads of the next PREFETCH_ROWS rows are started before a row is copied (64 rows of a
 * [64, 128] batch: 14 us instead of 25 with one line 8 rows ahead, on random rows of a 640 MB space). */
static inline void prefetch_span(const char *p, int64_t bytes) {
    const char *end = p + (bytes > 0 ? bytes : 1);
    for (const char *q = (const char *)((uintptr_t)p & ~(uintptr_t)63); q < end; q += 64)
        __builtin_prefetch(q);
}

static int item_of(char code) {
    switch (code) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': return 4;
    case 'q': case 'Q': case 'l': case 'L': return 8;
    }
    return 0;
}

/* dst[k] = src[k] - shift for k < len, src of the space's type (a switch per row, a typed loop per token) */
#define COPY_AS(OT, dst, sp, at, len, code, shift)                                                              \
    switch (code) {                                                                                             \
    case 'b': { const int8_t *s_ = (const int8_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;       \
    case 'B': { const uint8_t *s_ = (const uint8_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;     \
    case 'h': { const int16_t *s_ = (const int16_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;     \
    case 'H': { const uint16_t *s_ = (const uint16_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;   \
    case 'i': { const int32_t *s_ = (const int32_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;     \
    case 'I': { const uint32_t *s_ = (const uint32_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;   \
    case 'q': case 'l': { const int64_t *s_ = (const int64_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)(s_[k_] - (shift)); } break; \
    default: { const uint64_t *s_ = (const uint64_t *)(sp) + (at); for (int64_t k_ = 0; k_ < (len); k_++) (dst)[k_] = (OT)((int64_t)s_[k_] - (shift)); } break;   \
    }

/* COPY_AS, also raising mx (uint64_t) to the largest value written, viewed as unsigned (a negative id is huge) */
#define COPY_MAX_T(IT, OT, dst, sp, at, len, shift, mx)                                                          \
    { const IT *s_ = (const IT *)(sp) + (at); uint64_t m_ = (mx);                                               \
      for (int64_t k_ = 0; k_ < (len); k_++) { int64_t v_ = (int64_t)s_[k_] - (shift); (dst)[k_] = (OT)v_;      \
          m_ = (uint64_t)v_ > m_ ? (uint64_t)v_ : m_; } (mx) = m_; }
#define COPY_MAX(OT, dst, sp, at, len, code, shift, mx)                                                         \
    switch (code) {                                                                                             \
    case 'b': COPY_MAX_T(int8_t, OT, dst, sp, at, len, shift, mx) break;                                        \
    case 'B': COPY_MAX_T(uint8_t, OT, dst, sp, at, len, shift, mx) break;                                       \
    case 'h': COPY_MAX_T(int16_t, OT, dst, sp, at, len, shift, mx) break;                                       \
    case 'H': COPY_MAX_T(uint16_t, OT, dst, sp, at, len, shift, mx) break;                                      \
    case 'i': COPY_MAX_T(int32_t, OT, dst, sp, at, len, shift, mx) break;                                       \
    case 'I': COPY_MAX_T(uint32_t, OT, dst, sp, at, len, shift, mx) break;                                      \
    case 'q': case 'l': COPY_MAX_T(int64_t, OT, dst, sp, at, len, shift, mx) break;                             \
    default: COPY_MAX_T(uint64_t, OT, dst, sp, at, len, shift, mx) break;                                       \
    }

/* fill_rows(space, code, shift, start, body, col0, plen, prefix, pmax, pad, out, out_code, prev, eos)
 *
 * Row r of out ([n, width], int64 'q' or int32 'i'): pad, then plen[r] prefix tokens at column col0[r], then
 * body[r] tokens read from space[start[r]:], then pad. Values read are reduced by shift. With ``prev`` (an
 * array like out, or None): fairseq's prev_output_tokens, each row's tokens shifted one column right behind
 * ``eos`` (an empty row stays all pad).
 * Returns the largest token id written (prefixes and tokens read, not pad), as unsigned: a negative id counts as
 * huge, so one comparison with the dictionary's size checks every id of the rows. Raises IndexError naming the
 * first row whose tokens lie outside the space. */
static PyObject *fill_rows(PyObject *self, PyObject *args) {
    Py_buffer space, start, body, col0, plen, prefix, out, prev = {0};
    int code, out_code;
    long long shift, pmax, pad, eos;
    PyObject *prev_obj;
    if (!PyArg_ParseTuple(args, "y*CLy*y*y*y*y*LLw*COL", &space, &code, &shift, &start, &body, &col0, &plen,
                          &prefix, &pmax, &pad, &out, &out_code, &prev_obj, &eos))
        return NULL;
    PyObject *result = NULL;
    if (prev_obj != Py_None && PyObject_GetBuffer(prev_obj, &prev, PyBUF_WRITABLE) < 0)
        goto done;
    int item = item_of((char)code);
    int64_t n = start.len / 8;
    if (!item || (out_code != 'q' && out_code != 'i') || body.len != start.len ||
        col0.len != start.len || plen.len != start.len || prefix.len != n * pmax * 8) {
        PyErr_SetString(PyExc_ValueError, "fill_rows: unsupported dtype or mismatched argument lengths");
        goto done;
    }
    int oitem = out_code == 'q' ? 8 : 4;
    int64_t width = n ? (int64_t)(out.len / oitem / n) : 0;
    if ((n && out.len != n * width * oitem) || (prev.obj && prev.len != out.len)) {
        PyErr_SetString(PyExc_ValueError, "fill_rows: output is not [rows, width]");
        goto done;
    }
    const char *sp = (const char *)space.buf;
    int64_t space_len = space.len / item;
    const int64_t *st = start.buf, *bd = body.buf, *c0 = col0.buf, *pl = plen.buf, *pre = prefix.buf;
    for (int64_t r = 0; r < n; r++) {
        if (st[r] < 0 || bd[r] < 0 || st[r] + bd[r] > space_len || c0[r] < 0 || pl[r] < 0 || pl[r] > pmax ||
            c0[r] + pl[r] + bd[r] > width) {
            PyErr_Format(PyExc_IndexError, "row %lld: tokens [%lld, +%lld) at column %lld + %lld do not fit the "
                         "%lld-token space or the %lld-wide row", (long long)r, (long long)st[r], (long long)bd[r],
                         (long long)c0[r], (long long)pl[r], (long long)space_len, (long long)width);
            goto done;
        }
    }
    uint64_t mx = 0;
    sigjmp_buf jump;
    GUARD_COPY(jump, sp)
    for (int64_t r = 0; r < n && r < PREFETCH_ROWS; r++)
        prefetch_span(sp + st[r] * item, bd[r] * item);
    for (int64_t r = 0; r < n; r++) {
        if (r + PREFETCH_ROWS < n)
            prefetch_span(sp + st[r + PREFETCH_ROWS] * item, bd[r + PREFETCH_ROWS] * item);
        int64_t a = c0[r], p = pl[r], b = bd[r];
        const int64_t *pr = pre + r * pmax;
        if (oitem == 8) {
            int64_t *o = (int64_t *)out.buf + r * width;
            for (int64_t c = 0; c < a; c++) o[c] = pad;
            for (int64_t k = 0; k < p; k++) {
                o[a + k] = pr[k];
                mx = (uint64_t)pr[k] > mx ? (uint64_t)pr[k] : mx;
            }
            int64_t *ob = o + a + p;
            COPY_MAX(int64_t, ob, sp, st[r], b, code, shift, mx)
            for (int64_t c = a + p + b; c < width; c++) o[c] = pad;
            if (prev.obj) {
                int64_t *q = (int64_t *)prev.buf + r * width, t = p + b;
                for (int64_t c = 0; c < width; c++) q[c] = pad;
                if (t) {
                    q[a] = eos;
                    memcpy(q + a + 1, o + a, (size_t)(t - 1) * 8);
                }
            }
        } else {
            int32_t *o = (int32_t *)out.buf + r * width;
            for (int64_t c = 0; c < a; c++) o[c] = (int32_t)pad;
            for (int64_t k = 0; k < p; k++) {
                o[a + k] = (int32_t)pr[k];
                mx = (uint64_t)pr[k] > mx ? (uint64_t)pr[k] : mx;
            }
            int32_t *ob = o + a + p;
            COPY_MAX(int32_t, ob, sp, st[r], b, code, shift, mx)
            for (int64_t c = a + p + b; c < width; c++) o[c] = (int32_t)pad;
            if (prev.obj) {
                int32_t *q = (int32_t *)prev.buf + r * width;
                int64_t t = p + b;
                for (int64_t c = 0; c < width; c++) q[c] = (int32_t)pad;
                if (t) {
                    q[a] = (int32_t)eos;
                    memcpy(q + a + 1, o + a, (size_t)(t - 1) * 4);
                }
            }
        }
    }
    bus_jump = NULL;
    result = PyLong_FromUnsignedLongLong(mx);
done:
    PyBuffer_Release(&space); PyBuffer_Release(&start); PyBuffer_Release(&body); PyBuffer_Release(&col0);
    PyBuffer_Release(&plen); PyBuffer_Release(&prefix); PyBuffer_Release(&out);
    if (prev.obj)
        PyBuffer_Release(&prev);
    return result;
}

/* pieces(space, code, shift, start, length, dest, out, out_code)
 *
 * For every piece k: out[dest[k] : dest[k] + length[k]] = space[start[k] : start[k] + length[k]] - shift, out
 * being int64 ('q') or int32 ('i'). Raises IndexError for a piece outside the space or the output. */
static PyObject *pieces(PyObject *self, PyObject *args) {
    Py_buffer space, start, length, dest, out;
    int code, out_code;
    long long shift;
    if (!PyArg_ParseTuple(args, "y*CLy*y*y*w*C", &space, &code, &shift, &start, &length, &dest, &out, &out_code))
        return NULL;
    PyObject *result = NULL;
    int item = item_of((char)code);
    int64_t n = start.len / 8;
    if (!item || length.len != start.len || dest.len != start.len || (out_code != 'q' && out_code != 'i')) {
        PyErr_SetString(PyExc_ValueError, "pieces: unsupported dtype or mismatched argument lengths");
        goto done;
    }
    const char *sp = (const char *)space.buf;
    int oitem = out_code == 'q' ? 8 : 4;
    int64_t space_len = space.len / item, out_len = out.len / oitem;
    const int64_t *st = start.buf, *ln = length.buf, *ds = dest.buf;
    for (int64_t k = 0; k < n; k++) {
        if (st[k] < 0 || ln[k] < 0 || st[k] + ln[k] > space_len || ds[k] < 0 || ds[k] + ln[k] > out_len) {
            PyErr_Format(PyExc_IndexError, "piece %lld: tokens [%lld, +%lld) to [%lld, ...) lie outside the "
                         "%lld-token space or the %lld-token output", (long long)k, (long long)st[k],
                         (long long)ln[k], (long long)ds[k], (long long)space_len, (long long)out_len);
            goto done;
        }
    }
    sigjmp_buf jump;
    GUARD_COPY(jump, sp)
    for (int64_t k = 0; k < n && k < PREFETCH_ROWS; k++)
        prefetch_span(sp + st[k] * item, ln[k] * item);
    for (int64_t k = 0; k < n; k++) {
        if (k + PREFETCH_ROWS < n)
            prefetch_span(sp + st[k + PREFETCH_ROWS] * item, ln[k + PREFETCH_ROWS] * item);
        if (oitem == 8) {
            int64_t *dst = (int64_t *)out.buf + ds[k];
            COPY_AS(int64_t, dst, sp, st[k], ln[k], code, shift)
        } else {
            int32_t *dst = (int32_t *)out.buf + ds[k];
            COPY_AS(int32_t, dst, sp, st[k], ln[k], code, shift)
        }
    }
    bus_jump = NULL;
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&space); PyBuffer_Release(&start); PyBuffer_Release(&length); PyBuffer_Release(&dest);
    PyBuffer_Release(&out);
    return result;
}

/* fence(): a full memory barrier, for the shared-memory handshakes of worker processes (adapters/torch.py). */
static PyObject *fence(PyObject *self, PyObject *unused) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* blend(weights, megatron, dataset, sample, portable=False): Megatron's greedy blend (build_blending_indices,
 * helpers.cpp).
 *
 * weights: float64[k] (normalised by blending.py); dataset: int16[size] and sample: int64[size], written. Sample s
 * goes to argmax_i (w_i * x - count_i), the lowest i on ties, with x = max(s, 1) (megatron) or s + 1; every error
 * is the same double-precision expression as Megatron's (setup.py builds with -ffp-contract=off: no fused
 * multiply-add), so the arrays are bit-identical. Counts are kept as doubles (exact below 2^53 samples).
 * The loop is O(size * k): two datasets need no scan (branch-free), a few are scanned in C, and from
 * BLEND_WIDE datasets on x86-64 with AVX2 the errors of four datasets are computed at once, the maximum taken
 * lane-wise, and the first dataset holding it found from comparison masks. Each step waits on the count the
 * step before changed, so below ~12 datasets the latency of that chain, not the scan, sets the speed.
 * portable=True never takes the AVX2 path (for tests of the others). Runs without the GIL. */
#define BLEND_X(s, megatron) ((megatron) ? ((s) > 1 ? (double)(s) : 1.0) : (double)(s) + 1.0)
#define BLEND_CMOV 7 /* measured on x86-64: the two-pass scan wins below, conditional moves above */
#define BLEND_WIDE 12

static void blend_two(const double *w, int megatron, int64_t n, int16_t *ds, int64_t *smp) {
    double w0 = w[0], w1 = w[1];
    int64_t c1 = 0;
    for (int64_t s = 0; s < n; s++) {
        double x = BLEND_X(s, megatron);
        int64_t b = w1 * x - (double)c1 > w0 * x - (double)(s - c1); /* strict: dataset 0 wins ties */
        ds[s] = (int16_t)b;
        smp[s] = b ? c1 : s - c1;
        c1 += b;
    }
}

/* A few datasets: the errors, their maximum, then the first dataset holding it. */
static void blend_scan(const double *w, int64_t k, int megatron, int64_t n, int16_t *ds, int64_t *smp, double *c,
                       double *e) {
    for (int64_t s = 0; s < n; s++) {
        double x = BLEND_X(s, megatron);
        for (int64_t i = 0; i < k; i++)
            e[i] = w[i] * x - c[i];
        double m = e[0];
        for (int64_t i = 1; i < k; i++)
            m = e[i] > m ? e[i] : m; /* errors are never NaN */
        int64_t b = 0;
        while (b < k - 1 && e[b] != m) /* bounded: a NaN weight (refused by the caller) cannot run past e */
            b++;
        ds[s] = (int16_t)b;
        smp[s] = (int64_t)c[b];
        c[b] += 1.0;
    }
}

/* More: one pass, a strict '>' scan compiled to conditional moves (no mispredicted branch per dataset). */
static void blend_cmov(const double *w, int64_t k, int megatron, int64_t n, int16_t *ds, int64_t *smp, double *c) {
    for (int64_t s = 0; s < n; s++) {
        double x = BLEND_X(s, megatron), best_err = w[0] * x - c[0];
        int64_t b = 0;
        for (int64_t i = 1; i < k; i++) {
            double err = w[i] * x - c[i];
            int more = err > best_err;
            b = more ? i : b;
            best_err = more ? err : best_err;
        }
        ds[s] = (int16_t)b;
        smp[s] = (int64_t)c[b];
        c[b] += 1.0;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BLEND_AVX2 1
/* Many, with AVX2: k padded to kp (a multiple of 16) with weight 0 and count 1e300, never the maximum. Four
 * running maxima of four lanes; the first dataset equal to the maximum from comparison masks, 64 at a time. */
__attribute__((target("avx2"))) static void blend_avx2(const double *w, int64_t kp, int megatron, int64_t n,
                                                         int16_t *ds, int64_t *smp, double *c, double *e) {
    static const double one[16] __attribute__((aligned(32))) = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
    for (int64_t s = 0; s < n; s++) {
        __m256d xv = _mm256_set1_pd(BLEND_X(s, megatron)), m[4];
        for (int j = 0; j < 4; j++)
            m[j] = _mm256_set1_pd(-INFINITY);
        for (int64_t i = 0; i < kp; i += 16) {
            for (int j = 0; j < 4; j++) {
                int64_t at = i + 4 * j;
                __m256d err = _mm256_sub_pd(_mm256_mul_pd(_mm256_load_pd(w + at), xv), _mm256_load_pd(c + at));
                _mm256_store_pd(e + at, err);
                m[j] = _mm256_max_pd(m[j], err);
            }
        }
        __m256d m4 = _mm256_max_pd(_mm256_max_pd(m[0], m[1]), _mm256_max_pd(m[2], m[3]));
        __m128d h = _mm_max_pd(_mm256_castpd256_pd128(m4), _mm256_extractf128_pd(m4, 1));
        __m256d mv = _mm256_broadcastsd_pd(_mm_max_sd(h, _mm_unpackhi_pd(h, h)));
        int64_t b = 0;
        for (int64_t i = 0;; i += 64) {
            uint64_t mask = 0;
            int64_t top = kp - i < 64 ? kp - i : 64;
            for (int64_t j = 0; j < top; j += 4)
                mask |= (uint64_t)_mm256_movemask_pd(_mm256_cmp_pd(_mm256_load_pd(e + i + j), mv, _CMP_EQ_OQ)) << j;
            if (mask) {
                b = i + __builtin_ctzll(mask);
                break;
            }
        }
        int64_t base = b & ~(int64_t)3; /* counts updated as a vector: the next loads forward from this store */
        __m256d cv = _mm256_load_pd(c + base);
        ds[s] = (int16_t)b;
        smp[s] = (int64_t)c[b];
        _mm256_store_pd(c + base, _mm256_add_pd(cv, _mm256_load_pd(one + 4 * (b - base))));
    }
}
#endif

static PyObject *blend(PyObject *self, PyObject *args) {
    Py_buffer weights, dataset, sample;
    int megatron, portable = 0;
    if (!PyArg_ParseTuple(args, "y*pw*w*|p", &weights, &megatron, &dataset, &sample, &portable))
        return NULL;
    PyObject *result = NULL;
    double *work = NULL;
    int64_t k = weights.len / 8, n = dataset.len / 2;
    if (k < 1 || k > 32767 || weights.len != k * 8 || dataset.len != n * 2 || sample.len != n * 8 ||
        n > ((int64_t)1 << 53)) {
        PyErr_SetString(PyExc_ValueError, "blend: 1 to 32767 float64 weights, int16 and int64 outputs of one size");
        goto done;
    }
    const double *w = weights.buf;
    int16_t *ds = dataset.buf;
    int64_t *smp = sample.buf;
    int64_t kp = (k + 15) & ~(int64_t)15;
    int wide = 0;
#ifdef BLEND_AVX2
    wide = k >= BLEND_WIDE && !portable && __builtin_cpu_supports("avx2");
#endif
    if (k > 2) { /* three padded arrays of kp doubles, 32-byte aligned: weights, counts, errors */
        work = PyMem_Calloc((size_t)(3 * kp + 4), sizeof(double));
        if (!work) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    if (k == 1) {
        for (int64_t s = 0; s < n; s++) {
            ds[s] = 0;
            smp[s] = s;
        }
    } else if (k == 2) {
        blend_two(w, megatron, n, ds, smp);
    } else {
        double *ww = (double *)(((uintptr_t)work + 31) & ~(uintptr_t)31), *c = ww + kp, *e = c + kp;
        memcpy(ww, w, (size_t)k * sizeof(double));
        if (wide) {
#ifdef BLEND_AVX2
            for (int64_t i = k; i < kp; i++)
                c[i] = 1e300;
            blend_avx2(ww, kp, megatron, n, ds, smp, c, e);
#endif
        } else if (k < BLEND_CMOV) {
            blend_scan(ww, k, megatron, n, ds, smp, c, e);
        } else {
            blend_cmov(ww, k, megatron, n, ds, smp, c);
        }
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(work);
    PyBuffer_Release(&weights); PyBuffer_Release(&dataset); PyBuffer_Release(&sample);
    return result;
}

static PyMethodDef methods[] = {
    {"blend", blend, METH_VARARGS, "Megatron's greedy blend: dataset and sample indices written in place."},
    {"fence", fence, METH_NOARGS, "A full memory barrier."},
    {"fill_rows", fill_rows, METH_VARARGS, "Padded rows of prefix + tokens from a token space."},
    {"pieces", pieces, METH_VARARGS, "Pieces of a token space written at flat offsets of an int64 array."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gather", "babelfeed's optional gather kernel.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__gather(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    MappedReadError = PyErr_NewExceptionWithDoc(
        "babelfeed._native._gather.MappedReadError",
        "A read of mapped token data faulted (SIGBUS): args are (message, byte offset in the space).", PyExc_OSError,
        NULL);
    if (!MappedReadError || PyModule_AddObjectRef(m, "MappedReadError", MappedReadError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
