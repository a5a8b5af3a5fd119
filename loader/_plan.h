/* What the two files of babelfeed's planning kernel share (_plan.c: the module, the draws and the cut;
 * _plan_rows.c: a window's rows, their lengths, order and reorder). */
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

PyObject *plan_length_order(PyObject *self, PyObject *args);
PyObject *plan_take_lengths(PyObject *self, PyObject *args);
PyObject *plan_take_rows(PyObject *self, PyObject *args);

#endif
