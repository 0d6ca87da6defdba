/* Native box tests for boxwatch.agent.boxes: membership and distance to the nearest box.
 *
 * Optional: when this extension is not built, boxes.py does the same work with numpy.
 * Results are bit-identical to boxes.py's per-dimension numpy path: comparisons are exact,
 * and distances are accumulated in float32 in feature order (gap = clip(x) - x, gap * gap,
 * acc + gap; built with -ffp-contract=off so no fused multiply-add changes a rounding).
 * What makes it fast is stopping early: a box test stops at the first block of features
 * that leaves the box, an input stops at the first box that holds it, and a distance stops
 * once its partial sum reaches the best distance found so far (sums of squares only grow).
 * Only the Python C API and the buffer protocol are used (no numpy headers at build time);
 * the GIL is released while the loops run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 16 /* features tested between checks for an early exit */

typedef struct {
    Py_buffer x, y, lo, hi, offsets;
    Py_ssize_t n, d, n_boxes, n_classes;
} Args;

static void release(Args *a) {
    PyBuffer_Release(&a->x);
    PyBuffer_Release(&a->y);
    PyBuffer_Release(&a->lo);
    PyBuffer_Release(&a->hi);
    PyBuffer_Release(&a->offsets);
}

static int get(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous%s buffer", name,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}

/* A writable output buffer of exactly `len` bytes; releases `a` on failure. */
static int get_out(PyObject *obj, Py_buffer *view, const char *name, const char *unit,
                   Py_ssize_t len, Args *a) {
    if (get(obj, view, 1, name) < 0) { release(a); return -1; }
    if (view->len != len) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd bytes (one %s per input), not %zd",
                     name, len, unit, view->len);
        PyBuffer_Release(view);
        release(a);
        return -1;
    }
    return 0;
}

/* Parse (x, y, lo, hi, offsets, d) and check every size, so no loop can read out of bounds. */
static int parse(PyObject *const *argv, Args *a) {
    memset(a, 0, sizeof(*a));
    a->d = PyLong_AsSsize_t(argv[5]);
    if (a->d < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d must be >= 0");
        return -1;
    }
    if (get(argv[0], &a->x, 0, "x") < 0 || get(argv[1], &a->y, 0, "y") < 0 ||
        get(argv[2], &a->lo, 0, "lo") < 0 || get(argv[3], &a->hi, 0, "hi") < 0 ||
        get(argv[4], &a->offsets, 0, "offsets") < 0) {
        release(a);
        return -1;
    }
    Py_ssize_t row = a->d * (Py_ssize_t)sizeof(float);
    a->n = a->y.len / (Py_ssize_t)sizeof(int64_t);
    a->n_classes = a->offsets.len / (Py_ssize_t)sizeof(int64_t) - 1;
    a->n_boxes = row ? a->lo.len / row : 0;
    const char *bad = NULL;
    if (a->y.len % sizeof(int64_t) || a->x.len != a->n * row) bad = "x and y disagree on the number of inputs";
    else if (a->lo.len != a->hi.len || (row && a->lo.len % row)) bad = "lo and hi must both be (n_boxes, d)";
    else if (a->n_classes < 0) bad = "offsets must hold n_classes + 1 values";
    if (!bad) {
        const int64_t *off = (const int64_t *)a->offsets.buf;
        if (off[0] != 0 || off[a->n_classes] != a->n_boxes) bad = "offsets must run from 0 to n_boxes";
        for (Py_ssize_t c = 0; !bad && c < a->n_classes; c++)
            if (off[c + 1] < off[c]) bad = "offsets must not decrease";
        const int64_t *y = (const int64_t *)a->y.buf;
        for (Py_ssize_t i = 0; !bad && i < a->n; i++)
            if (y[i] < 0 || y[i] >= a->n_classes) {
                PyErr_Format(PyExc_ValueError, "predicted classes must lie in [0, %zd); input %zd has %lld",
                             a->n_classes, i, (long long)y[i]);
                release(a);
                return -1;
            }
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
        release(a);
        return -1;
    }
    return 0;
}

