/* Native box tests for boxwatch.agent.boxes: membership and distance to the nearest box.
 *
 * Optional: when this extension is not built, boxes.py does the same work with numpy.
 * Results are bit-identical to boxes.py's per-dimension numpy path: comparisons are exact,
 * and distances are accumulated in float32 in feature order (gap = clip(x) - x, gap * gap,
 * acc + gap; built with -ffp-contract=off so no fused multiply-add changes a rounding).
 * What makes it fast is stopping early: a box test stops at the first block of features
 * that leaves the box, an input stops at the first box that holds it, and a distance stops
 * once its partial sum reaches the best distance found so far (sums of squares only grow).
 * Distances take LANES boxes at once from a transposed copy of each class's boxes (tlo, thi:
 * per block of up to LANES boxes, (n_features, boxes) floats, see lanes_min): each lane keeps
 * its own sum over the features in feature order, so the compiler vectorises across boxes
 * (SSE2 on x86-64, NEON on aarch64) and every sum rounds exactly as the one-box-at-a-time
 * loop does; the nearest box is the smallest sum whatever the order the boxes are visited in.
 * Only the Python C API and the buffer protocol are used (no numpy headers at build time);
 * the GIL is released while the loops run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 16 /* features tested between checks for an early exit */
#define LANES 8 /* boxes whose distances are accumulated side by side */

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

/* The transposed copy (tlo, thi) of the boxes: both n_boxes * d + LANES floats (see
 * lanes_min). Returns 0, or -1 with an exception set and nothing held. */
static int get_lanes(PyObject *tlo_obj, PyObject *thi_obj, Py_buffer *tlo, Py_buffer *thi,
                     Py_ssize_t n_boxes, Py_ssize_t d) {
    if (get(tlo_obj, tlo, 0, "tlo") < 0) return -1;
    if (get(thi_obj, thi, 0, "thi") < 0) { PyBuffer_Release(tlo); return -1; }
    if (tlo->len != thi->len || tlo->len != (n_boxes * d + LANES) * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError,
                     "tlo and thi must both hold n_boxes * d + %d float32 (the boxes by blocks "
                     "of %d, transposed)", LANES, LANES);
        PyBuffer_Release(tlo);
        PyBuffer_Release(thi);
        return -1;
    }
    return 0;
}

/* Lanes accumulate in vectors of 4 floats: GCC and Clang vector extensions (SSE2 on x86-64,
 * NEON on aarch64, plain code elsewhere); other compilers take the same steps lane by lane.
 * Either way each lane does exactly the one-box loop's operations on its own sum. */
#if defined(__GNUC__) || defined(__clang__)
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));
#define NV (LANES / 4)

#if defined(__SSE2__)
#include <emmintrin.h>
/* v < lo ? lo : v, then > hi ? hi : v, per lane: maxps(a, b) is a > b ? a : b and minps(a, b)
 * is a < b ? a : b, exactly (no NaN reaches here) */
static inline vf4 clip4(vf4 v, vf4 lo, vf4 hi) {
    return (vf4)_mm_min_ps((__m128)hi, _mm_max_ps((__m128)lo, (__m128)v));
}
#else
/* m ? a : b per lane */
static inline vf4 pick(vi4 m, vf4 a, vf4 b) { return (vf4)((m & (vi4)a) | (~m & (vi4)b)); }
static inline vf4 clip4(vf4 v, vf4 lo, vf4 hi) {
    vf4 clipped = pick(v < lo, lo, v);
    return pick(clipped > hi, hi, clipped);
}
#endif

