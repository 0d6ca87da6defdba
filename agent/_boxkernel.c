/* Native box tests for boxwatch.agent.boxes: membership and distance to the nearest box.
 *
 * Optional: when this extension is not built, boxes.py does the same work with numpy.
 * Results are bit-identical to boxes.py's per-dimension numpy path: comparisons are exact,
 * and distances are accumulated in float32 in feature order (gap = clip(x) - x, gap * gap,
 * acc + gap; built with -ffp-contract=off so no fused multiply-add changes a rounding).
 * contains tests boxes one at a time from their rows, stopping at the first features that
 * leave a box and at the first box that holds the input. layer_pass, one call per monitored
 * layer, reads each input's row once while it is hot: membership in a box of its class,
 * the distance to the nearest one and to the nearest box of another class, membership in a
 * bad box and Algorithm 3's verdict; it takes the inputs class by class (class_order), so
 * a class's boxes stay in the nearest cache from one input to the next. Its box tests and
 * distances take LANES boxes at once
 * from a transposed copy of each class's boxes (tlo, thi: per block of up to LANES boxes,
 * (n_features, boxes) floats, see lanes_min): each lane keeps its own sum over the features
 * in feature order, so every sum rounds exactly as the one-box-at-a-time loop does, and the
 * nearest box is the smallest sum whatever the order the boxes are visited in. GROUP blocks
 * run side by side (their sums do not wait on each other), and only the features where some
 * box's gap can be nonzero are read (live_features). Vectors are the compiler's (SSE2 on
 * x86-64, NEON on aarch64, plain code elsewhere), 8 floats wide on x86-64 CPUs with AVX2,
 * or 16 wide (one block per vector, comparisons to mask registers) on those with AVX-512F
 * (chosen at import; set_simd switches, for tests and timings): the same operations per
 * lane, the same bits. l2_rows divides each row by its Euclidean norm (the monitor's "l2"
 * normalisation, every layer's first step), the squares summed in float64 in feature order:
 * the bits of boxes.py's numpy path.
 *
 * The monitor's steps after the box tests run here too, each the same IEEE operations in
 * the same order as boxes.py's numpy path (elementwise +, -, *, /, sqrt, numpy's maximum and
 * fmin, sums in numpy's order): the same bits, in one call instead of dozens of numpy calls
 * (their per-call cost, not the arithmetic, was most of a batch's time). top_two picks each
 * row of the model's outputs' largest and second value; fused_score makes the fused
 * quadratic score from its raw terms; rmd_rows finishes the relative Mahalanobis term;
 * error_args, standardize and logit_tail are the error model around numpy's logarithms,
 * product and exponential (whose roundings only numpy gives); reasons_rows says why each
 * input not accepted got its verdict. Only the Python C API and the buffer protocol are used
 * (no numpy headers at build time); the GIL is released while the box loops run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 16 /* features summed between checks for an early exit */
#define LANES 16 /* boxes whose distances are accumulated side by side */
#define GROUP 2 /* blocks of LANES boxes whose sums run side by side */
enum { ACCEPT = 0, UNCERTAIN = 1, REJECT = 2 }; /* boxes.ACCEPT, UNCERTAIN, REJECT */

