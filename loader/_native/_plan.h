/* What the three files of babelfeed's planning kernel share (_plan.c: the module and the draws; _plan_rows.c:
 * a window's lengths, order by LSD passes, reorder and cut; _plan_order.c: the order by buckets and a window's
 * rows written in that order). */
#ifndef BABELFEED_PLAN_H
#define BABELFEED_PLAN_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline int bit_length(uint64_t x) {
    int b = 0;
    while (x) {
        b++;
        x >>= 1;
    }
    return b;
}

static inline int known_code(char code) { return code && strchr("HhiIql", code) != NULL; }

static inline char code_of(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return f[1] ? 0 : *f;
}

typedef struct {
    const char *p;
    Py_ssize_t stride;
    int item;
} column_t;

/* a 1-D int32 or int64 array of any stride (the planner's int32 length columns, read in place) */
static inline int column_of(Py_buffer *b, column_t *c) {
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

/* Release a buffer that may not have been taken (its obj still NULL: an optional argument, or a failure before it) */
static inline void release_if(Py_buffer *b) {
    if (b->obj)
        PyBuffer_Release(b);
}

#define LENGTH_BITS 18 /* (cost, src) bits up to which the length order sorts by bucket (_plan_order.c) */
#define AHEAD 16        /* how many samples ahead random reads are prefetched */

int plan_bucket_order(const uint32_t *sc, int has_t, const uint16_t *rk, int64_t n, int sb, int ib, int64_t *o);
PyObject *plan_sorted_rows(PyObject *self, PyObject *args);
PyObject *plan_batch_ends(PyObject *self, PyObject *args);
PyObject *plan_deferred_cut(PyObject *self, PyObject *args);
PyObject *plan_length_order(PyObject *self, PyObject *args);
PyObject *plan_take_lengths(PyObject *self, PyObject *args);
PyObject *plan_take_rows(PyObject *self, PyObject *args);
PyObject *plan_pair_sizes(PyObject *self, PyObject *args);
PyObject *plan_stream_totals(PyObject *self, PyObject *args);

#endif