/* 1 when lo <= x <= hi in every feature (NaN is outside, as with numpy's comparisons). */
static int in_box(const float *x, const float *lo, const float *hi, Py_ssize_t d) {
    for (Py_ssize_t s = 0; s < d; s += BLOCK) {
        Py_ssize_t e = s + BLOCK < d ? s + BLOCK : d;
        int out = 0;
        for (Py_ssize_t j = s; j < e; j++) out |= !((x[j] >= lo[j]) & (x[j] <= hi[j]));
        if (out) return 0;
    }
    return 1;
}

static int in_any(const Args *a, Py_ssize_t i) {
    const float *x = (const float *)a->x.buf + i * a->d;
    const float *lo = (const float *)a->lo.buf, *hi = (const float *)a->hi.buf;
    const int64_t *off = (const int64_t *)a->offsets.buf;
    int64_t c = ((const int64_t *)a->y.buf)[i];
    for (int64_t k = off[c]; k < off[c + 1]; k++)
        if (in_box(x, lo + k * a->d, hi + k * a->d, a->d)) return 1;
    return 0;
}

/* Squared distance from x to one box, or a value >= best once it cannot be below best. */
static float box_distance2(const float *x, const float *lo, const float *hi, Py_ssize_t d, float best) {
    float acc = 0.0f;
    for (Py_ssize_t s = 0; s < d; s += BLOCK) {
        Py_ssize_t e = s + BLOCK < d ? s + BLOCK : d;
        for (Py_ssize_t j = s; j < e; j++) {
            float v = x[j];
            float clipped = v < lo[j] ? lo[j] : (v > hi[j] ? hi[j] : v);
            float gap = clipped - v;
            gap = gap * gap;
            acc = acc + gap;
        }
        if (acc >= best) return acc;
    }
    return acc;
}

static PyObject *contains(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 7) {
        PyErr_SetString(PyExc_TypeError, "contains(x, y, lo, hi, offsets, d, out)");
        return NULL;
    }
    Args a;
    Py_buffer out;
    if (parse(argv, &a) < 0 || get_out(argv[6], &out, "out", "byte", a.n, &a) < 0) return NULL;
    uint8_t *res = (uint8_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < a.n; i++) res[i] = (uint8_t)in_any(&a, i);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    release(&a);
    Py_RETURN_NONE;
}

static PyObject *distance_contains(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 8) {
        PyErr_SetString(PyExc_TypeError, "distance_contains(x, y, lo, hi, offsets, d, inside, dist)");
        return NULL;
    }
    Args a;
    Py_buffer inside, dist;
    if (parse(argv, &a) < 0 || get_out(argv[6], &inside, "inside", "byte", a.n, &a) < 0) return NULL;
    if (get_out(argv[7], &dist, "dist", "float64", a.n * (Py_ssize_t)sizeof(double), &a) < 0) {
        PyBuffer_Release(&inside);
        return NULL;
    }
    uint8_t *in = (uint8_t *)inside.buf;
    double *out = (double *)dist.buf;
    const float *lo = (const float *)a.lo.buf, *hi = (const float *)a.hi.buf;
    const int64_t *off = (const int64_t *)a.offsets.buf, *y = (const int64_t *)a.y.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < a.n; i++) {
        const float *x = (const float *)a.x.buf + i * a.d;
        in[i] = (uint8_t)in_any(&a, i);
        if (in[i]) { out[i] = 0.0; continue; }
        int nan = 0;
        for (Py_ssize_t j = 0; j < a.d; j++) nan |= isnan(x[j]);
        if (nan) { out[i] = off[y[i]] < off[y[i] + 1] ? NAN : INFINITY; continue; }
        float best = INFINITY;
        for (int64_t k = off[y[i]]; k < off[y[i] + 1]; k++) {
            float d2 = box_distance2(x, lo + k * a.d, hi + k * a.d, a.d, best);
            if (d2 < best) best = d2;
        }
        out[i] = sqrt((double)best);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&inside);
    PyBuffer_Release(&dist);
    release(&a);
    Py_RETURN_NONE;
}

/* The fused score's distances in one pass: membership in a box of class y[i], the distance
 * d_own to the nearest such box and, where 0 < d_own < inf, the distance d_other to the
 * nearest box of the "other" box set for class y[i] (its nearest other classes); d_other is
 * inf elsewhere, as the numpy path leaves it. Each input's row is read once while hot. */