static int get(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous%s buffer", name,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}

/* Like get, for a buffer of float64 values (numpy's native "d"). */
static int get_f64(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous%s float64 buffer", name,
                     writable ? " writable" : "");
        return -1;
    }
    if (view->itemsize != (Py_ssize_t)sizeof(double) || !view->format ||
        strcmp(view->format, "d") != 0) {
        PyErr_Format(PyExc_ValueError, "%s: expected float64 values", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* An optional output (None: not wanted) of `size` bytes per input; 0, or -1 with an
 * exception set and nothing held. */
static int get_out(PyObject *obj, Py_buffer *view, const char *name, const char *unit,
                   Py_ssize_t size, Py_ssize_t n) {
    memset(view, 0, sizeof(*view));
    if (obj == Py_None) return 0;
    if ((strcmp(unit, "float64") == 0 ? get_f64(obj, view, 1, name) : get(obj, view, 1, name)) < 0)
        return -1;
    if (view->len != n * size) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd bytes (one %s per input), not %zd",
                     name, n * size, unit, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The inputs: x (n, d) float32 and their predicted classes y (n,) int64. */
typedef struct {
    Py_buffer x, y;
    Py_ssize_t n, d;
} Inputs;

static void release_inputs(Inputs *in) {
    PyBuffer_Release(&in->x);
    PyBuffer_Release(&in->y);
}

static int get_inputs(PyObject *x, PyObject *y, PyObject *d, Inputs *in) {
    memset(in, 0, sizeof(*in));
    in->d = PyLong_AsSsize_t(d);
    if (in->d < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d must be >= 0");
        return -1;
    }
    if (in->d > INT32_MAX) { /* live_features lists features as int32 */
        PyErr_SetString(PyExc_ValueError, "d must be below 2**31");
        return -1;
    }
    if (get(x, &in->x, 0, "x") < 0) return -1;
    if (get(y, &in->y, 0, "y") < 0) { release_inputs(in); return -1; }
    in->n = in->y.len / (Py_ssize_t)sizeof(int64_t);
    if (in->y.len % (Py_ssize_t)sizeof(int64_t) || in->x.len != in->n * in->d * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "x and y disagree on the number of inputs");
        release_inputs(in);
        return -1;
    }
    return 0;
}

/* One box set: lo and hi (n_boxes, d) float32, class c's rows offsets[c]:offsets[c + 1]
 * (n_classes + 1 int64) and, for layer_pass's lane loops, the copy boxes._lanes builds:
 * tlo and thi, the boxes transposed by blocks (n_boxes * d + LANES floats each, see
 * lanes_min), and cap, per class the range that every one of its boxes holds on each
 * feature (the largest lo, then the smallest hi: n_classes * 2 * d floats; see
 * live_features). */
typedef struct {
    Py_buffer lo, hi, offsets, tlo, thi, cap;
    Py_ssize_t n_boxes, n_classes;
} Set;

static void release_set(Set *s) {
    PyBuffer_Release(&s->lo);
    PyBuffer_Release(&s->hi);
    PyBuffer_Release(&s->offsets);
    PyBuffer_Release(&s->tlo);
    PyBuffer_Release(&s->thi);
    PyBuffer_Release(&s->cap);
}

/* Read (lo, hi, offsets) from argv, and (tlo, thi, cap) after them when `lanes`, checking
 * every size so no loop can read out of bounds; 0, or -1 with an exception set and nothing
 * held. */
static int get_set(PyObject *const *argv, int lanes, Py_ssize_t d, Set *s) {
    memset(s, 0, sizeof(*s));
    if (get(argv[0], &s->lo, 0, "lo") < 0 || get(argv[1], &s->hi, 0, "hi") < 0 ||
        get(argv[2], &s->offsets, 0, "offsets") < 0 ||
        (lanes && (get(argv[3], &s->tlo, 0, "tlo") < 0 || get(argv[4], &s->thi, 0, "thi") < 0 ||
                   get(argv[5], &s->cap, 0, "cap") < 0))) {
        release_set(s);
        return -1;
    }
    Py_ssize_t row = d * (Py_ssize_t)sizeof(float);
    s->n_classes = s->offsets.len / (Py_ssize_t)sizeof(int64_t) - 1;
    s->n_boxes = row ? s->lo.len / row : 0;
    const char *bad = NULL;
    if (s->lo.len != s->hi.len || (row && s->lo.len % row)) bad = "lo and hi must both be (n_boxes, d)";
    else if (s->n_classes < 0) bad = "offsets must hold n_classes + 1 values";
    if (!bad) {
        const int64_t *off = (const int64_t *)s->offsets.buf;
        if (off[0] != 0 || off[s->n_classes] != s->n_boxes) bad = "offsets must run from 0 to n_boxes";
        for (Py_ssize_t c = 0; !bad && c < s->n_classes; c++)
            if (off[c + 1] < off[c]) bad = "offsets must not decrease";
    }
    if (!bad && lanes) {
        if (s->tlo.len != s->thi.len || s->tlo.len != (s->n_boxes * d + LANES) * (Py_ssize_t)sizeof(float))
            bad = "tlo and thi must both hold n_boxes * d + LANES float32 (the boxes by blocks of "
                  "LANES, transposed)";
        else if (s->cap.len != s->n_classes * 2 * d * (Py_ssize_t)sizeof(float))
            bad = "cap must hold n_classes * 2 * d float32 (per class, the largest lo, then the "
                  "smallest hi)";
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
        release_set(s);
        return -1;
    }
    return 0;
}

/* Whether every predicted class names a class of `s`. */
static int check_classes(const Inputs *in, const Set *s) {
    const int64_t *y = (const int64_t *)in->y.buf;
    for (Py_ssize_t i = 0; i < in->n; i++)
        if (y[i] < 0 || y[i] >= s->n_classes) {
            PyErr_Format(PyExc_ValueError, "predicted classes must lie in [0, %zd); input %zd has %lld",
                         s->n_classes, i, (long long)y[i]);
            return -1;
        }
    return 0;
}

/* 1 when one of the boxes first .. end - 1 (rows of lo and hi) holds x: lo <= x <= hi in
 * every feature (NaN is outside, as with numpy's comparisons); a box stops at the first
 * block of features that leaves it. */
static int held_baseline(const float *x, const float *lo, const float *hi, int64_t first,
                         int64_t end, Py_ssize_t d) {
    for (int64_t k = first; k < end; k++) {
        const float *l = lo + k * d, *h = hi + k * d;
        int out = 0;
        for (Py_ssize_t s = 0; !out && s < d; s += BLOCK) {
            Py_ssize_t e = s + BLOCK < d ? s + BLOCK : d;
            for (Py_ssize_t j = s; j < e; j++) out |= !((x[j] >= l[j]) & (x[j] <= h[j]));
        }
        if (!out) return 1;
    }
    return 0;
}

/* One class's boxes in a Set's lane copy: its blocks (from tlo, thi), its cap and its box
 * count. */
typedef struct {
    const float *lo, *hi, *cap;
    int64_t count;
} Boxes;

static inline Boxes boxes_of(const Set *s, int64_t c, Py_ssize_t d) {
    const int64_t *off = (const int64_t *)s->offsets.buf;
    Boxes b = {(const float *)s->tlo.buf + off[c] * d, (const float *)s->thi.buf + off[c] * d,
               (const float *)s->cap.buf + c * 2 * d, off[c + 1] - off[c]};
    return b;
}

/* The features of x that can tell a box of `b` from another: those where x is not a finite
 * value within the range every box holds (b.cap). Elsewhere every box holds x, and each
 * box's gap is clip(x) - x = x - x = +0, whose square leaves a sum unchanged, bit for bit:
 * membership and distances read only the features listed. Writes them, in feature order, to
 * idx; returns how many, and sets *nan when x holds a NaN. (Layers after a ReLU hold many
 * zeros inside every box's range.) */
static Py_ssize_t live_features_baseline(const float *x, const Boxes *b, Py_ssize_t d,
                                         int32_t *idx, int *nan) {
    const float *clo = b->cap, *chi = b->cap + d;
    Py_ssize_t m = 0;
    int any_nan = 0;
    for (Py_ssize_t j = 0; j < d; j++) {
        idx[m] = (int32_t)j;
        m += !((x[j] >= clo[j]) & (x[j] <= chi[j]) & (fabsf(x[j]) <= FLT_MAX)); /* no branch */
        any_nan |= x[j] != x[j];
    }
    *nan = any_nan;
    return m;
}

/* Lanes accumulate in vectors of 4 floats: GCC and Clang vector extensions (SSE2 on x86-64,
 * NEON on aarch64, plain code elsewhere); other compilers take the same steps lane by lane.
 * On x86-64 CPUs with AVX2 (checked at import), the *_avx2 functions take a block's LANES
 * lanes in one 8-float vector instead. Either way each lane does exactly the one-box loop's
 * operations on its own sum, so both give the same bits. */
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
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

/* The sums of one block's LANES boxes. */
typedef struct { vf4 v[NV]; } sums_t;
#define SUM(a, l) ((a).v[(l) / 4][(l) % 4])

/* acc[k] += (clip(v, lo, hi) - v)^2 for the 4 lanes of vector k */
static ALWAYS_INLINE void sums_step(sums_t *acc, float xj, const float *lo, const float *hi) {
    const vf4 v = {xj, xj, xj, xj};
    for (int k = 0; k < NV; k++) {
        vf4 l, h;
        memcpy(&l, lo + 4 * k, sizeof l);
        memcpy(&h, hi + 4 * k, sizeof h);
        vf4 gap = clip4(v, l, h) - v;
        gap = gap * gap;
        acc->v[k] = acc->v[k] + gap;
    }
}

/* Which of a block's LANES boxes may still hold the input: all bits set per lane, or none. */
typedef struct { vi4 v[NV]; } mask_t;

/* m[k] &= (lo <= v <= hi) for the 4 lanes of vector k (ordered: NaN is outside) */
static ALWAYS_INLINE void mask_step(mask_t *m, float xj, const float *lo, const float *hi) {
    const vf4 v = {xj, xj, xj, xj};
    for (int k = 0; k < NV; k++) {
        vf4 l, h;
        memcpy(&l, lo + 4 * k, sizeof l);
        memcpy(&h, hi + 4 * k, sizeof h);
        m->v[k] &= (v >= l) & (v <= h);
    }
}

static ALWAYS_INLINE int mask_any(const mask_t *m) {
    vi4 any = m->v[0];
    for (int k = 1; k < NV; k++) any |= m->v[k];
    return (any[0] | any[1] | any[2] | any[3]) != 0;
}
#else
#define ALWAYS_INLINE inline
typedef struct { float v[LANES]; } sums_t;
#define SUM(a, l) ((a).v[l])

static ALWAYS_INLINE void sums_step(sums_t *acc, float xj, const float *lo, const float *hi) {
    for (int l = 0; l < LANES; l++) {
        float clipped = xj < lo[l] ? lo[l] : xj;
        clipped = clipped > hi[l] ? hi[l] : clipped;
        float gap = clipped - xj;
        gap = gap * gap;
        acc->v[l] = acc->v[l] + gap;
    }
}

typedef struct { int32_t v[LANES]; } mask_t;

static ALWAYS_INLINE void mask_step(mask_t *m, float xj, const float *lo, const float *hi) {
    for (int l = 0; l < LANES; l++) m->v[l] &= -(int32_t)((xj >= lo[l]) & (xj <= hi[l]));
}

static ALWAYS_INLINE int mask_any(const mask_t *m) {
    int32_t any = 0;
    for (int l = 0; l < LANES; l++) any |= m->v[l];
    return any != 0;
}
#endif

/* How many boxes block k (from 0) of `b` holds (LANES, or fewer for the last one). */
static ALWAYS_INLINE int64_t block_width(const Boxes *b, int64_t k) {
    return b->count - k * LANES < LANES ? b->count - k * LANES : LANES;
}

/* Blocks k0 .. k0 + nb - 1 of lanes_min's boxes: the smallest sum among them, or `best` when
 * none is smaller. The blocks' sums run side by side: each lane's sum waits on its previous
 * addition, and independent blocks keep the floating-point units busy meanwhile. nb is a
 * constant where this is inlined, so the sums stay in registers. Only the class's last block
 * can be narrower than LANES, so only the group's last one is. */
static ALWAYS_INLINE float group_min(const float *x, const Boxes *b, Py_ssize_t d,
                                     const int32_t *idx, Py_ssize_t m, int64_t k0, const int nb,
                                     float best) {
    sums_t acc[GROUP];
    const float *lo[GROUP], *hi[GROUP];
    const int64_t tail = block_width(b, k0 + nb - 1);
    for (int k = 0; k < nb; k++) {
        lo[k] = b->lo + (k0 + k) * LANES * d;
        hi[k] = b->hi + (k0 + k) * LANES * d;
        float start[LANES];
        for (int l = 0; l < LANES; l++) start[l] = k < nb - 1 || l < tail ? 0.0f : INFINITY;
        memcpy(&acc[k], start, sizeof acc[k]);
    }
    for (Py_ssize_t s = 0; s < m; s += BLOCK) {
        Py_ssize_t e = s + BLOCK < m ? s + BLOCK : m;
        for (Py_ssize_t t = s; t < e; t++) {
            const Py_ssize_t j = idx[t];
            for (int k = 0; k < nb - 1; k++)
                sums_step(&acc[k], x[j], lo[k] + j * LANES, hi[k] + j * LANES);
            sums_step(&acc[nb - 1], x[j], lo[nb - 1] + j * tail, hi[nb - 1] + j * tail);
        }
        if (best < INFINITY) { /* none reached inf before a first sum is known */
            int open = 0;
            for (int k = 0; k < nb; k++)
                for (int l = 0; l < LANES; l++) open |= !(SUM(acc[k], l) >= best);
            if (!open) break;
        }
    }
    for (int k = 0; k < nb; k++)
        for (int l = 0; l < LANES; l++)
            if (SUM(acc[k], l) < best) best = SUM(acc[k], l);
    return best;
}

/* Smallest squared distance from x to the boxes `b` (of one class), or `best` when none is
 * smaller, summing the features idx[0:m] (live_features) in order. b's blocks are LANES
 * boxes (the last one narrower: `tail` boxes), each transposed to (d, width) floats: feature
 * j of the block's box l at j * width + l, so no float is padding and a class of a few boxes
 * reads a few boxes' worth. A narrower block's vector loads read past its boxes (the next
 * features, or the LANES floats closing the copy): those lanes start at inf and stay at inf
 * or NaN, never nearest. Blocks go GROUP at a time (group_min); a group stops once every
 * lane's partial sum reaches best, the smallest of the groups before (NaN sums, from
 * inf - inf, never count as nearest and never stop a group, as in the one-box loop). The
 * nearest box is the smallest sum whatever the order the boxes are visited in. */
static float lanes_min_baseline(const float *x, const Boxes *b, Py_ssize_t d,
                                const int32_t *idx, Py_ssize_t m, float best) {
    int64_t blocks = (b->count + LANES - 1) / LANES;
    for (int64_t k = 0; k < blocks; k += GROUP) {
        switch (blocks - k < GROUP ? blocks - k : GROUP) {
            case 1: best = group_min(x, b, d, idx, m, k, 1, best); break;
            default: best = group_min(x, b, d, idx, m, k, GROUP, best); break;
        }
    }
    return best;
}

/* Blocks k0 .. k0 + nb - 1 of lanes_inside's boxes: 1 when one of them holds x. Their
 * masks run side by side, and the group stops at the first features (looked at every 4)
 * that leave all of its boxes: one exit per group, not per block. */
static ALWAYS_INLINE int group_inside(const float *x, const Boxes *b, Py_ssize_t d,
                                      const int32_t *idx, Py_ssize_t m, int64_t k0,
                                      const int nb) {
    mask_t held[GROUP];
    const float *lo[GROUP], *hi[GROUP];
    const int64_t tail = block_width(b, k0 + nb - 1);
    for (int k = 0; k < nb; k++) {
        lo[k] = b->lo + (k0 + k) * LANES * d;
        hi[k] = b->hi + (k0 + k) * LANES * d;
        int32_t start[LANES];
        for (int l = 0; l < LANES; l++) start[l] = k < nb - 1 || l < tail ? -1 : 0;
        memcpy(&held[k], start, sizeof held[k]);
    }
    for (Py_ssize_t t = 0; t < m; t++) {
        const Py_ssize_t j = idx[t];
        for (int k = 0; k < nb - 1; k++) mask_step(&held[k], x[j], lo[k] + j * LANES, hi[k] + j * LANES);
        mask_step(&held[nb - 1], x[j], lo[nb - 1] + j * tail, hi[nb - 1] + j * tail);
        if ((t & 3) == 3) {
            int any = 0;
            for (int k = 0; k < nb; k++) any |= mask_any(&held[k]);
            if (!any) return 0;
        }
    }
    int any = 0;
    for (int k = 0; k < nb; k++) any |= mask_any(&held[k]);
    return any;
}

/* 1 when x lies in one of the boxes `b` (lo <= x <= hi on every feature; NaN is outside, as
 * with numpy's comparisons), reading the features idx[0:m] (live_features: every box holds x
 * on the others), blocks GROUP at a time (group_inside). */
static int lanes_inside_baseline(const float *x, const Boxes *b, Py_ssize_t d,
                                 const int32_t *idx, Py_ssize_t m) {
    int64_t blocks = (b->count + LANES - 1) / LANES;
    for (int64_t k = 0; k < blocks; k += GROUP) {
        int in;
        switch (blocks - k < GROUP ? blocks - k : GROUP) {
            case 1: in = group_inside(x, b, d, idx, m, k, 1); break;
            default: in = group_inside(x, b, d, idx, m, k, GROUP); break;
        }
        if (in) return 1;
    }
    return 0;
}

/* l2_rows's work, rows `r0 .. r0 + R - 1`: each row's sum of squares in float64 in feature
 * order (a float32's square is exact in float64, so this is the sequential sum numpy's
 * add.accumulate gives), its root rounded to float32 (0 taken as 1), and the row divided by
 * it in float32. R is a constant where this is inlined: the R rows' sums run side by side,
 * so each addition's latency is hidden behind the other rows'. */
static ALWAYS_INLINE void l2_block(const float *x, float *out, Py_ssize_t d, Py_ssize_t r0,
                                   const int R) {
    double sum[8] = {0.0};
    for (Py_ssize_t j = 0; j < d; j++)
        for (int r = 0; r < R; r++) {
            const double v = (double)x[(r0 + r) * d + j];
            sum[r] += v * v;
        }
    for (int r = 0; r < R; r++) {
        float norm = (float)sqrt(sum[r]);
        if (norm == 0.0f) norm = 1.0f;
        const float *row = x + (r0 + r) * d;
        float *dst = out + (r0 + r) * d;
        for (Py_ssize_t j = 0; j < d; j++) dst[j] = row[j] / norm;
    }
}

static void l2_baseline(const float *x, float *out, Py_ssize_t n, Py_ssize_t d) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) l2_block(x, out, d, i, 8);
    for (; i < n; i++) l2_block(x, out, d, i, 1);
}