/* acc[k] += (clip(v, lo, hi) - v)^2 for the 4 lanes of vector k */
static inline void lanes_step(vf4 *acc, float xj, const float *lo, const float *hi) {
    const vf4 v = {xj, xj, xj, xj};
    for (int k = 0; k < NV; k++) {
        vf4 l, h;
        memcpy(&l, lo + 4 * k, sizeof l);
        memcpy(&h, hi + 4 * k, sizeof h);
        vf4 gap = clip4(v, l, h) - v;
        gap = gap * gap;
        acc[k] = acc[k] + gap;
    }
}
#define LANES_ACC vf4 acc_v[NV] = {{0}}
#define LANES_AT(l) (acc_v[(l) / 4][(l) % 4])
#define LANES_STEP(xj, lo, hi) lanes_step(acc_v, (xj), (lo), (hi))
#else
#define LANES_ACC float acc_v[LANES] = {0}
#define LANES_AT(l) (acc_v[l])
#define LANES_STEP(xj, lo, hi)                                                                 \
    do {                                                                                       \
        const float v_ = (xj);                                                                 \
        for (int l_ = 0; l_ < LANES; l_++) {                                                   \
            float clipped = v_ < (lo)[l_] ? (lo)[l_] : v_;                                     \
            clipped = clipped > (hi)[l_] ? (hi)[l_] : clipped;                                 \
            float gap = clipped - v_;                                                          \
            gap = gap * gap;                                                                   \
            acc_v[l_] = acc_v[l_] + gap;                                                       \
        }                                                                                      \
    } while (0)
#endif

/* Smallest squared distance from x to the `count` boxes of one class, LANES boxes at a time
 * from their transposed copy, or `best` when none is smaller. The copy holds the class's
 * boxes where lo holds them (from box offsets[c], times d floats), by blocks of LANES boxes
 * (the last one narrower: `live` boxes), each block (d, live) floats: feature j of the
 * block's box l at j * live + l, so no float is padding and a class of a few boxes reads
 * a few boxes' worth. A narrower block's vector loads read past its boxes (the next
 * features, or the LANES floats closing the copy): those lanes start at inf and stay at inf
 * or NaN, never nearest. A block stops once every lane's partial
 * sum reaches best (NaN sums, from inf - inf, never count as nearest and never stop a
 * block, as in the one-box loop). */
static float lanes_min(const float *x, const float *tlo, const float *thi, Py_ssize_t d,
                       int64_t count, float best) {
    for (int64_t b = 0; b * LANES < count; b++) {
        const float *blo = tlo + b * d * LANES, *bhi = thi + b * d * LANES;
        int64_t live = count - b * LANES < LANES ? count - b * LANES : LANES;
        LANES_ACC;
        for (int l = 0; l < LANES; l++) LANES_AT(l) = l < live ? 0.0f : INFINITY;
        for (Py_ssize_t s = 0; s < d; s += BLOCK) {
            Py_ssize_t e = s + BLOCK < d ? s + BLOCK : d;
            for (Py_ssize_t j = s; j < e; j++) LANES_STEP(x[j], blo + j * live, bhi + j * live);
            int open = 0;
            for (int l = 0; l < LANES; l++) open |= !(LANES_AT(l) >= best);
            if (!open) break;
        }
        for (int l = 0; l < LANES; l++)
            if (LANES_AT(l) < best) best = LANES_AT(l);
    }
    return best;
}

/* distance_contains's work: membership and distance to the nearest box of class y[i]. */
static void distance_loop(const Args *a, const float *tl, const float *th, uint8_t *in,
                          double *out) {
    const int64_t *off = (const int64_t *)a->offsets.buf, *y = (const int64_t *)a->y.buf;
    for (Py_ssize_t i = 0; i < a->n; i++) {
        const float *x = (const float *)a->x.buf + i * a->d;
        int64_t c = y[i];
        in[i] = (uint8_t)in_any(a, i);
        if (in[i]) { out[i] = 0.0; continue; }
        int nan = 0;
        for (Py_ssize_t j = 0; j < a->d; j++) nan |= isnan(x[j]);
        if (nan) { out[i] = off[c] < off[c + 1] ? NAN : INFINITY; continue; }
        float best = lanes_min(x, tl + off[c] * a->d, th + off[c] * a->d, a->d,
                               off[c + 1] - off[c], INFINITY);
        out[i] = sqrt((double)best);
    }
}

/* fused_distances's work: distance_loop's, plus d_other where 0 < d_own < inf: the distance
 * to the other set's boxes of class y[i], or of class ocls[y[i]] when ocls is given (-1:
 * none, d_other inf). */
