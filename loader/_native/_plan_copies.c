/* deferred_cut: batches over samples in plan order in which no row is twice (plan/copies.py's deferred_cut, whose
 * Python version is the reference: the same arrays, step for step). */
#include "_plan.h"

/* deferred_cut(row, cost, src, tgt, lim_src, lim_tgt, nrows, max_tokens, cap, multiple, order, ends)
 *   -> number of batches, or -1 on bad input
 *
 * row, cost, src, tgt, lim_src, lim_tgt: contiguous int64 of n samples (row ids in [0, nrows), costs in
 * [1, max_tokens]; a waiting sample joins a batch starting at sample i only within lim_src[i], lim_tgt[i]); order and ends:
 * contiguous int64 with room for n each. Waiting samples of a row form a list (next_ links, first/last per row);
 * the rows waiting form a ring of nrows slots (a row is in it at most once). */
#define RELEASE_ALL                                                                                                   \
    PyBuffer_Release(&row), PyBuffer_Release(&cost), PyBuffer_Release(&src), PyBuffer_Release(&tgt),                   \
        PyBuffer_Release(&lsrc), PyBuffer_Release(&ltgt), PyBuffer_Release(&order), PyBuffer_Release(&ends)

PyObject *plan_deferred_cut(PyObject *self, PyObject *args) {
    Py_buffer row, cost, src, tgt, lsrc, ltgt, order, ends;
    long long nrows, max_tokens, cap, multiple;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*LLLLw*w*", &row, &cost, &src, &tgt, &lsrc, &ltgt, &nrows, &max_tokens,
                          &cap, &multiple, &order, &ends))
        return NULL;
    int64_t n = row.len / 8, nb = 0;
    int ok = row.len == cost.len && row.len == src.len && row.len == tgt.len && row.len == lsrc.len &&
             row.len == ltgt.len && row.len % 8 == 0 && order.len >= row.len && ends.len >= row.len &&
             nrows >= 1 && cap >= 1 && multiple >= 1 && max_tokens >= 1;
    const int64_t *rw = row.buf, *co = cost.buf, *ss = src.buf, *ts = tgt.buf, *ls = lsrc.buf, *lt = ltgt.buf;
    int64_t *out = order.buf, *en = ends.buf;
    for (int64_t i = 0; ok && i < n; i++)
        ok = rw[i] >= 0 && rw[i] < nrows && co[i] >= 1 && co[i] <= max_tokens;
    int64_t *stamp = NULL, *first = NULL, *last = NULL, *next_ = NULL, *ring = NULL, *seen = NULL;
    if (ok) {
        stamp = malloc(nrows * sizeof(int64_t));
        first = malloc(nrows * sizeof(int64_t));
        last = malloc(nrows * sizeof(int64_t));
        ring = malloc(nrows * sizeof(int64_t));
        seen = malloc(nrows * sizeof(int64_t));
        next_ = malloc((n ? n : 1) * sizeof(int64_t));
        if (!stamp || !first || !last || !ring || !seen || !next_) {
            free(stamp), free(first), free(last), free(ring), free(seen), free(next_);
            RELEASE_ALL;
            return PyErr_NoMemory();
        }
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (int64_t r = 0; r < nrows; r++)
            stamp[r] = -1, first[r] = -1;
        int64_t head = 0, count = 0; /* the ring: count rows from slot head */
        int64_t back_from = 0, back_n = 0; /* samples given back: out[back_from .. back_from + back_n) */
        int64_t o = 0, i = 0, b = 0;
        while (i < n || count || back_n) {
            int64_t size = 0, width = 0;
            /* the given-back samples are already at out[o - ...]: they were cut off the end, so they are next */
            for (int64_t k = 0; k < back_n; k++) {
                int64_t x = out[back_from + k];
                out[o++] = x; /* back_from == o here: a no-op copy kept for clarity of order */
                stamp[rw[x]] = b, size++, width = co[x] > width ? co[x] : width;
            }
            back_n = 0;
            int drain = i >= n;
            int64_t most_s = drain ? ((int64_t)1 << 40) : ls[i], most_t = drain ? ((int64_t)1 << 40) : lt[i];
            int64_t ns = 0;
            while (count) {
                int64_t r = ring[head], x = first[r];
                int64_t w = co[x] > width ? co[x] : width;
                if (size >= cap || (size + 1) * w > max_tokens)
                    break;
                head = (head + 1) % nrows, count--;
                if ((stamp[r] == b && !drain) || ss[x] > most_s || ts[x] > most_t) {
                    seen[ns++] = r;
                    continue;
                }
                first[r] = next_[x];
                out[o++] = x;
                stamp[r] = b, size++, width = w;
                if (first[r] >= 0) {
                    if (drain) {
                        head = (head + nrows - 1) % nrows, count++;
                        ring[head] = r;
                    } else {
                        seen[ns++] = r;
                    }
                }
            }
            for (int64_t k = ns - 1; k >= 0; k--) { /* back to the front, in order */
                head = (head + nrows - 1) % nrows, count++;
                ring[head] = seen[k];
            }
            while (i < n && size < cap) {
                int64_t r = rw[i];
                if (stamp[r] == b) {
                    next_[i] = -1;
                    if (first[r] < 0) {
                        first[r] = i;
                        ring[(head + count) % nrows] = r, count++;
                    } else {
                        next_[last[r]] = i;
                    }
                    last[r] = i;
                    i++;
                    continue;
                }
                int64_t w = co[i] > width ? co[i] : width;
                if ((size + 1) * w > max_tokens)
                    break;
                out[o++] = i;
                stamp[r] = b, size++, width = w;
                i++;
            }
            if (size >= multiple && size % multiple) {
                back_n = size % multiple;
                o -= back_n;
                back_from = o;
            }
            en[nb++] = o;
            b++;
        }
        Py_END_ALLOW_THREADS
    }
    free(stamp), free(first), free(last), free(ring), free(seen), free(next_);
    RELEASE_ALL;
    return PyLong_FromLongLong(ok ? nb : -1);
}