/* One implementation of the lane loops (and of l2_rows). */
typedef struct {
    const char *name;
    Py_ssize_t (*features)(const float *, const Boxes *, Py_ssize_t, int32_t *, int *);
    float (*min)(const float *, const Boxes *, Py_ssize_t, const int32_t *, Py_ssize_t, float);
    int (*inside)(const float *, const Boxes *, Py_ssize_t, const int32_t *, Py_ssize_t);
    int (*held)(const float *, const float *, const float *, int64_t, int64_t, Py_ssize_t);
    void (*l2)(const float *, float *, Py_ssize_t, Py_ssize_t);
} lanes_impl;

static const lanes_impl BASELINE = {"baseline", live_features_baseline, lanes_min_baseline,
                                    lanes_inside_baseline, held_baseline, l2_baseline};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2 1
#include <immintrin.h>

/* A block's LANES lanes in AVX2 vectors of 8. */
#define HALVES (LANES / 8)

/* group_min with a block's LANES sums in HALVES AVX2 vectors: the same operations per lane
 * (maxps, minps, subtract, multiply, add; no FMA: the target adds AVX2 only). The group's
 * last block (tail boxes) takes th vectors, the ones with a box in them; th, like nb, is a
 * constant where this is inlined. */
__attribute__((target("avx2"))) static ALWAYS_INLINE float group_min_avx2(
    const float *x, const Boxes *b, Py_ssize_t d, const int32_t *idx, Py_ssize_t m, int64_t k0,
    const int nb, const int th, float best) {
    __m256 acc[GROUP][HALVES];
    const float *lo[GROUP], *hi[GROUP];
    const int64_t tail = block_width(b, k0 + nb - 1);
    for (int k = 0; k < nb; k++) {
        lo[k] = b->lo + (k0 + k) * LANES * d;
        hi[k] = b->hi + (k0 + k) * LANES * d;
        for (int h = 0; h < HALVES; h++) acc[k][h] = _mm256_setzero_ps();
    }
    float start[LANES];
    for (int l = 0; l < LANES; l++) start[l] = l < tail ? 0.0f : INFINITY;
    for (int h = 0; h < th; h++) acc[nb - 1][h] = _mm256_loadu_ps(start + 8 * h);
    const __m256 top = _mm256_set1_ps(best);
    for (Py_ssize_t s = 0; s < m; s += BLOCK) {
        Py_ssize_t e = s + BLOCK < m ? s + BLOCK : m;
        for (Py_ssize_t t = s; t < e; t++) {
            const Py_ssize_t j = idx[t];
            const __m256 v = _mm256_set1_ps(x[j]);
            for (int k = 0; k < nb; k++) {
                const Py_ssize_t at = j * (k < nb - 1 ? LANES : tail);
                for (int h = 0; h < (k < nb - 1 ? HALVES : th); h++) {
                    __m256 gap = _mm256_max_ps(_mm256_loadu_ps(lo[k] + at + 8 * h), v);
                    gap = _mm256_sub_ps(_mm256_min_ps(_mm256_loadu_ps(hi[k] + at + 8 * h), gap), v);
                    acc[k][h] = _mm256_add_ps(acc[k][h], _mm256_mul_ps(gap, gap));
                }
            }
        }
        if (best < INFINITY) {
            int reached = 0xFF; /* lanes whose sum is >= best (ordered: NaN is not) */
            for (int k = 0; k < nb; k++)
                for (int h = 0; h < (k < nb - 1 ? HALVES : th); h++)
                    reached &= _mm256_movemask_ps(_mm256_cmp_ps(acc[k][h], top, _CMP_GE_OQ));
            if (reached == 0xFF) break;
        }
    }
    /* the smallest sum, NaN lanes left out (as `sum < best` does): a tree of minps, exact */
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 low = inf;
    for (int k = 0; k < nb; k++)
        for (int h = 0; h < (k < nb - 1 ? HALVES : th); h++)
            low = _mm256_min_ps(
                _mm256_blendv_ps(inf, acc[k][h], _mm256_cmp_ps(acc[k][h], acc[k][h], _CMP_ORD_Q)),
                low);
    __m128 q = _mm_min_ps(_mm256_castps256_ps128(low), _mm256_extractf128_ps(low, 1));
    q = _mm_min_ps(q, _mm_movehl_ps(q, q));
    q = _mm_min_ss(q, _mm_shuffle_ps(q, q, 1));
    const float lowest = _mm_cvtss_f32(q);
    return lowest < best ? lowest : best;
}

/* lanes_min_baseline with group_min_avx2. */
__attribute__((target("avx2"))) static float lanes_min_avx2(const float *x, const Boxes *b,
                                                            Py_ssize_t d, const int32_t *idx,
                                                            Py_ssize_t m, float best) {
    int64_t blocks = (b->count + LANES - 1) / LANES;
    for (int64_t k = 0; k < blocks; k += GROUP) {
        const int nb = blocks - k < GROUP ? (int)(blocks - k) : GROUP;
        const int wide = block_width(b, k + nb - 1) > 8; /* the last block needs both halves */
        switch (2 * nb + wide) {
            case 2: best = group_min_avx2(x, b, d, idx, m, k, 1, 1, best); break;
            case 3: best = group_min_avx2(x, b, d, idx, m, k, 1, 2, best); break;
            case 4: best = group_min_avx2(x, b, d, idx, m, k, 2, 1, best); break;
            default: best = group_min_avx2(x, b, d, idx, m, k, 2, 2, best); break;
        }
    }
    return best;
}

/* group_inside with a block's LANES lanes in HALVES AVX2 vectors (th for the group's last
 * block, as in group_min_avx2). */
__attribute__((target("avx2"))) static ALWAYS_INLINE int group_inside_avx2(
    const float *x, const Boxes *b, Py_ssize_t d, const int32_t *idx, Py_ssize_t m, int64_t k0,
    const int nb, const int th) {
    __m256 held[GROUP][HALVES];
    const float *lo[GROUP], *hi[GROUP];
    const int64_t tail = block_width(b, k0 + nb - 1);
    const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int k = 0; k < nb; k++) {
        lo[k] = b->lo + (k0 + k) * LANES * d;
        hi[k] = b->hi + (k0 + k) * LANES * d;
        for (int h = 0; h < HALVES; h++) held[k][h] = all;
    }
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (int h = 0; h < th; h++)
        held[nb - 1][h] = _mm256_cmp_ps(lane, _mm256_set1_ps((float)(tail - 8 * h)), _CMP_LT_OQ);
    for (Py_ssize_t t = 0; t < m; t++) {
        const Py_ssize_t j = idx[t];
        const __m256 v = _mm256_set1_ps(x[j]);
        for (int k = 0; k < nb; k++) {
            const Py_ssize_t at = j * (k < nb - 1 ? LANES : tail);
            for (int h = 0; h < (k < nb - 1 ? HALVES : th); h++) {
                const float *l = lo[k] + at + 8 * h, *u = hi[k] + at + 8 * h;
                __m256 in = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_loadu_ps(l), _CMP_GE_OQ),
                                          _mm256_cmp_ps(v, _mm256_loadu_ps(u), _CMP_LE_OQ));
                held[k][h] = _mm256_and_ps(held[k][h], in);
            }
        }
        if ((t & 3) == 3) {
            __m256 any = held[0][0];
            for (int k = 0; k < nb; k++)
                for (int h = 0; h < (k < nb - 1 ? HALVES : th); h++) any = _mm256_or_ps(any, held[k][h]);
            if (_mm256_testz_ps(any, any)) return 0;
        }
    }
    __m256 any = held[0][0];
    for (int k = 0; k < nb; k++)
        for (int h = 0; h < (k < nb - 1 ? HALVES : th); h++) any = _mm256_or_ps(any, held[k][h]);
    return !_mm256_testz_ps(any, any);
}

/* lanes_inside_baseline with group_inside_avx2. */
__attribute__((target("avx2"))) static int lanes_inside_avx2(const float *x, const Boxes *b,
                                                             Py_ssize_t d, const int32_t *idx,
                                                             Py_ssize_t m) {
    int64_t blocks = (b->count + LANES - 1) / LANES;
    for (int64_t k = 0; k < blocks; k += GROUP) {
        const int nb = blocks - k < GROUP ? (int)(blocks - k) : GROUP;
        const int wide = block_width(b, k + nb - 1) > 8;
        int in;
        switch (2 * nb + wide) {
            case 2: in = group_inside_avx2(x, b, d, idx, m, k, 1, 1); break;
            case 3: in = group_inside_avx2(x, b, d, idx, m, k, 1, 2); break;
            case 4: in = group_inside_avx2(x, b, d, idx, m, k, 2, 1); break;
            default: in = group_inside_avx2(x, b, d, idx, m, k, 2, 2); break;
        }
        if (in) return 1;
    }
    return 0;
}

/* For each 8-bit mask, the positions of its set bits in order (see live_features_avx2). */
static uint8_t PACK[256][8];

static void init_pack(void) {
    for (int mask = 0; mask < 256; mask++)
        for (int bit = 0, n = 0; bit < 8; bit++)
            if (mask >> bit & 1) PACK[mask][n++] = (uint8_t)bit;
}

/* live_features_baseline, 8 features at a time: the features kept are a mask, and PACK
 * packs their positions to the front of one 8-index store (each store stays within idx:
 * no more features are kept than looked at). */
__attribute__((target("avx2"))) static Py_ssize_t live_features_avx2(const float *x,
                                                                     const Boxes *b,
                                                                     Py_ssize_t d, int32_t *idx,
                                                                     int *nan) {
    const float *clo = b->cap, *chi = b->cap + d;
    const __m256 largest = _mm256_set1_ps(FLT_MAX);
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 unordered = _mm256_setzero_ps();
    Py_ssize_t m = 0, j = 0;
    int any_nan = 0;
    for (; j + 8 <= d; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        __m256 held = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_loadu_ps(clo + j), _CMP_GE_OQ),
                                    _mm256_cmp_ps(v, _mm256_loadu_ps(chi + j), _CMP_LE_OQ));
        held = _mm256_and_ps(held, _mm256_cmp_ps(_mm256_and_ps(v, magnitude), largest, _CMP_LE_OQ));
        const int keep = ~_mm256_movemask_ps(held) & 0xFF;
        __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)PACK[keep]));
        _mm256_storeu_si256((__m256i *)(idx + m), _mm256_add_epi32(at, _mm256_set1_epi32((int)j)));
        m += __builtin_popcount((unsigned)keep);
    }
    for (; j < d; j++) {
        idx[m] = (int32_t)j;
        m += !((x[j] >= clo[j]) & (x[j] <= chi[j]) & (fabsf(x[j]) <= FLT_MAX));
        any_nan |= x[j] != x[j];
    }
    *nan = any_nan || !_mm256_testz_ps(unordered, unordered);
    return m;
}