static void fused_loop(const Args *a, const Args *o, const float *tl, const float *th,
                       const float *otl, const float *oth, const int64_t *ocls, uint8_t *in,
                       double *own, double *other) {
    const int64_t *off = (const int64_t *)a->offsets.buf, *y = (const int64_t *)a->y.buf;
    const int64_t *ooff = (const int64_t *)o->offsets.buf;
    for (Py_ssize_t i = 0; i < a->n; i++) {
        const float *x = (const float *)a->x.buf + i * a->d;
        int64_t c = y[i];
        other[i] = INFINITY;
        in[i] = (uint8_t)in_any(a, i);
        if (in[i]) { own[i] = 0.0; continue; }
        int nan = 0;
        for (Py_ssize_t j = 0; j < a->d; j++) nan |= isnan(x[j]);
        if (nan) { own[i] = off[c] < off[c + 1] ? NAN : INFINITY; continue; }
        float best = lanes_min(x, tl + off[c] * a->d, th + off[c] * a->d, a->d,
                               off[c + 1] - off[c], INFINITY);
        own[i] = sqrt((double)best);
        if (!(own[i] > 0.0 && own[i] < INFINITY)) continue;
        int64_t oc = ocls ? ocls[c] : c;
        if (oc < 0) continue;
        best = lanes_min(x, otl + ooff[oc] * a->d, oth + ooff[oc] * a->d, a->d,
                         ooff[oc + 1] - ooff[oc], INFINITY);
        other[i] = sqrt((double)best);
    }
}

static PyObject *contains(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 7 && argc != 8) {
        PyErr_SetString(PyExc_TypeError, "contains(x, y, lo, hi, offsets, d, out[, where])");
        return NULL;
    }
    Args a;
    Py_buffer out, where = {0};
    if (parse(argv, &a) < 0 || get_out(argv[6], &out, "out", "byte", a.n, &a) < 0) return NULL;
    if (argc == 8) {
        if (get(argv[7], &where, 0, "where") < 0) {
            PyBuffer_Release(&out);
            release(&a);
            return NULL;
        }
        if (where.len != a.n) {
            PyErr_Format(PyExc_ValueError, "where must hold %zd bytes (one per input), not %zd",
                         a.n, where.len);
            PyBuffer_Release(&where);
            PyBuffer_Release(&out);
            release(&a);
            return NULL;
        }
    }
    uint8_t *res = (uint8_t *)out.buf;
    const uint8_t *only = (const uint8_t *)where.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < a.n; i++) res[i] = (uint8_t)((!only || only[i]) && in_any(&a, i));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&where);
    PyBuffer_Release(&out);
    release(&a);
    Py_RETURN_NONE;
}

static PyObject *distance_contains(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "distance_contains(x, y, lo, hi, offsets, d, inside, dist, tlo, thi)");
        return NULL;
    }
    Args a;
    Py_buffer inside, dist, tlo, thi;
    if (parse(argv, &a) < 0 || get_out(argv[6], &inside, "inside", "byte", a.n, &a) < 0) return NULL;
    if (get_out(argv[7], &dist, "dist", "float64", a.n * (Py_ssize_t)sizeof(double), &a) < 0) {
        PyBuffer_Release(&inside);
        return NULL;
    }
    if (get_lanes(argv[8], argv[9], &tlo, &thi, a.n_boxes, a.d) < 0) {
        PyBuffer_Release(&inside);
        PyBuffer_Release(&dist);
        release(&a);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    distance_loop(&a, (const float *)tlo.buf, (const float *)thi.buf, (uint8_t *)inside.buf,
                  (double *)dist.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&tlo);
    PyBuffer_Release(&thi);
    PyBuffer_Release(&inside);
    PyBuffer_Release(&dist);
    release(&a);
    Py_RETURN_NONE;
}

/* The fused score's distances in one pass: membership in a box of class y[i], the distance
 * d_own to the nearest such box and, where 0 < d_own < inf, the distance d_other to the
 * nearest box of the "other" box set for class y[i] (its nearest other classes), or, given
 * ocls (one int64 per class), for class ocls[y[i]] (the other set may then be the boxes
 * themselves: no copy of a neighbour's boxes); d_other is inf elsewhere, as the numpy path
 * leaves it. Each input's row is read once while hot. */