/* stream_totals(direction, src, tgt, streams, out) -> bool
 *
 * out (contiguous int64 [3, streams], zeroed here) = per stream of ``direction``: samples, source tokens and target
 * tokens (plan/totals.py's window_totals, which numpy does in three bincounts over float copies: a tenth of a
 * window's planning). The three columns are int32 or int64 of any stride (the planner's sample rows, read in
 * place). False (numpy answers) for a stream outside [0, streams) or columns it does not read. */
PyObject *plan_stream_totals(PyObject *self, PyObject *args) {
    PyObject *d_obj, *s_obj, *t_obj, *o_obj;
    long long streams;
    if (!PyArg_ParseTuple(args, "OOOLO", &d_obj, &s_obj, &t_obj, &streams, &o_obj))
        return NULL;
    Py_buffer d = {0}, s = {0}, t = {0}, o = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(d_obj, &d, PyBUF_RECORDS_RO) < 0 || PyObject_GetBuffer(s_obj, &s, PyBUF_RECORDS_RO) < 0 ||
        PyObject_GetBuffer(t_obj, &t, PyBUF_RECORDS_RO) < 0 ||
        PyObject_GetBuffer(o_obj, &o, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    column_t dc, sc, tc;
    int ok = column_of(&d, &dc) && column_of(&s, &sc) && column_of(&t, &tc) && streams >= 0 &&
             s.shape[0] == d.shape[0] && t.shape[0] == d.shape[0] && o.len == 3 * 8 * streams;
    if (ok) {
        int64_t n = d.shape[0], *out = o.buf;
        Py_BEGIN_ALLOW_THREADS
        memset(out, 0, (size_t)o.len);
        /* a run of one stream is summed in registers and added once (a window of one direction, or of a few,
           would otherwise wait on the same three counters every sample) */
        int64_t run = 0, k = -1, ss = 0, ts = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t ki = column_get(&dc, i);
            if (ki != k || i == 0) { /* (the first sample checked too: k's start value could be a bad one) */
                if (ki < 0 || ki >= streams) {
                    ok = 0;
                    break;
                }
                if (k >= 0) {
                    out[k] += run;
                    out[streams + k] += ss;
                    out[2 * streams + k] += ts;
                }
                k = ki, run = ss = ts = 0;
            }
            run++;
            ss += column_get(&sc, i);
            ts += column_get(&tc, i);
        }
        if (ok && k >= 0) {
            out[k] += run;
            out[streams + k] += ss;
            out[2 * streams + k] += ts;
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(ok ? Py_True : Py_False);
done:
    release_if(&d);
    release_if(&s);
    release_if(&t);
    release_if(&o);
    return result;
}