/* held_baseline, 8 features at a time. */
__attribute__((target("avx2"))) static int held_avx2(const float *x, const float *lo,
                                                     const float *hi, int64_t first,
                                                     int64_t end, Py_ssize_t d) {
    for (int64_t k = first; k < end; k++) {
        const float *l = lo + k * d, *h = hi + k * d;
        Py_ssize_t j = 0;
        int in = 1;
        for (; in && j + 8 <= d; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            __m256 ok = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_loadu_ps(l + j), _CMP_GE_OQ),
                                      _mm256_cmp_ps(v, _mm256_loadu_ps(h + j), _CMP_LE_OQ));
            in = _mm256_movemask_ps(ok) == 0xFF;
        }
        for (; in && j < d; j++) in = (x[j] >= l[j]) & (x[j] <= h[j]);
        if (in) return 1;
    }
    return 0;
}

/* l2_baseline with 8 rows at a time: each 4 x 4 block of features of 4 rows is transposed
 * so that a vector of 4 float64 sums holds 4 rows, each lane adding its row's squares in
 * feature order (the same bits); the rows are then divided 8 floats at a time. */
__attribute__((target("avx2"))) static void l2_avx2(const float *x, float *out, Py_ssize_t n,
                                                    Py_ssize_t d) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float *r = x + i * d;
        __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
        Py_ssize_t j = 0;
        for (; j + 4 <= d; j += 4)
            for (int g = 0; g < 2; g++) {
                const float *q = r + 4 * g * d + j;
                __m128 a = _mm_loadu_ps(q), b = _mm_loadu_ps(q + d), c = _mm_loadu_ps(q + 2 * d),
                       e = _mm_loadu_ps(q + 3 * d);
                _MM_TRANSPOSE4_PS(a, b, c, e);
                __m256d v = _mm256_cvtps_pd(a);
                acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(v, v));
                v = _mm256_cvtps_pd(b);
                acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(v, v));
                v = _mm256_cvtps_pd(c);
                acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(v, v));
                v = _mm256_cvtps_pd(e);
                acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(v, v));
            }
        for (; j < d; j++)
            for (int g = 0; g < 2; g++) {
                const float *q = r + 4 * g * d + j;
                const __m256d v = _mm256_cvtps_pd(_mm_setr_ps(q[0], q[d], q[2 * d], q[3 * d]));
                acc[g] = _mm256_add_pd(acc[g], _mm256_mul_pd(v, v));
            }
        float norm[8];
        _mm_storeu_ps(norm, _mm256_cvtpd_ps(_mm256_sqrt_pd(acc[0])));
        _mm_storeu_ps(norm + 4, _mm256_cvtpd_ps(_mm256_sqrt_pd(acc[1])));
        for (int k = 0; k < 8; k++) {
            const float by = norm[k] == 0.0f ? 1.0f : norm[k];
            const __m256 v = _mm256_set1_ps(by);
            const float *row = r + k * d;
            float *dst = out + (i + k) * d;
            Py_ssize_t t = 0;
            for (; t + 8 <= d; t += 8)
                _mm256_storeu_ps(dst + t, _mm256_div_ps(_mm256_loadu_ps(row + t), v));
            for (; t < d; t++) dst[t] = row[t] / by;
        }
    }
    if (i < n) l2_baseline(x + i * d, out + i * d, n - i, d);
}

static const lanes_impl AVX2 = {"avx2", live_features_avx2, lanes_min_avx2, lanes_inside_avx2,
                                held_avx2, l2_avx2};

/* The AVX-512 loops: a block's LANES lanes in one 16-float vector, and comparisons to mask
 * registers; the same operations per lane as the other loops, so the same bits. */
#define AVX512 __attribute__((target("avx512f")))

/* group_min with a block in one AVX-512 vector. */
AVX512 static ALWAYS_INLINE float group_min_avx512(const float *x, const Boxes *b, Py_ssize_t d,
                                                   const int32_t *idx, Py_ssize_t m, int64_t k0,
                                                   const int nb, float best) {
    __m512 acc[GROUP];
    const float *lo[GROUP], *hi[GROUP];
    const int64_t tail = block_width(b, k0 + nb - 1);
    for (int k = 0; k < nb; k++) {
        lo[k] = b->lo + (k0 + k) * LANES * d;
        hi[k] = b->hi + (k0 + k) * LANES * d;
        acc[k] = _mm512_setzero_ps();
    }
    const __mmask16 real = (__mmask16)((1u << tail) - 1u); /* tail <= LANES = 16 */
    acc[nb - 1] = _mm512_mask_blend_ps(real, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    const __m512 top = _mm512_set1_ps(best);
    for (Py_ssize_t s = 0; s < m; s += BLOCK) {
        Py_ssize_t e = s + BLOCK < m ? s + BLOCK : m;
        for (Py_ssize_t t = s; t < e; t++) {
            const Py_ssize_t j = idx[t];
            const __m512 v = _mm512_set1_ps(x[j]);
            for (int k = 0; k < nb; k++) {
                const Py_ssize_t at = j * (k < nb - 1 ? LANES : tail);
                __m512 gap = _mm512_max_ps(_mm512_loadu_ps(lo[k] + at), v);
                gap = _mm512_sub_ps(_mm512_min_ps(_mm512_loadu_ps(hi[k] + at), gap), v);
                acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(gap, gap));
            }
        }
        if (best < INFINITY) {
            __mmask16 reached = 0xFFFF; /* lanes whose sum is >= best (ordered: NaN is not) */
            for (int k = 0; k < nb; k++) reached &= _mm512_cmp_ps_mask(acc[k], top, _CMP_GE_OQ);
            if (reached == 0xFFFF) break;
        }
    }
    /* the smallest sum, NaN lanes left out (as `sum < best` does): a tree of minps, exact */
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 low = inf;
    for (int k = 0; k < nb; k++)
        low = _mm512_min_ps(
            _mm512_mask_blend_ps(_mm512_cmp_ps_mask(acc[k], acc[k], _CMP_ORD_Q), inf, acc[k]), low);
    const float lowest = _mm512_reduce_min_ps(low);
    return lowest < best ? lowest : best;
}

/* lanes_min_baseline with group_min_avx512. */
AVX512 static float lanes_min_avx512(const float *x, const Boxes *b, Py_ssize_t d,
                                     const int32_t *idx, Py_ssize_t m, float best) {
    int64_t blocks = (b->count + LANES - 1) / LANES;
    for (int64_t k = 0; k < blocks; k += GROUP) {
        if (blocks - k < GROUP) best = group_min_avx512(x, b, d, idx, m, k, 1, best);
        else best = group_min_avx512(x, b, d, idx, m, k, GROUP, best);
    }
    return best;
}

/* group_inside with a block in one AVX-512 vector: a lane's bit stays set while the box
 * holds the input. */
AVX512 static ALWAYS_INLINE int group_inside_avx512(const float *x, const Boxes *b, Py_ssize_t d,
                                                    const int32_t *idx, Py_ssize_t m, int64_t k0,
                                                    const int nb) {
    __mmask16 held[GROUP];
    const float *lo[GROUP], *hi[GROUP];
    const int64_t tail = block_width(b, k0 + nb - 1);
    for (int k = 0; k < nb; k++) {
        lo[k] = b->lo + (k0 + k) * LANES * d;
        hi[k] = b->hi + (k0 + k) * LANES * d;
        held[k] = 0xFFFF;
    }
    held[nb - 1] = (__mmask16)((1u << tail) - 1u);
    for (Py_ssize_t t = 0; t < m; t++) {
        const Py_ssize_t j = idx[t];
        const __m512 v = _mm512_set1_ps(x[j]);
        for (int k = 0; k < nb; k++) {
            const Py_ssize_t at = j * (k < nb - 1 ? LANES : tail);
            const __mmask16 ge = _mm512_cmp_ps_mask(v, _mm512_loadu_ps(lo[k] + at), _CMP_GE_OQ);
            held[k] &= _mm512_mask_cmp_ps_mask(ge, v, _mm512_loadu_ps(hi[k] + at), _CMP_LE_OQ);
        }
        if ((t & 3) == 3) {
            __mmask16 any = 0;
            for (int k = 0; k < nb; k++) any |= held[k];
            if (!any) return 0;
        }
    }
    __mmask16 any = 0;
    for (int k = 0; k < nb; k++) any |= held[k];
    return any != 0;
}

/* lanes_inside_baseline with group_inside_avx512. */
AVX512 static int lanes_inside_avx512(const float *x, const Boxes *b, Py_ssize_t d,
                                      const int32_t *idx, Py_ssize_t m) {
    int64_t blocks = (b->count + LANES - 1) / LANES;
    for (int64_t k = 0; k < blocks; k += GROUP) {
        const int in = blocks - k < GROUP ? group_inside_avx512(x, b, d, idx, m, k, 1)
                                          : group_inside_avx512(x, b, d, idx, m, k, GROUP);
        if (in) return 1;
    }
    return 0;
}

/* live_features_baseline, 16 features at a time: the features kept are a mask, and a
 * compress packs their positions to the front of one 16-index store (within idx, as in
 * live_features_avx2). */
AVX512 static Py_ssize_t live_features_avx512(const float *x, const Boxes *b, Py_ssize_t d,
                                              int32_t *idx, int *nan) {
    const float *clo = b->cap, *chi = b->cap + d;
    const __m512 largest = _mm512_set1_ps(FLT_MAX);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 unordered = 0;
    Py_ssize_t m = 0, j = 0;
    int any_nan = 0;
    for (; j + 16 <= d; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __mmask16 held = _mm512_cmp_ps_mask(v, _mm512_loadu_ps(clo + j), _CMP_GE_OQ);
        held = _mm512_mask_cmp_ps_mask(held, v, _mm512_loadu_ps(chi + j), _CMP_LE_OQ);
        held = _mm512_mask_cmp_ps_mask(held, _mm512_abs_ps(v), largest, _CMP_LE_OQ);
        const __mmask16 keep = (__mmask16)~held;
        const __m512i at = _mm512_add_epi32(iota, _mm512_set1_epi32((int)j));
        _mm512_storeu_si512((void *)(idx + m), _mm512_maskz_compress_epi32(keep, at));
        m += __builtin_popcount((unsigned)keep);
    }
    for (; j < d; j++) {
        idx[m] = (int32_t)j;
        m += !((x[j] >= clo[j]) & (x[j] <= chi[j]) & (fabsf(x[j]) <= FLT_MAX));
        any_nan |= x[j] != x[j];
    }
    *nan = any_nan || unordered;
    return m;
}