static PyObject *fused_distances(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 12) {
        PyErr_SetString(PyExc_TypeError,
                        "fused_distances(x, y, lo, hi, offsets, d, olo, ohi, ooffsets, inside, "
                        "d_own, d_other)");
        return NULL;
    }
    Args a, o;
    PyObject *oargv[6] = {argv[0], argv[1], argv[6], argv[7], argv[8], argv[5]};
    if (parse(argv, &a) < 0) return NULL;
    if (parse(oargv, &o) < 0) { release(&a); return NULL; }
    if (o.n_classes != a.n_classes) {
        PyErr_SetString(PyExc_ValueError, "the other boxes must cover the same classes");
        release(&o);
        release(&a);
        return NULL;
    }
    Py_buffer inside, down, dother;
    if (get_out(argv[9], &inside, "inside", "byte", a.n, &a) < 0) { release(&o); return NULL; }
    if (get_out(argv[10], &down, "d_own", "float64", a.n * (Py_ssize_t)sizeof(double), &a) < 0) {
        PyBuffer_Release(&inside);
        release(&o);
        return NULL;
    }
    if (get_out(argv[11], &dother, "d_other", "float64", a.n * (Py_ssize_t)sizeof(double), &a) < 0) {
        PyBuffer_Release(&inside);
        PyBuffer_Release(&down);
        release(&o);
        return NULL;
    }
    uint8_t *in = (uint8_t *)inside.buf;
    double *own = (double *)down.buf, *other = (double *)dother.buf;
    const float *lo = (const float *)a.lo.buf, *hi = (const float *)a.hi.buf;
    const float *olo = (const float *)o.lo.buf, *ohi = (const float *)o.hi.buf;
    const int64_t *off = (const int64_t *)a.offsets.buf, *y = (const int64_t *)a.y.buf;
    const int64_t *ooff = (const int64_t *)o.offsets.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < a.n; i++) {
        const float *x = (const float *)a.x.buf + i * a.d;
        int64_t c = y[i];
        other[i] = INFINITY;
        in[i] = (uint8_t)in_any(&a, i);
        if (in[i]) { own[i] = 0.0; continue; }
        int nan = 0;
        for (Py_ssize_t j = 0; j < a.d; j++) nan |= isnan(x[j]);
        if (nan) { own[i] = off[c] < off[c + 1] ? NAN : INFINITY; continue; }
        float best = INFINITY;
        for (int64_t k = off[c]; k < off[c + 1]; k++) {
            float d2 = box_distance2(x, lo + k * a.d, hi + k * a.d, a.d, best);
            if (d2 < best) best = d2;
        }
        own[i] = sqrt((double)best);
        if (!(own[i] > 0.0 && own[i] < INFINITY)) continue;
        best = INFINITY;
        for (int64_t k = ooff[c]; k < ooff[c + 1]; k++) {
            float d2 = box_distance2(x, olo + k * a.d, ohi + k * a.d, a.d, best);
            if (d2 < best) best = d2;
        }
        other[i] = sqrt((double)best);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&inside);
    PyBuffer_Release(&down);
    PyBuffer_Release(&dother);
    release(&o);
    release(&a);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"contains", (PyCFunction)(void (*)(void))contains, METH_FASTCALL,
     "contains(x, y, lo, hi, offsets, d, out): out[i] = 1 when x[i] lies in a box of class y[i]."},
    {"distance_contains", (PyCFunction)(void (*)(void))distance_contains, METH_FASTCALL,
     "distance_contains(x, y, lo, hi, offsets, d, inside, dist): membership and Euclidean distance "
     "to the nearest box of class y[i] (0 inside, inf when the class has no box)."},
    {"fused_distances", (PyCFunction)(void (*)(void))fused_distances, METH_FASTCALL,
     "fused_distances(x, y, lo, hi, offsets, d, olo, ohi, ooffsets, inside, d_own, d_other): "
     "distance_contains plus the distance to the nearest 'other' box where 0 < d_own < inf."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_boxkernel",
    .m_doc = "Native box tests for boxwatch.agent.boxes.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__boxkernel(void) { return PyModule_Create(&module); }