static PyObject *fused_distances(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 16 && argc != 17) {
        PyErr_SetString(PyExc_TypeError,
                        "fused_distances(x, y, lo, hi, offsets, d, olo, ohi, ooffsets, inside, "
                        "d_own, d_other, tlo, thi, otlo, othi[, ocls])");
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
    Py_buffer inside = {0}, down = {0}, dother = {0}, tlo = {0}, thi = {0}, otlo = {0}, othi = {0};
    Py_buffer remap = {0};
    Py_ssize_t bytes = a.n * (Py_ssize_t)sizeof(double);
    if (argc == 17) {
        const char *bad = NULL;
        if (get(argv[16], &remap, 0, "ocls") < 0) { release(&o); release(&a); return NULL; }
        if (remap.len != a.n_classes * (Py_ssize_t)sizeof(int64_t))
            bad = "ocls must hold one int64 per class";
        for (Py_ssize_t c = 0; !bad && c < a.n_classes; c++) {
            int64_t oc = ((const int64_t *)remap.buf)[c];
            if (oc < -1 || oc >= o.n_classes) bad = "ocls must hold classes of the other boxes or -1";
        }
        if (bad) {
            PyErr_SetString(PyExc_ValueError, bad);
            PyBuffer_Release(&remap);
            release(&o);
            release(&a);
            return NULL;
        }
    }
    if (get_out(argv[9], &inside, "inside", "byte", a.n, &a) < 0) {
        PyBuffer_Release(&remap);
        release(&o);
        return NULL;
    }
    if (get_out(argv[10], &down, "d_own", "float64", bytes, &a) < 0) goto fail_inside;
    if (get_out(argv[11], &dother, "d_other", "float64", bytes, &a) < 0) goto fail_down;
    if (get_lanes(argv[12], argv[13], &tlo, &thi, a.n_boxes, a.d) < 0) goto fail_all;
    if (get_lanes(argv[14], argv[15], &otlo, &othi, o.n_boxes, a.d) < 0) {
        PyBuffer_Release(&tlo);
        PyBuffer_Release(&thi);
        goto fail_all;
    }
    Py_BEGIN_ALLOW_THREADS
    fused_loop(&a, &o, (const float *)tlo.buf, (const float *)thi.buf, (const float *)otlo.buf,
               (const float *)othi.buf, (const int64_t *)remap.buf, (uint8_t *)inside.buf,
               (double *)down.buf, (double *)dother.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&tlo);
    PyBuffer_Release(&thi);
    PyBuffer_Release(&otlo);
    PyBuffer_Release(&othi);
    PyBuffer_Release(&inside);
    PyBuffer_Release(&down);
    PyBuffer_Release(&dother);
    PyBuffer_Release(&remap);
    release(&o);
    release(&a);
    Py_RETURN_NONE;

fail_all:
    PyBuffer_Release(&dother);
    release(&a);
fail_down:
    PyBuffer_Release(&down);
fail_inside:
    PyBuffer_Release(&inside);
    PyBuffer_Release(&remap);
    release(&o);
    return NULL;
}

static PyMethodDef methods[] = {
    {"contains", (PyCFunction)(void (*)(void))contains, METH_FASTCALL,
     "contains(x, y, lo, hi, offsets, d, out[, where]): out[i] = 1 when x[i] lies in a box of "
     "class y[i] (and where[i] is set; 0 elsewhere, untested)."},
    {"distance_contains", (PyCFunction)(void (*)(void))distance_contains, METH_FASTCALL,
     "distance_contains(x, y, lo, hi, offsets, d, inside, dist, tlo, thi): membership and Euclidean "
     "distance to the nearest box of class y[i] (0 inside, inf when the class has no box); tlo, thi: "
     "the boxes transposed by blocks of LANES (see boxes.BoxSet)."},
    {"fused_distances", (PyCFunction)(void (*)(void))fused_distances, METH_FASTCALL,
     "fused_distances(x, y, lo, hi, offsets, d, olo, ohi, ooffsets, inside, d_own, d_other, tlo, "
     "thi, otlo, othi[, ocls]): distance_contains plus the distance to the nearest 'other' box "
     "(of class y[i], or ocls[y[i]]) where 0 < d_own < inf."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_boxkernel",
    .m_doc = "Native box tests for boxwatch.agent.boxes.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__boxkernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "LANES", LANES) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