/* held_baseline, 16 features at a time. */
AVX512 static int held_avx512(const float *x, const float *lo, const float *hi, int64_t first,
                              int64_t end, Py_ssize_t d) {
    for (int64_t k = first; k < end; k++) {
        const float *l = lo + k * d, *h = hi + k * d;
        Py_ssize_t j = 0;
        int in = 1;
        for (; in && j + 16 <= d; j += 16) {
            const __m512 v = _mm512_loadu_ps(x + j);
            const __mmask16 ge = _mm512_cmp_ps_mask(v, _mm512_loadu_ps(l + j), _CMP_GE_OQ);
            in = _mm512_mask_cmp_ps_mask(ge, v, _mm512_loadu_ps(h + j), _CMP_LE_OQ) == 0xFFFF;
        }
        for (; in && j < d; j++) in = (x[j] >= l[j]) & (x[j] <= h[j]);
        if (in) return 1;
    }
    return 0;
}

static const lanes_impl AVX512F = {"avx512", live_features_avx512, lanes_min_avx512,
                                   lanes_inside_avx512, held_avx512, l2_avx2};
#endif

/* The implementation in use: AVX-512F, else AVX2, where the CPU has it (set at import), else
 * the baseline; set_simd changes it. */
static const lanes_impl *lanes = &BASELINE;

/* contains's work: res[i] = 1 when x[i] lies in a box of class y[i] (and only[i] is set,
 * when given; 0 elsewhere, untested). */
static void contains_loop(const Inputs *in, const Set *s, const uint8_t *only, uint8_t *res) {
    const int64_t *off = (const int64_t *)s->offsets.buf, *y = (const int64_t *)in->y.buf;
    for (Py_ssize_t i = 0; i < in->n; i++)
        res[i] = (uint8_t)((!only || only[i]) &&
                           lanes->held((const float *)in->x.buf + i * in->d, (const float *)s->lo.buf,
                                       (const float *)s->hi.buf, off[y[i]], off[y[i] + 1], in->d));
}

/* What layer_pass writes (NULL: not wanted; inside always). */
typedef struct {
    uint8_t *inside, *in_bad;
    int8_t *verdict;
    double *d_own, *d_other;
} Outs;

/* The inputs in order of their predicted class: order[start[c] .. start[c + 1] - 1] are the
 * inputs of class c, in input order (a counting sort; classes already checked). */
static void class_order(const int64_t *y, Py_ssize_t n, Py_ssize_t n_classes, Py_ssize_t *order,
                        Py_ssize_t *start) {
    memset(start, 0, (size_t)(n_classes + 1) * sizeof(*start));
    for (Py_ssize_t i = 0; i < n; i++) start[y[i] + 1]++;
    for (Py_ssize_t c = 0; c < n_classes; c++) start[c + 1] += start[c];
    for (Py_ssize_t i = 0; i < n; i++) order[start[y[i]]++] = i;
    for (Py_ssize_t c = n_classes; c > 0; c--) start[c] = start[c - 1];
    start[0] = 0;
}

/* layer_pass's work: see layer_pass. idx: room for d features; order and start: room for n
 * and n_classes + 1 values. Each input's result depends on its row alone; the inputs go
 * class by class (class_order), the box tests and own-class distances of a class's inputs,
 * then their other-class distances, so the boxes each step reads stay in the nearest cache
 * from one input to the next rather than being read again from further away. */
static void layer_loop(const Inputs *in, const Set *good, const Set *bad, const Set *other,
                       const int64_t *ocls, int every_row, int32_t *idx, Py_ssize_t *order,
                       Py_ssize_t *start, const Outs *o) {
    const int64_t *y = (const int64_t *)in->y.buf;
    const Py_ssize_t d = in->d;
    class_order(y, in->n, good->n_classes, order, start);
    for (Py_ssize_t c = 0; c < good->n_classes; c++) {
        const Boxes b = boxes_of(good, c, d);
        for (Py_ssize_t r = start[c]; r < start[c + 1]; r++) {
            const Py_ssize_t i = order[r];
            const float *x = (const float *)in->x.buf + i * d;
            int nan;
            const Py_ssize_t m = lanes->features(x, &b, d, idx, &nan);
            const int inside = lanes->inside(x, &b, d, idx, m);
            o->inside[i] = (uint8_t)inside;
            int in_bad = 0;
            if (bad && (inside || every_row)) {
                const int64_t *off = (const int64_t *)bad->offsets.buf;
                in_bad = lanes->held(x, (const float *)bad->lo.buf, (const float *)bad->hi.buf,
                                     off[c], off[c + 1], d);
            }
            if (o->in_bad) o->in_bad[i] = (uint8_t)in_bad;
            if (o->verdict) o->verdict[i] = (int8_t)(inside ? (in_bad ? UNCERTAIN : ACCEPT) : REJECT);
            if (!o->d_own) continue;
            if (o->d_other) o->d_other[i] = INFINITY;
            if (inside) o->d_own[i] = 0.0;
            else if (nan) o->d_own[i] = b.count ? NAN : INFINITY;
            else o->d_own[i] = sqrt((double)lanes->min(x, &b, d, idx, m, INFINITY));
        }
        const int64_t oc = ocls ? ocls[c] : c;
        if (!o->d_other || oc < 0) continue;
        const Boxes ob = boxes_of(other, oc, d);
        for (Py_ssize_t r = start[c]; r < start[c + 1]; r++) {
            const Py_ssize_t i = order[r];
            if (!(o->d_own[i] > 0.0 && o->d_own[i] < INFINITY)) continue;
            const float *x = (const float *)in->x.buf + i * d;
            int nan;
            const Py_ssize_t om = lanes->features(x, &ob, d, idx, &nan);
            o->d_other[i] = sqrt((double)lanes->min(x, &ob, d, idx, om, INFINITY));
        }
    }
}

static PyObject *contains(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 7 && argc != 8) {
        PyErr_SetString(PyExc_TypeError, "contains(x, y, lo, hi, offsets, d, out[, where])");
        return NULL;
    }
    Inputs in;
    Set s;
    Py_buffer out = {0}, where = {0};
    int ok = 0;
    if (get_inputs(argv[0], argv[1], argv[5], &in) < 0) return NULL;
    if (get_set(argv + 2, 0, in.d, &s) < 0) { release_inputs(&in); return NULL; }
    if (check_classes(&in, &s) < 0 || get_out(argv[6], &out, "out", "byte", 1, in.n) < 0) goto done;
    if (argc == 8 && get_out(argv[7], &where, "where", "byte", 1, in.n) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    contains_loop(&in, &s, (const uint8_t *)where.buf, (uint8_t *)out.buf);
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    PyBuffer_Release(&where);
    PyBuffer_Release(&out);
    release_set(&s);
    release_inputs(&in);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* A tuple of `n` items (a box set's arrays), or NULL with TypeError set. */
static PyObject *const *items_of(PyObject *obj, Py_ssize_t n, const char *name) {
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != n) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of %zd arrays", name, n);
        return NULL;
    }
    return &PyTuple_GET_ITEM(obj, 0);
}

/* One monitored layer's box work in one pass over the inputs; see the method's docstring. */
static PyObject *layer_pass(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 13) {
        PyErr_SetString(PyExc_TypeError,
                        "layer_pass(x, y, d, good, bad, other, ocls, every_row, inside, in_bad, "
                        "verdict, d_own, d_other)");
        return NULL;
    }
    Inputs in;
    Set good, bad = {0}, other = {0};
    Py_buffer remap = {0}, inside = {0}, in_bad = {0}, verdict = {0}, d_own = {0}, d_other = {0};
    int32_t *idx = NULL;
    Py_ssize_t *order = NULL, *start = NULL;
    int ok = 0, every_row = PyObject_IsTrue(argv[7]);
    PyObject *const *items;
    if (every_row < 0 || get_inputs(argv[0], argv[1], argv[2], &in) < 0) return NULL;
    if (!(items = items_of(argv[3], 6, "good")) || get_set(items, 1, in.d, &good) < 0) {
        release_inputs(&in);
        return NULL;
    }
    if (check_classes(&in, &good) < 0) goto done;
    if (argv[4] != Py_None && (!(items = items_of(argv[4], 3, "bad")) || get_set(items, 0, in.d, &bad) < 0))
        goto done;
    if (argv[5] != Py_None && (!(items = items_of(argv[5], 6, "other")) || get_set(items, 1, in.d, &other) < 0))
        goto done;
    if ((argv[4] != Py_None && bad.n_classes != good.n_classes) ||
        (argv[5] != Py_None && other.n_classes != good.n_classes)) {
        PyErr_SetString(PyExc_ValueError, "the bad and other boxes must cover the same classes");
        goto done;
    }
    if (argv[6] != Py_None) {
        const char *wrong = NULL;
        if (get(argv[6], &remap, 0, "ocls") < 0) goto done;
        if (remap.len != good.n_classes * (Py_ssize_t)sizeof(int64_t))
            wrong = "ocls must hold one int64 per class";
        for (Py_ssize_t c = 0; !wrong && c < good.n_classes; c++) {
            int64_t oc = ((const int64_t *)remap.buf)[c];
            if (oc < -1 || oc >= good.n_classes) wrong = "ocls must hold classes of the other boxes or -1";
        }
        if (wrong) {
            PyErr_SetString(PyExc_ValueError, wrong);
            goto done;
        }
    }
    if (get_out(argv[8], &inside, "inside", "byte", 1, in.n) < 0 ||
        get_out(argv[9], &in_bad, "in_bad", "byte", 1, in.n) < 0 ||
        get_out(argv[10], &verdict, "verdict", "byte", 1, in.n) < 0 ||
        get_out(argv[11], &d_own, "d_own", "float64", sizeof(double), in.n) < 0 ||
        get_out(argv[12], &d_other, "d_other", "float64", sizeof(double), in.n) < 0)
        goto done;
    const char *missing = NULL;
    if (!inside.buf && in.n) missing = "inside is needed";
    else if ((argv[9] == Py_None) != (argv[4] == Py_None)) missing = "in_bad goes with bad boxes";
    else if (argv[12] != Py_None && (argv[11] == Py_None || argv[5] == Py_None))
        missing = "d_other needs d_own and the other boxes";
    if (missing) {
        PyErr_SetString(PyExc_ValueError, missing);
        goto done;
    }
    idx = PyMem_Malloc((size_t)(in.d ? in.d : 1) * sizeof(int32_t));
    order = PyMem_Malloc((size_t)(in.n ? in.n : 1) * sizeof(Py_ssize_t));
    start = PyMem_Malloc((size_t)(good.n_classes + 1) * sizeof(Py_ssize_t));
    if (!idx || !order || !start) {
        PyErr_NoMemory();
        goto done;
    }
    const Outs o = {(uint8_t *)inside.buf, (uint8_t *)in_bad.buf, (int8_t *)verdict.buf,
                    (double *)d_own.buf, (double *)d_other.buf};
    Py_BEGIN_ALLOW_THREADS
    layer_loop(&in, &good, argv[4] != Py_None ? &bad : NULL, &other, (const int64_t *)remap.buf,
               every_row, idx, order, start, &o);
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    PyMem_Free(start);
    PyMem_Free(order);
    PyMem_Free(idx);
    PyBuffer_Release(&d_other);
    PyBuffer_Release(&d_own);
    PyBuffer_Release(&verdict);
    PyBuffer_Release(&in_bad);
    PyBuffer_Release(&inside);
    PyBuffer_Release(&remap);
    release_set(&other);
    release_set(&bad);
    release_set(&good);
    release_inputs(&in);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* Rows divided by their Euclidean norms; see the method's docstring. */
static PyObject *l2_rows(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "l2_rows(x, d, out)");
        return NULL;
    }
    const Py_ssize_t d = PyLong_AsSsize_t(argv[1]);
    if (d < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "d must be >= 0");
        return NULL;
    }
    Py_buffer x = {0}, out = {0};
    int ok = 0;
    if (get(argv[0], &x, 0, "x") < 0) return NULL;
    if (get(argv[2], &out, 1, "out") < 0) goto done;
    if (x.len % (Py_ssize_t)sizeof(float) || (d && (x.len / (Py_ssize_t)sizeof(float)) % d) ||
        out.len != x.len) {
        PyErr_SetString(PyExc_ValueError, "x and out must hold the same rows of d float32 each");
        goto done;
    }
    const Py_ssize_t n = d ? x.len / (Py_ssize_t)sizeof(float) / d : 0;
    Py_BEGIN_ALLOW_THREADS
    lanes->l2((const float *)x.buf, (float *)out.buf, n, d);
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&x);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* Per row of z (n rows of c float64): its largest value (NaN when it holds a NaN, as numpy's
 * maximum), its second largest (the largest again when that occurs twice; -inf for a row of
 * one value) and whether every value is finite. Comparisons only: exact. */
static void top_two_loop(const double *z, Py_ssize_t n, Py_ssize_t c, double *top, double *second,
                         uint8_t *finite) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const double *row = z + i * c;
        double first = -INFINITY, next = -INFINITY;
        int nan = 0, fin = 1;
        for (Py_ssize_t j = 0; j < c; j++) {
            const double v = row[j];
            nan |= v != v;
            fin &= fabs(v) <= DBL_MAX;
            if (v > first) {
                next = first;
                first = v;
            } else if (v > next) {
                next = v;
            }
        }
        top[i] = nan ? NAN : first;
        second[i] = next;
        finite[i] = (uint8_t)fin;
    }
}

static PyObject *top_two(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 5) {
        PyErr_SetString(PyExc_TypeError, "top_two(z, c, top, second, finite)");
        return NULL;
    }
    const Py_ssize_t c = PyLong_AsSsize_t(argv[1]);
    if (c < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "c must be >= 1");
        return NULL;
    }
    Py_buffer z = {0}, top = {0}, second = {0}, finite = {0};
    int ok = 0;
    if (get_f64(argv[0], &z, 0, "z") < 0) return NULL;
    if (z.len % ((Py_ssize_t)sizeof(double) * c)) {
        PyErr_SetString(PyExc_ValueError, "z must hold rows of c float64 each");
        goto done;
    }
    const Py_ssize_t n = z.len / (Py_ssize_t)sizeof(double) / c;
    if (get_out(argv[2], &top, "top", "float64", sizeof(double), n) < 0 ||
        get_out(argv[3], &second, "second", "float64", sizeof(double), n) < 0 ||
        get_out(argv[4], &finite, "finite", "byte", 1, n) < 0)
        goto done;
    if (n && !(top.buf && second.buf && finite.buf)) {
        PyErr_SetString(PyExc_ValueError, "top, second and finite are needed");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    top_two_loop((const double *)z.buf, n, c, (double *)top.buf, (double *)second.buf,
                 (uint8_t *)finite.buf);
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    PyBuffer_Release(&finite);
    PyBuffer_Release(&second);
    PyBuffer_Release(&top);
    PyBuffer_Release(&z);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* numpy's maximum: NaN when either is NaN, else the larger (a when equal). */
static inline double np_maximum(double a, double b) { return (a >= b || a != a) ? a : b; }

/* The float64 arrays of a tuple, each of n values: their buffers (k of them held) and data. */
typedef struct {
    Py_buffer *views;
    double **rows;
    Py_ssize_t k;
} Rows;

static void release_rows(Rows *r) {
    for (Py_ssize_t j = 0; j < r->k; j++) PyBuffer_Release(&r->views[j]);
    PyMem_Free(r->rows);
    PyMem_Free(r->views);
    r->views = NULL;
    r->rows = NULL;
    r->k = 0;
}

/* Fill r from `tuple` (writable buffers for outputs); 0, or -1 with an exception set and
 * nothing held. */
static int get_rows(PyObject *tuple, Py_ssize_t n, int writable, const char *name, Rows *r) {
    memset(r, 0, sizeof(*r));
    if (!PyTuple_Check(tuple)) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of arrays", name);
        return -1;
    }
    const Py_ssize_t k = PyTuple_GET_SIZE(tuple);
    r->views = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
    r->rows = PyMem_Calloc((size_t)(k ? k : 1), sizeof(double *));
    if (!r->views || !r->rows) {
        PyErr_NoMemory();
        release_rows(r);
        return -1;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        if (get_f64(PyTuple_GET_ITEM(tuple, j), &r->views[j], writable, name) < 0) {
            release_rows(r);
            return -1;
        }
        r->k = j + 1;
        if (r->views[j].len != n * (Py_ssize_t)sizeof(double)) {
            PyErr_Format(PyExc_ValueError, "%s must hold float64 arrays of %zd values", name, n);
            release_rows(r);
            return -1;
        }
        r->rows[j] = (double *)r->views[j].buf;
    }
    return 0;
}

/* fused_score's work; see fused_score. count: the terms in the mean, extra ones repeated. */
static void fused_loop(Py_ssize_t n, const Rows *dist, const Rows *own, const Rows *other,
                       const Rows *ext, const double *scale, const double *center,
                       const int64_t *repeat, Py_ssize_t count, double peak_factor,
                       const Rows *contrast, double *terms, double *score, uint8_t *peaked) {
    const Py_ssize_t n_dist = dist->k;
    for (Py_ssize_t i = 0; i < n; i++) {
        double sum = 0.0, peak = 0.0;
        Py_ssize_t t = 0;
        for (Py_ssize_t k = 0; k < n_dist; k++, t++) {
            const double v = dist->rows[k][i] / scale[t];
            terms[t * n + i] = v;
            sum += v * v;
            peak = k ? np_maximum(peak, v) : v;
        }
        for (Py_ssize_t k = 0; k < own->k; k++, t++) {
            const double d = own->rows[k][i];
            const double c = d == 0.0 ? 0.0 : d / (d + other->rows[k][i]);
            contrast->rows[k][i] = c;
            const double v = c / scale[t];
            terms[t * n + i] = v;
            sum += v * v;
        }
        for (Py_ssize_t k = 0; k < ext->k; k++, t++) {
            const double v = np_maximum(ext->rows[k][i] - center[k], 0.0) / scale[t];
            terms[t * n + i] = v;
            for (int64_t r = 0; r < repeat[k]; r++) sum += v * v;
        }
        double out = sqrt(sum / (double)count);
        if (peak_factor > 0.0 && n_dist) {
            peak /= peak_factor;
            out = np_maximum(out, peak);
        }
        if (!(fabs(out) <= DBL_MAX)) out = INFINITY;
        score[i] = out;
        if (peaked) peaked[i] = (uint8_t)(peak_factor > 0.0 && n_dist && peak == out);
    }
}

static PyObject *fused_score(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 12) {
        PyErr_SetString(PyExc_TypeError, "fused_score(dist, own, other, extra, scale, center, "
                                         "repeat, peak_factor, contrast, terms, score, peaked)");
        return NULL;
    }
    const double peak_factor = PyFloat_AsDouble(argv[7]);
    if (peak_factor == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer score = {0}, terms = {0}, scale = {0}, center = {0}, repeat = {0}, peaked = {0};
    Rows dist = {0}, own = {0}, other = {0}, ext = {0}, contrast = {0};
    int ok = 0;
    if (get_f64(argv[10], &score, 1, "score") < 0) return NULL;
    const Py_ssize_t n = score.len / (Py_ssize_t)sizeof(double);
    if (get_rows(argv[0], n, 0, "dist", &dist) < 0 || get_rows(argv[1], n, 0, "own", &own) < 0 ||
        get_rows(argv[2], n, 0, "other", &other) < 0 || get_rows(argv[3], n, 0, "extra", &ext) < 0 ||
        get_rows(argv[8], n, 1, "contrast", &contrast) < 0 ||
        get_f64(argv[4], &scale, 0, "scale") < 0 || get_f64(argv[5], &center, 0, "center") < 0 ||
        get(argv[6], &repeat, 0, "repeat") < 0 || get_f64(argv[9], &terms, 1, "terms") < 0 ||
        get_out(argv[11], &peaked, "peaked", "byte", 1, n) < 0)
        goto done;
    const Py_ssize_t n_terms = dist.k + own.k + ext.k;
    const char *bad = NULL;
    Py_ssize_t count = dist.k + own.k;
    for (Py_ssize_t k = 0; repeat.len == ext.k * (Py_ssize_t)sizeof(int64_t) && k < ext.k; k++) {
        const int64_t r = ((const int64_t *)repeat.buf)[k];
        if (r < 1 || r > 64) bad = "repeat must lie in 1 .. 64";
        count += (Py_ssize_t)r;
    }
    if (other.k != own.k || contrast.k != own.k) bad = "own, other and contrast must be as many";
    else if (scale.len != n_terms * (Py_ssize_t)sizeof(double)) bad = "scale must hold one float64 per term";
    else if (center.len != ext.k * (Py_ssize_t)sizeof(double)) bad = "center must hold one float64 per extra term";
    else if (repeat.len != ext.k * (Py_ssize_t)sizeof(int64_t)) bad = "repeat must hold one int64 per extra term";
    else if (terms.len != n_terms * n * (Py_ssize_t)sizeof(double)) bad = "terms must be (n_terms, n) float64";
    else if (!count) bad = "the score needs a term";
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    fused_loop(n, &dist, &own, &other, &ext, (const double *)scale.buf, (const double *)center.buf,
               (const int64_t *)repeat.buf, count, peak_factor, &contrast, (double *)terms.buf,
               (double *)score.buf, (uint8_t *)peaked.buf);
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    release_rows(&contrast);
    release_rows(&ext);
    release_rows(&other);
    release_rows(&own);
    release_rows(&dist);
    PyBuffer_Release(&peaked);
    PyBuffer_Release(&terms);
    PyBuffer_Release(&repeat);
    PyBuffer_Release(&center);
    PyBuffer_Release(&scale);
    PyBuffer_Release(&score);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* rmd_rows(product, rank, y, quadratic, offset, out): the relative Mahalanobis distance from
 * its projection, see the method's docstring; a ValueError naming the first input whose class
 * is out of range. */
static PyObject *rmd_rows(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "rmd_rows(product, rank, y, quadratic, offset, out)");
        return NULL;
    }
    const Py_ssize_t rank = PyLong_AsSsize_t(argv[1]);
    if (rank < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rank must be >= 0");
        return NULL;
    }
    Py_buffer product = {0}, y = {0}, quadratic = {0}, offset = {0}, out = {0};
    int ok = 0;
    if (get_f64(argv[0], &product, 0, "product") < 0) return NULL;
    if (get(argv[2], &y, 0, "y") < 0 || get_f64(argv[3], &quadratic, 0, "quadratic") < 0 ||
        get_f64(argv[4], &offset, 0, "offset") < 0 || get_f64(argv[5], &out, 1, "out") < 0)
        goto done;
    const Py_ssize_t n = y.len / (Py_ssize_t)sizeof(int64_t);
    const Py_ssize_t classes = offset.len / (Py_ssize_t)sizeof(double), cols = rank + classes;
    if (y.len % (Py_ssize_t)sizeof(int64_t) || offset.len % (Py_ssize_t)sizeof(double) ||
        product.len != n * cols * (Py_ssize_t)sizeof(double) ||
        quadratic.len != n * (Py_ssize_t)sizeof(double) || out.len != quadratic.len) {
        PyErr_SetString(PyExc_ValueError, "rmd_rows: product must be (n, rank + n_classes) float64, "
                                          "y n int64, quadratic and out n float64");
        goto done;
    }
    const int64_t *cls = (const int64_t *)y.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (cls[i] < 0 || cls[i] >= classes) {
            PyErr_Format(PyExc_ValueError, "predicted classes must lie in [0, %zd); input %zd has %lld",
                         classes, i, (long long)cls[i]);
            goto done;
        }
    const double *p = (const double *)product.buf, *q = (const double *)quadratic.buf,
                 *off = (const double *)offset.buf;
    double *o = (double *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) o[i] = q[i] - 2.0 * p[i * cols + rank + cls[i]] + off[cls[i]];
    ok = 1;
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&offset);
    PyBuffer_Release(&quadratic);
    PyBuffer_Release(&y);
    PyBuffer_Release(&product);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* error_args(conf, gap, scores, contrast, cap, a0, a1, a2, a3, mean): the error model's
 * inputs before their logarithms; see the method's docstring. */
static PyObject *error_args(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "error_args(conf, gap, scores, contrast, cap, a0, a1, a2, a3, mean)");
        return NULL;
    }
    const double cap = PyFloat_AsDouble(argv[4]);
    if (cap == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer conf = {0}, gap = {0}, scores = {0}, a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, mean = {0};
    Rows contrast = {0};
    int ok = 0;
    if (get_f64(argv[0], &conf, 0, "conf") < 0) return NULL;
    const Py_ssize_t n = conf.len / (Py_ssize_t)sizeof(double);
    if (get_out(argv[1], &gap, "gap", "float64", sizeof(double), n) < 0 ||
        get_out(argv[2], &scores, "scores", "float64", sizeof(double), n) < 0 ||
        get_out(argv[5], &a0, "a0", "float64", sizeof(double), n) < 0 ||
        get_out(argv[6], &a1, "a1", "float64", sizeof(double), n) < 0 ||
        get_out(argv[7], &a2, "a2", "float64", sizeof(double), n) < 0 ||
        get_out(argv[8], &a3, "a3", "float64", sizeof(double), n) < 0 ||
        get_out(argv[9], &mean, "mean", "float64", sizeof(double), n) < 0)
        goto done;
    if (n && !(scores.buf && a0.buf && a1.buf && a2.buf && mean.buf && (gap.buf || !a3.buf))) {
        PyErr_SetString(PyExc_ValueError, "scores, a0, a1, a2 and mean are needed, a3 with gap");
        goto done;
    }
    if (get_rows(argv[3], n, 0, "contrast", &contrast) < 0) goto done;
    const Py_ssize_t k = contrast.k;
    const double *c = conf.buf, *g = gap.buf, *sc = scores.buf;
    double *o0 = a0.buf, *o1 = a1.buf, *o2 = a2.buf, *o3 = a3.buf, *m = mean.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        o0[i] = np_maximum(c[i], 1e-300);
        o1[i] = np_maximum(1.0 - c[i], 1e-12);
        o2[i] = sc[i] != sc[i] ? cap : (cap != cap ? sc[i] : (sc[i] <= cap ? sc[i] : cap));
        if (o3) o3[i] = np_maximum(g[i], 1e-12);
        double sum = 0.0;
        for (Py_ssize_t j = 0; j < k; j++) {
            const double v = contrast.rows[j][i];
            sum += fabs(v) <= DBL_MAX ? v : 1.0;
        }
        m[i] = k ? sum / (double)k : 0.0;
    }
    ok = 1;
done:
    release_rows(&contrast);
    PyBuffer_Release(&mean);
    PyBuffer_Release(&a3);
    PyBuffer_Release(&a2);
    PyBuffer_Release(&a1);
    PyBuffer_Release(&a0);
    PyBuffer_Release(&scores);
    PyBuffer_Release(&gap);
    PyBuffer_Release(&conf);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* standardize(cols, mean, scale, out): out[i, j] = (cols[j][i] - mean[j]) / scale[j]. */
static PyObject *standardize(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "standardize(cols, mean, scale, out)");
        return NULL;
    }
    if (!PyTuple_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "cols must be a tuple of arrays");
        return NULL;
    }
    const Py_ssize_t k = PyTuple_GET_SIZE(argv[0]);
    Py_buffer mean = {0}, scale = {0}, out = {0};
    Rows cols = {0};
    int ok = 0;
    if (get_f64(argv[1], &mean, 0, "mean") < 0 || get_f64(argv[2], &scale, 0, "scale") < 0 ||
        get_f64(argv[3], &out, 1, "out") < 0)
        goto done;
    if (!k || mean.len != k * (Py_ssize_t)sizeof(double) || scale.len != mean.len ||
        out.len % (k * (Py_ssize_t)sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "standardize: mean and scale hold one value per column, "
                                          "out (n, columns)");
        goto done;
    }
    const Py_ssize_t n = out.len / (k * (Py_ssize_t)sizeof(double));
    if (get_rows(argv[0], n, 0, "cols", &cols) < 0) goto done;
    const double *mu = mean.buf, *sd = scale.buf;
    double *o = out.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t j = 0; j < k; j++) o[i * k + j] = (cols.rows[j][i] - mu[j]) / sd[j];
    ok = 1;
done:
    release_rows(&cols);
    PyBuffer_Release(&out);
    PyBuffer_Release(&scale);
    PyBuffer_Release(&mean);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* logit_tail(t, intercept, shift, y, out): out[i] = -((t[i] + intercept) + shift[y[i]]), or
 * -(t[i] + intercept) with shift None; a ValueError naming the first input whose class has no
 * shift. */
static PyObject *logit_tail(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 5) {
        PyErr_SetString(PyExc_TypeError, "logit_tail(t, intercept, shift, y, out)");
        return NULL;
    }
    const double intercept = PyFloat_AsDouble(argv[1]);
    if (intercept == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer t = {0}, shift = {0}, y = {0}, out = {0};
    int ok = 0;
    if (get_f64(argv[0], &t, 0, "t") < 0) return NULL;
    const Py_ssize_t n = t.len / (Py_ssize_t)sizeof(double);
    if (get_out(argv[4], &out, "out", "float64", sizeof(double), n) < 0) goto done;
    if (argv[2] != Py_None &&
        (get_f64(argv[2], &shift, 0, "shift") < 0 || get_out(argv[3], &y, "y", "int64", 8, n) < 0))
        goto done;
    if (n && (!out.buf || (shift.buf && !y.buf))) {
        PyErr_SetString(PyExc_ValueError, "out is needed, and y with shift");
        goto done;
    }
    const double *tt = t.buf, *sh = shift.buf;
    const int64_t *cls = y.buf;
    const Py_ssize_t classes = shift.len / (Py_ssize_t)sizeof(double);
    double *o = out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!sh) {
            o[i] = -(tt[i] + intercept);
            continue;
        }
        if (cls[i] < 0 || cls[i] >= classes) {
            PyErr_Format(PyExc_ValueError, "predicted classes must lie in [0, %zd); input %zd has %lld",
                         classes, i, (long long)cls[i]);
            goto done;
        }
        o[i] = -((tt[i] + intercept) + sh[cls[i]]);
    }
    ok = 1;
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&y);
    PyBuffer_Release(&shift);
    PyBuffer_Release(&t);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* reasons_rows(terms, rows, combined, y, weight, kinds, term_at, score_at, peaked, nearest,
 * n_con, low_confidence, outside_boxes, codes, layer, nearest_out): why the inputs `rows` got their
 * verdicts; see the method's docstring. */
static PyObject *reasons_rows(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 16) {
        PyErr_SetString(PyExc_TypeError,
                        "reasons_rows(terms, rows, combined, y, weight, kinds, term_at, score_at, "
                        "peaked, nearest, n_con, low_confidence, outside_boxes, codes, layer, "
                        "nearest_out)");
        return NULL;
    }
    const Py_ssize_t n_con = PyLong_AsSsize_t(argv[10]);
    const long low = PyLong_AsLong(argv[11]), outside = PyLong_AsLong(argv[12]);
    if ((n_con == -1 || low == -1 || outside == -1) && PyErr_Occurred()) return NULL;
    Py_buffer terms = {0}, rows = {0}, combined = {0}, y = {0}, weight = {0}, kinds = {0},
              term_at = {0}, score_at = {0}, peaked = {0}, nearest = {0}, codes = {0},
              layer = {0}, near = {0};
    int ok = 0;
    if (get_f64(argv[0], &terms, 0, "terms") < 0) return NULL;
    if (get(argv[1], &rows, 0, "rows") < 0 || get(argv[2], &combined, 0, "combined") < 0 ||
        get(argv[3], &y, 0, "y") < 0 || get_f64(argv[4], &weight, 0, "weight") < 0 ||
        get(argv[5], &kinds, 0, "kinds") < 0 || get(argv[6], &term_at, 0, "term_at") < 0 ||
        get(argv[7], &score_at, 0, "score_at") < 0 ||
        (argv[9] != Py_None && get(argv[9], &nearest, 0, "nearest") < 0))
        goto done;
    const Py_ssize_t n = combined.len, n_terms = weight.len / (Py_ssize_t)sizeof(double);
    const Py_ssize_t n_dist = score_at.len / (Py_ssize_t)sizeof(int16_t), k = rows.len / 8;
    if (get_out(argv[8], &peaked, "peaked", "byte", 1, n) < 0 ||
        get_out(argv[13], &codes, "codes", "byte", 1, n) < 0 ||
        get_out(argv[14], &layer, "layer", "int16", 2, n) < 0 ||
        (nearest.buf && get_out(argv[15], &near, "nearest_out", "int64", 8, n) < 0))
        goto done;
    const char *bad = NULL;
    if (rows.len % 8 || y.len != n * 8) bad = "rows and y must be int64, y one class per input";
    else if (terms.len != n_terms * n * (Py_ssize_t)sizeof(double)) bad = "terms must be (n_terms, n) float64";
    else if (kinds.len != n_terms || term_at.len != 2 * n_terms) bad = "kinds (int8) and term_at (int16) hold one value per term";
    else if (!n_dist || n_con < 0 || n_dist + n_con > n_terms ||
             (nearest.buf && (n_con < 1 || nearest.len % (8 * n_con))))
        bad = "score_at (int16) needs a distance term, nearest (n_con, n_classes) int64 a "
              "contrast term";
    else if (n && !(codes.buf && layer.buf)) bad = "codes and layer are needed";
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto done;
    }
    const Py_ssize_t table = nearest.buf ? nearest.len / 8 / n_con : 0; /* its classes */
    const double *tv = terms.buf, *w = weight.buf;
    const int64_t *at = rows.buf, *cls = y.buf, *nt = nearest.buf;
    const int8_t *verdict = combined.buf, *kind = kinds.buf;
    const int16_t *tat = term_at.buf, *sat = score_at.buf;
    const uint8_t *pk = peaked.buf;
    int8_t *code_out = codes.buf;
    int16_t *layer_out = layer.buf;
    int64_t *near_out = near.buf;
    for (Py_ssize_t r = 0; r < k; r++) {
        const int64_t i = at[r];
        if (i < 0 || i >= n || (nt && (cls[i] < 0 || cls[i] >= table))) {
            PyErr_Format(PyExc_ValueError, "reasons_rows: row %zd (input %lld) out of range", r,
                         (long long)i);
            goto done;
        }
        const int unsure = verdict[i] == UNCERTAIN;
        Py_ssize_t far = 0, top = 0, pick = 0;
        double far_v = 0.0, top_v = 0.0, pick_v = 0.0;
        for (Py_ssize_t t = 0; t < n_terms; t++) {
            double v = tv[t * n + i];
            v = v >= 0.0 ? v : 0.0; /* numpy's fmax(v, 0): NaN and below 0 give 0 */
            if (t < n_dist && (t == 0 || v > far_v)) far_v = v, far = t;
            if (t >= n_dist && t < n_dist + n_con && (t == n_dist || v > pick_v))
                pick_v = v, pick = t - n_dist;
            const double weighted = v * w[t];
            if (t == 0 || weighted > top_v) top_v = weighted, top = t;
        }
        const int16_t farthest = sat[far];
        int8_t code = unsure ? (int8_t)low : kind[top];
        int16_t where = unsure || tat[top] < 0 ? farthest : tat[top];
        if (pk && pk[i] && !unsure) code = (int8_t)outside, where = farthest;
        code_out[i] = code;
        layer_out[i] = where;
        if (nt) near_out[i] = nt[pick * table + cls[i]];
    }
    ok = 1;
done:
    PyBuffer_Release(&near);
    PyBuffer_Release(&layer);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&nearest);
    PyBuffer_Release(&peaked);
    PyBuffer_Release(&score_at);
    PyBuffer_Release(&term_at);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&weight);
    PyBuffer_Release(&y);
    PyBuffer_Release(&combined);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&terms);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *simd(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(lanes->name);
}

/* The implementation named `name` that this CPU can run, or NULL. */
static const lanes_impl *simd_named(const char *name) {
    if (strcmp(name, BASELINE.name) == 0) return &BASELINE;
#ifdef HAVE_AVX2
    if (strcmp(name, AVX2.name) == 0 && __builtin_cpu_supports("avx2")) return &AVX2;
    if (strcmp(name, AVX512F.name) == 0 && __builtin_cpu_supports("avx512f")) return &AVX512F;
#endif
    return NULL;
}

static PyObject *set_simd(PyObject *self, PyObject *name) {
    (void)self;
    const char *want = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (!want) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "set_simd(name): name must be a str");
        return NULL;
    }
    const lanes_impl *impl = simd_named(want);
    if (!impl) {
        PyErr_Format(PyExc_ValueError,
                     "simd %R: expected 'baseline', or 'avx2' or 'avx512' where the CPU and the "
                     "build have it",
                     name);
        return NULL;
    }
    const char *previous = lanes->name;
    lanes = impl;
    return PyUnicode_FromString(previous);
}

static PyMethodDef methods[] = {
    {"contains", (PyCFunction)(void (*)(void))contains, METH_FASTCALL,
     "contains(x, y, lo, hi, offsets, d, out[, where]): out[i] = 1 when x[i] lies in a box of "
     "class y[i] (and where[i] is set; 0 elsewhere, untested)."},
    {"layer_pass", (PyCFunction)(void (*)(void))layer_pass, METH_FASTCALL,
     "layer_pass(x, y, d, good, bad, other, ocls, every_row, inside, in_bad, verdict, d_own, "
     "d_other): one layer's box work, each input's row read once. good and other: (lo, hi, "
     "offsets, tlo, thi, cap) (boxes.BoxSet's arrays and _lanes copy); bad: (lo, hi, offsets) "
     "or None. inside[i] = 1 when x[i] lies in a good box of class y[i]; in_bad[i] = 1 when it "
     "also lies (or, with every_row, just lies) in a bad box of class y[i]; verdict[i]: "
     "Algorithm 3's code (0 accept, 1 uncertainty, 2 reject); d_own[i]: the Euclidean distance "
     "to the nearest good box of class y[i] (0 inside, inf when the class has no box, NaN for "
     "an input with a NaN); d_other[i], where 0 < d_own[i] < inf: the distance to the nearest "
     "box of `other` of class y[i], or of class ocls[y[i]] (int64 per class; -1: none), inf "
     "elsewhere. Outputs other than inside may be None (not computed)."},
    {"l2_rows", (PyCFunction)(void (*)(void))l2_rows, METH_FASTCALL,
     "l2_rows(x, d, out): out = each row of x (float32, d features) divided by its Euclidean "
     "norm (0: left at 0), the norm summed in float64 in feature order and rounded to float32; "
     "out: float32, the shape of x."},
    {"top_two", (PyCFunction)(void (*)(void))top_two, METH_FASTCALL,
     "top_two(z, c, top, second, finite): per row of z (float64, c values), its largest value "
     "(NaN when it holds a NaN), its second largest (the largest again when that occurs twice; "
     "-inf with one value) and finite[i] = 1 when every value is finite; top and second: "
     "float64, finite: one byte per row."},
    {"fused_score", (PyCFunction)(void (*)(void))fused_score, METH_FASTCALL,
     "fused_score(dist, own, other, extra, scale, center, repeat, peak_factor, contrast, terms, "
     "score, peaked): the fused quadratic score from its raw terms (tuples of float64 arrays of n "
     "values): per term t its scaled value terms[t] (dist / scale; the contrast own / (own + "
     "other), 0 where own is 0, written to contrast, / scale; max(extra - center, 0) / scale), "
     "score = sqrt of the mean of their squares (extra term k counted repeat[k] times), with a "
     "peak_factor > 0 at least the largest scaled distance / peak_factor, and inf where not "
     "finite; peaked[i] = 1 where that peak is the score (None: not wanted)."},
    {"rmd_rows", (PyCFunction)(void (*)(void))rmd_rows, METH_FASTCALL,
     "rmd_rows(product, rank, y, quadratic, offset, out): out[i] = quadratic[i] - 2 * "
     "product[i, rank + y[i]] + offset[y[i]] (product: (n, rank + n_classes) float64, y: n "
     "int64 in [0, n_classes), quadratic, offset (n_classes) and out: float64)."},
    {"error_args", (PyCFunction)(void (*)(void))error_args, METH_FASTCALL,
     "error_args(conf, gap, scores, contrast, cap, a0, a1, a2, a3, mean): the error model's "
     "inputs before their logarithms (float64 arrays of n values): a0 = max(conf, 1e-300), a1 = "
     "max(1 - conf, 1e-12), a2 = fmin(scores, cap), a3 = max(gap, 1e-12) (None: not wanted, "
     "gap may then be None), mean = the mean of the contrast arrays (a tuple), a non-finite "
     "value counted as 1 (0 without any)."},
    {"standardize", (PyCFunction)(void (*)(void))standardize, METH_FASTCALL,
     "standardize(cols, mean, scale, out): out[i, j] = (cols[j][i] - mean[j]) / scale[j] (cols: a "
     "tuple of float64 arrays of n values; out: (n, len(cols)) float64)."},
    {"logit_tail", (PyCFunction)(void (*)(void))logit_tail, METH_FASTCALL,
     "logit_tail(t, intercept, shift, y, out): out[i] = -((t[i] + intercept) + shift[y[i]]) "
     "(shift None: -(t[i] + intercept); y: int64 in [0, len(shift)))."},
    {"reasons_rows", (PyCFunction)(void (*)(void))reasons_rows, METH_FASTCALL,
     "reasons_rows(terms, rows, combined, y, weight, kinds, term_at, score_at, peaked, nearest, "
     "n_con, low_confidence, outside_boxes, codes, layer, nearest_out): for each input i of rows, the "
     "reason of a calibrated monitor's verdict combined[i] from its scaled score terms "
     "terms[:, i] (floored at 0): low_confidence for uncertainty, else the kind of the term "
     "with the largest value times weight (outside_boxes where peaked[i]), the layer of that "
     "term (else the largest distance term's, score_at), and the nearest other class: "
     "nearest[j, y[i]] for the largest contrast term j (the n_con terms after the distances; "
     "nearest None: not written)."},
    {"simd", (PyCFunction)simd, METH_NOARGS,
     "simd(): which lane loops run: 'avx512', 'avx2' or 'baseline' (the compiler's default "
     "target)."},
    {"set_simd", (PyCFunction)set_simd, METH_O,
     "set_simd(name): run the 'avx512', 'avx2' or 'baseline' lane loops (same results; for tests "
     "and timings); returns the previous name. ValueError where the CPU or the build lacks "
     "them."},
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
#ifdef HAVE_AVX2
    init_pack();
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) lanes = &AVX2;
    if (__builtin_cpu_supports("avx512f")) lanes = &AVX512F;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "LANES", LANES) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
