/* mbfg_ros.native._kernel: the per-step numerics of the fast path in C.
 *
 * Two types (and the tuner's filter bank: its reduced model, MechanismKernel.reduced_*, its discretization and
 * covariance step, discretize and kalman_step):
 *   MechanismKernel  the constrained dynamics of one mechanism (natural coordinates: the quadratic constraints
 *                    folded into one tensor, the relative angles as (row, 5 extended indices, length)):
 *                    Φ, Φq, Φ̇q, q̈ and its exact first derivatives (mk_derivatives, with K⁻¹ of the
 *                    augmented matrix, or the rows of the caller's null-space solver where K is singular).
 *   StepKernel       one StepModel's units (static rows as one matrix, the nonlinear units as a small
 *                    program): the whitened linearization, the right-hand side of the δ-form factor, and the
 *                    relinearization mismatch; writes into numpy arrays registered at construction.
 *
 * Each formula here is the package's only form of it (mbfg_ros.model.constraints.ConstraintSet, dynamics.cache
 * and graph.step_model call it); the tests compare it with numpy references of their own (test/).  No numpy C API: arrays pass through the buffer protocol.
 * Nothing here releases the GIL, so the work buffers of a kernel are never used by two threads at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#define TWO_PI 6.283185307179586
#define SANE_NORM2 1e24

/* ------------------------------------------------------------------------------------------------ buffers */
typedef struct {
    Py_buffer view;
    int held;
} Buf;

static double *
get_doubles(PyObject *obj, Buf *b, Py_ssize_t expect, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0)
        return NULL;
    b->held = 1;
    const char *f = b->view.format;
    size_t fl = f ? strlen(f) : 0;
    if (b->view.itemsize != 8 || fl == 0 || f[fl - 1] != 'd' || (fl == 2 && f[0] != '<' && f[0] != '=' && f[0] != '@')
        || fl > 2) {
        PyErr_Format(PyExc_TypeError, "%s: a contiguous float64 array is expected", what);
        return NULL;
    }
    if (expect >= 0 && b->view.len / 8 != expect) {
        PyErr_Format(PyExc_ValueError, "%s: %zd values expected, got %zd", what, expect, b->view.len / 8);
        return NULL;
    }
    return (double *)b->view.buf;
}

static void
release(Buf *b)
{
    if (b->held) {
        PyBuffer_Release(&b->view);
        b->held = 0;
    }
}

/* the float64 buffers of args[0 .. count): p[i] holds sizes[i] values, named names[i] in errors, writable from index
 * `writable` on; 0 with the exception set at the first that fails (an empty buffer may give NULL without one).  The
 * caller releases b[0 .. count) with release_all either way. */
static int
get_all(PyObject *const *args, int count, Buf *b, double **p, const Py_ssize_t *sizes, const char *const *names,
        int writable)
{
    memset(b, 0, (size_t)count * sizeof(Buf));
    for (int i = 0; i < count; i++)
        if (!(p[i] = get_doubles(args[i], &b[i], sizes[i], i >= writable, names[i])) && PyErr_Occurred())
            return 0;
    return 1;
}

static void
release_all(Buf *b, int count)
{
    for (int i = 0; i < count; i++)
        release(&b[i]);
}

/* a copy of a float64 buffer into newly allocated memory */
static double *
copy_doubles(PyObject *obj, Py_ssize_t expect, const char *what)
{
    Buf b = {0};
    double *src = get_doubles(obj, &b, expect, 0, what);
    if (!src) {
        release(&b);
        return NULL;
    }
    Py_ssize_t n = b.view.len / 8;
    double *dst = PyMem_Calloc(n > 0 ? n : 1, sizeof(double));
    if (!dst) {
        release(&b);
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(dst, src, n * sizeof(double));
    release(&b);
    return dst;
}

static int *
int_list(PyObject *seq, Py_ssize_t *count, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int *out = PyMem_Calloc(n > 0 ? n : 1, sizeof(int));
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(out);
            Py_DECREF(fast);
            return NULL;
        }
        out[i] = (int)v;
    }
    Py_DECREF(fast);
    *count = n;
    return out;
}

/* ----------------------------------------------------------------------------------- small dense algebra */

/* LU factorization with partial pivoting of the N×N row-major matrix A (in place, as LAPACK's dgetrf: the
 * unit lower and the upper factor); 0 on success, 1 at an exactly zero pivot (dgetrf's info > 0). */
static int
lu_factor(double *A, int *piv, int N)
{
    for (int k = 0; k < N; k++) {
        int p = k;
        double best = fabs(A[k * N + k]);
        for (int i = k + 1; i < N; i++) {
            double v = fabs(A[i * N + k]);
            if (v > best) {
                best = v;
                p = i;
            }
        }
        piv[k] = p;
        if (A[p * N + k] == 0.0)
            return 1;
        if (p != k)
            for (int j = 0; j < N; j++) {
                double t = A[k * N + j];
                A[k * N + j] = A[p * N + j];
                A[p * N + j] = t;
            }
        double d = A[k * N + k];
        for (int i = k + 1; i < N; i++) {
            double l = A[i * N + k] / d;
            A[i * N + k] = l;
            if (l != 0.0)
                for (int j = k + 1; j < N; j++)
                    A[i * N + j] -= l * A[k * N + j];
        }
    }
    return 0;
}

static void
lu_solve(const double *LU, const int *piv, int N, double *b)
{
    for (int k = 0; k < N; k++) {
        int p = piv[k];
        if (p != k) {
            double t = b[k];
            b[k] = b[p];
            b[p] = t;
        }
    }
    for (int i = 1; i < N; i++) {
        double s = b[i];
        for (int j = 0; j < i; j++)
            s -= LU[i * N + j] * b[j];
        b[i] = s;
    }
    for (int i = N - 1; i >= 0; i--) {
        double s = b[i];
        for (int j = i + 1; j < N; j++)
            s -= LU[i * N + j] * b[j];
        b[i] = s / LU[i * N + i];
    }
}

/* max |xᵢ| (0 for none); a NaN propagates */
static double
max_abs(const double *x, Py_ssize_t n)
{
    double mx = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = fabs(x[i]);
        if (v != v)
            return v;
        if (v > mx)
            mx = v;
    }
    return mx;
}

static int
is_sane(const double *x, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += x[i] * x[i];
    return s < SANE_NORM2;        /* NaN compares false */
}

/* ============================================================================================ MechanismKernel */
/* A loop over rows that touches no Python object runs without the GIL (another thread's filter bank runs meanwhile),
 * holding its kernel's `busy` lock */
#define KERNEL_LOOP_BEGIN(k) Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock((k)->busy, WAIT_LOCK);
#define KERNEL_LOOP_END(k) PyThread_release_lock((k)->busy); Py_END_ALLOW_THREADS
typedef struct {
    PyObject_HEAD
    int n, m, ne, r, N;        /* coordinates, constraint rows, extended coordinates, independent rows, n + r */
    double *Ht;                /* m × (ne+1) × (ne+1): Φᵢ = ½ qe1ᵀ H̃ᵢ qe1 over qe1 = [q, fixed values, 1] */
    /* its non-zeros (a distance or slider row touches a few coordinates), row (i, j) = i·(ne+1) + j: all of
     * them (T = H̃ qe1), and those of the coordinates' part j, l < n (Hessian products) */
    int *hp, *hc, *np_, *nc;
    double *hv, *nv;
    double *tail;              /* the fixed values, then 1 (ne + 1 − n) */
    int nang;
    int *ang_row, *ang_idx;    /* per relative angle: its row, its 5 extended indices (x0, y0, x1, y1, θ) */
    double *ang_L;
    double *M;                 /* n × n */
    int *rows;                 /* the r independent rows */
    int na;
    int *act;                  /* the actuated coordinates, in actuator order */
    int nmodes;
    int *modes;                /* per assembly-mode indicator: the extended x, y columns of its points i, j, k */
    /* the actuators' friction F(q̇) = b q̇ + g atan(q̇ / v_s), g = c·2/π, a force −F on its coordinate (mbfg_ros.model
     * .friction): per friction coordinate its column, b, g, v_s */
    int nf;
    int *fcol;
    double *fb, *fg, *fvs;
    /* work (the last evaluation) */
    int positions_valid;       /* qe1[:n] is the q of T, Φ, Φq and the curvatures (several units read them) */
    double *qe1, *T, *phi, *J, *Jd, *c2, *c3;
    double *lu, *Kinv, *col, *x, *low, *W, *lam, *tmp;
    int *piv;
    /* where K is singular the kernel has no solver: the caller's (the null-space solver's) linearizations at such
     * points, given with `supply`, up to SUPPLIED of them (the oldest replaced), each its key (q, q̇, Q: 3n) and its
     * values (q̈, ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q, λ: n + 3n² + m); `missed` the last such point without one (3n) */
    int nsup, supnext, missed;
    double *sup_key, *sup_val, *miss;
    /* held, without the GIL, by the methods that release it for their loop over rows (the tuner's filter banks run
     * in threads, each with a kernel of its own; the lock keeps two such calls on one kernel from sharing its work
     * buffers: a kernel's methods are for one caller at a time) */
    PyThread_type_lock busy;
} MechanismKernel;

#define SUPPLIED 8

static void
mech_free_arrays(MechanismKernel *k)
{
    void *arrs[] = {k->hp, k->hc, k->hv, k->np_, k->nc, k->nv, k->Ht, k->tail, k->ang_row, k->ang_idx, k->ang_L, k->M, k->rows, k->act, k->modes, k->qe1, k->T, k->phi, k->J,
                    k->Jd, k->c2, k->c3, k->lu, k->Kinv, k->col, k->x, k->low, k->W, k->lam, k->tmp, k->piv, k->fcol,
                    k->fb, k->fg, k->fvs, k->sup_key, k->sup_val, k->miss};
    for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++)
        PyMem_Free(arrs[i]);
    if (k->busy)
        PyThread_free_lock(k->busy);
    k->busy = NULL;
}

static void
mech_dealloc(MechanismKernel *k)
{
    mech_free_arrays(k);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

/* MechanismKernel(n, Ht, tail, angles, M, rows, actuated, modes[, friction]): Ht (m, ne+1, ne+1) flat, tail =
 * [fixed values, 1], angles = [(row, i0, i1, i2, i3, i4, L), ...], M (n, n) flat, rows = the independent rows,
 * actuated = the actuated coordinates in actuator order, modes = the assembly-mode indicators' extended columns
 * (xi, yi, xj, yj, xk, yk) flat, friction = [(column, b, c, v_s), ...] (none by default). */
static int
mech_init(MechanismKernel *k, PyObject *args, PyObject *kw)
{
    int n;
    PyObject *Ht, *tail, *angles, *M, *rows, *actuated, *modes, *friction = NULL;
    if (!PyArg_ParseTuple(args, "iOOOOOOO|O", &n, &Ht, &tail, &angles, &M, &rows, &actuated, &modes, &friction))
        return -1;
    mech_free_arrays(k);
    memset(((char *)k) + sizeof(PyObject), 0, sizeof(MechanismKernel) - sizeof(PyObject));
    if (!(k->busy = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        return -1;
    }
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "MechanismKernel: n must be positive");
        return -1;
    }
    k->n = n;
    Buf b = {0};
    if (!get_doubles(tail, &b, -1, 0, "MechanismKernel tail")) {
        release(&b);
        return -1;
    }
    k->ne = n + (int)(b.view.len / 8) - 1;
    release(&b);
    if (k->ne < n) {
        PyErr_SetString(PyExc_ValueError, "MechanismKernel: tail must end with 1");
        return -1;
    }
    int w = k->ne + 1;
    if (!get_doubles(Ht, &b, -1, 0, "MechanismKernel Ht")) {
        release(&b);
        return -1;
    }
    Py_ssize_t hl = b.view.len / 8;
    release(&b);
    if (hl % (w * w)) {
        PyErr_SetString(PyExc_ValueError, "MechanismKernel: Ht is not m × (ne+1) × (ne+1)");
        return -1;
    }
    k->m = (int)(hl / (w * w));
    if (!(k->Ht = copy_doubles(Ht, hl, "MechanismKernel Ht")) || !(k->tail = copy_doubles(tail, w - n, "tail"))
        || !(k->M = copy_doubles(M, (Py_ssize_t)n * n, "MechanismKernel M")))
        return -1;
    Py_ssize_t nr;
    if (!(k->rows = int_list(rows, &nr, "MechanismKernel rows")))
        return -1;
    k->r = (int)nr;
    k->N = n + k->r;
    Py_ssize_t nact;
    if (!(k->act = int_list(actuated, &nact, "MechanismKernel actuated")))
        return -1;
    k->na = (int)nact;
    Py_ssize_t nmc;
    if (!(k->modes = int_list(modes, &nmc, "MechanismKernel modes")))
        return -1;
    if (nmc % 6) {
        PyErr_SetString(PyExc_ValueError, "MechanismKernel: modes must be 6 columns per indicator");
        return -1;
    }
    k->nmodes = (int)(nmc / 6);
    for (int t = 0; t < k->na; t++)
        if (k->act[t] < 0 || k->act[t] >= n) {
            PyErr_SetString(PyExc_ValueError, "MechanismKernel: actuated coordinate out of range");
            return -1;
        }
    PyObject *fast = PySequence_Fast(angles, "MechanismKernel angles");
    if (!fast)
        return -1;
    k->nang = (int)PySequence_Fast_GET_SIZE(fast);
    k->ang_row = PyMem_Calloc(k->nang + 1, sizeof(int));
    k->ang_idx = PyMem_Calloc(5 * k->nang + 1, sizeof(int));
    k->ang_L = PyMem_Calloc(k->nang + 1, sizeof(double));
    for (int a = 0; a < k->nang; a++) {
        int row, i0, i1, i2, i3, i4;
        double L;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, a), "iiiiiid", &row, &i0, &i1, &i2, &i3, &i4, &L)) {
            Py_DECREF(fast);
            return -1;
        }
        k->ang_row[a] = row;
        int *ix = k->ang_idx + 5 * a;
        ix[0] = i0, ix[1] = i1, ix[2] = i2, ix[3] = i3, ix[4] = i4;
        k->ang_L[a] = L;
    }
    Py_DECREF(fast);
    if (friction) {
        if (!(fast = PySequence_Fast(friction, "MechanismKernel friction")))
            return -1;
        k->nf = (int)PySequence_Fast_GET_SIZE(fast);
        k->fcol = PyMem_Calloc(k->nf + 1, sizeof(int));
        k->fb = PyMem_Calloc(k->nf + 1, sizeof(double));
        k->fg = PyMem_Calloc(k->nf + 1, sizeof(double));
        k->fvs = PyMem_Calloc(k->nf + 1, sizeof(double));
        if (!k->fcol || !k->fb || !k->fg || !k->fvs) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            return -1;
        }
        for (int f = 0; f < k->nf; f++) {
            double c;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, f), "iddd", &k->fcol[f], &k->fb[f], &c, &k->fvs[f])) {
                Py_DECREF(fast);
                return -1;
            }
            k->fg[f] = (2.0 / M_PI) * c;
            if (k->fcol[f] < 0 || k->fcol[f] >= n || !(k->fvs[f] > 0.0)) {
                Py_DECREF(fast);
                PyErr_SetString(PyExc_ValueError, "MechanismKernel: friction column out of range or v_s <= 0");
                return -1;
            }
        }
        Py_DECREF(fast);
    }
    int m = k->m, N = k->N;
    k->qe1 = PyMem_Calloc(w, sizeof(double));
    k->T = PyMem_Calloc((size_t)m * w + 1, sizeof(double));
    k->phi = PyMem_Calloc(m + 1, sizeof(double));
    k->J = PyMem_Calloc((size_t)m * n + 1, sizeof(double));
    k->Jd = PyMem_Calloc((size_t)m * n + 1, sizeof(double));
    k->c2 = PyMem_Calloc(k->nang + 1, sizeof(double));
    k->c3 = PyMem_Calloc(k->nang + 1, sizeof(double));
    k->lu = PyMem_Calloc((size_t)N * N, sizeof(double));
    k->Kinv = PyMem_Calloc((size_t)N * N, sizeof(double));
    k->col = PyMem_Calloc(N, sizeof(double));
    k->x = PyMem_Calloc(N, sizeof(double));
    k->low = PyMem_Calloc((size_t)m * n + 1, sizeof(double));
    k->W = PyMem_Calloc((size_t)n * n, sizeof(double));
    k->lam = PyMem_Calloc(m + 1, sizeof(double));
    k->tmp = PyMem_Calloc((size_t)N * n + n, sizeof(double));
    k->piv = PyMem_Calloc(N, sizeof(int));
    k->sup_key = PyMem_Calloc((size_t)SUPPLIED * 3 * n, sizeof(double));
    k->sup_val = PyMem_Calloc((size_t)SUPPLIED * (n + 3 * (size_t)n * n + m), sizeof(double));
    k->miss = PyMem_Calloc(3 * (size_t)n, sizeof(double));
    if (!k->ang_row || !k->ang_idx || !k->ang_L || !k->qe1 || !k->T || !k->phi || !k->J || !k->Jd || !k->c2
        || !k->c3 || !k->lu || !k->Kinv || !k->col || !k->x || !k->low || !k->W || !k->lam || !k->tmp || !k->piv
        || !k->sup_key || !k->sup_val || !k->miss) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < k->r; i++)
        if (k->rows[i] < 0 || k->rows[i] >= m) {
            PyErr_SetString(PyExc_ValueError, "MechanismKernel: independent row out of range");
            return -1;
        }
    for (int t = 0; t < 6 * k->nmodes; t++)
        if (k->modes[t] < 0 || k->modes[t] >= k->ne) {
            PyErr_SetString(PyExc_ValueError, "MechanismKernel: assembly-mode column out of range");
            return -1;
        }
    for (int a = 0; a < k->nang; a++) {
        if (k->ang_row[a] < 0 || k->ang_row[a] >= m) {
            PyErr_SetString(PyExc_ValueError, "MechanismKernel: angle row out of range");
            return -1;
        }
        for (int j = 0; j < 5; j++)
            if (k->ang_idx[5 * a + j] < 0 || k->ang_idx[5 * a + j] >= k->ne) {
                PyErr_SetString(PyExc_ValueError, "MechanismKernel: angle index out of range");
                return -1;
            }
    }
    /* the non-zeros of H̃ by (i, j) row, and of its coordinates' part */
    size_t rowsH = (size_t)m * w, nnz = 0, nnzn = 0;
    for (size_t t = 0; t < rowsH * w; t++)
        if (k->Ht[t] != 0.0) {
            nnz++;
            if ((int)((t / w) % w) < n && (int)(t % w) < n)
                nnzn++;
        }
    k->hp = PyMem_Calloc(rowsH + 1, sizeof(int));
    k->hc = PyMem_Calloc(nnz + 1, sizeof(int));
    k->hv = PyMem_Calloc(nnz + 1, sizeof(double));
    k->np_ = PyMem_Calloc(rowsH + 1, sizeof(int));
    k->nc = PyMem_Calloc(nnzn + 1, sizeof(int));
    k->nv = PyMem_Calloc(nnzn + 1, sizeof(double));
    if (!k->hp || !k->hc || !k->hv || !k->np_ || !k->nc || !k->nv) {
        PyErr_NoMemory();
        return -1;
    }
    size_t e = 0, en = 0;
    for (size_t row = 0; row < rowsH; row++) {
        k->hp[row] = (int)e;
        k->np_[row] = (int)en;
        int j = (int)(row % w);
        for (int l = 0; l < w; l++) {
            double h = k->Ht[row * w + l];
            if (h == 0.0)
                continue;
            k->hc[e] = l, k->hv[e] = h, e++;
            if (j < n && l < n)
                k->nc[en] = l, k->nv[en] = h, en++;
        }
    }
    k->hp[rowsH] = (int)e;
    k->np_[rowsH] = (int)en;
    return 0;
}

/* Φ, T = H̃ qe1 (whose first n columns are Φq) and the angles' curvatures (∂²φ/∂θ², ∂³φ/∂θ³) at q */
static void
mk_positions(MechanismKernel *k, const double *q)
{
    int n = k->n, m = k->m, w = k->ne + 1;
    double *qe1 = k->qe1;
    if (k->positions_valid && memcmp(qe1, q, n * sizeof(double)) == 0)
        return;
    k->positions_valid = 1;
    memcpy(qe1, q, n * sizeof(double));
    memcpy(qe1 + n, k->tail, (w - n) * sizeof(double));
    for (int i = 0; i < m; i++) {
        double *Ti = k->T + (size_t)i * w;
        double p = 0.0;
        for (int j = 0; j < w; j++) {
            size_t row = (size_t)i * w + j;
            double s = 0.0;
            for (int e = k->hp[row]; e < k->hp[row + 1]; e++)
                s += k->hv[e] * qe1[k->hc[e]];
            Ti[j] = s;
            p += s * qe1[j];
        }
        k->phi[i] = 0.5 * p;
    }
    for (int a = 0; a < k->nang; a++) {
        const int *ix = k->ang_idx + 5 * a;
        double L = k->ang_L[a], th = qe1[ix[4]];
        double s = sin(th), c = cos(th);
        double *Ti = k->T + (size_t)k->ang_row[a] * w;
        if (fabs(s) > 0.7071067811865475) {        /* Δx − L cos θ */
            k->phi[k->ang_row[a]] = qe1[ix[2]] - qe1[ix[0]] - L * c;
            Ti[ix[0]] = -1.0, Ti[ix[1]] = 0.0, Ti[ix[2]] = 1.0, Ti[ix[3]] = 0.0, Ti[ix[4]] = L * s;
            k->c2[a] = L * c;
            k->c3[a] = -L * s;
        } else {                                    /* Δy − L sin θ */
            k->phi[k->ang_row[a]] = qe1[ix[3]] - qe1[ix[1]] - L * s;
            Ti[ix[0]] = 0.0, Ti[ix[1]] = -1.0, Ti[ix[2]] = 0.0, Ti[ix[3]] = 1.0, Ti[ix[4]] = -L * c;
            k->c2[a] = L * s;
            k->c3[a] = L * c;
        }
    }
    for (int i = 0; i < m; i++)
        memcpy(k->J + (size_t)i * n, k->T + (size_t)i * w, n * sizeof(double));
}

/* out (m × n) = ∂(Φq w)/∂q at the last mk_positions (w = q̇: Φ̇q) */
static void
mk_hessian_vector(MechanismKernel *k, const double *wv, double *out)
{
    int n = k->n, m = k->m, w = k->ne + 1;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            size_t row = (size_t)i * w + j;
            double s = 0.0;
            for (int e = k->np_[row]; e < k->np_[row + 1]; e++)
                s += k->nv[e] * wv[k->nc[e]];
            out[(size_t)i * n + j] = s;
        }
    for (int a = 0; a < k->nang; a++) {
        int th = k->ang_idx[5 * a + 4];
        if (th < n)
            out[(size_t)k->ang_row[a] * n + th] = k->c2[a] * wv[th];
    }
}

/* out (m × n) += ∂(Φ̇q v)/∂q at fixed v, at the last mk_positions: the relative angles' third derivatives (the
 * quadratic rows have none) */
static void
mk_add_third(MechanismKernel *k, const double *v, double *out)
{
    int n = k->n;
    for (int a = 0; a < k->nang; a++) {
        int th = k->ang_idx[5 * a + 4];
        if (th < n)
            out[(size_t)k->ang_row[a] * n + th] += k->c3[a] * (v[th] * v[th]);
    }
}

/* W (n × n) = Σᵢ λᵢ ∂²Φᵢ/∂q² = ∂(Φqᵀ λ)/∂q at the last mk_positions */
static void
mk_weighted_hessian(MechanismKernel *k, const double *lam, double *W)
{
    int n = k->n, m = k->m, w = k->ne + 1;
    memset(W, 0, (size_t)n * n * sizeof(double));
    for (int i = 0; i < m; i++) {
        double li = lam[i];
        if (li == 0.0)
            continue;
        for (int j = 0; j < n; j++) {
            size_t row = (size_t)i * w + j;
            double *Wj = W + (size_t)j * n;
            for (int e = k->np_[row]; e < k->np_[row + 1]; e++)
                Wj[k->nc[e]] += li * k->nv[e];
        }
    }
    for (int a = 0; a < k->nang; a++) {
        int th = k->ang_idx[5 * a + 4];
        if (th < n)
            W[(size_t)th * n + th] += k->c2[a] * lam[k->ang_row[a]];
    }
}

/* the augmented matrix K = [[M, Jᵣᵀ], [Jᵣ, 0]] (independent rows) and its LU in k->lu; 0 on success */
static int
mk_factor(MechanismKernel *k)
{
    int n = k->n, N = k->N;
    double *K = k->lu;
    memset(K, 0, (size_t)N * N * sizeof(double));
    for (int i = 0; i < n; i++)
        memcpy(K + (size_t)i * N, k->M + (size_t)i * n, n * sizeof(double));
    for (int t = 0; t < k->r; t++) {
        const double *Jr = k->J + (size_t)k->rows[t] * n;
        for (int j = 0; j < n; j++) {
            K[(size_t)(n + t) * N + j] = Jr[j];
            K[(size_t)j * N + n + t] = Jr[j];
        }
    }
    return lu_factor(K, k->piv, N);
}

/* the actuators' friction force F = b w + g atan(w / v_s) of friction coordinate f at its rate w */
static inline double
mk_friction(const MechanismKernel *k, int f, double w)
{
    return k->fb[f] * w + k->fg[f] * atan(w / k->fvs[f]);
}

/* rhs of the augmented system: [Q − F(q̇); −Φ̇qᵣ q̇] into x (F the actuators' friction) */
static void
mk_rhs(MechanismKernel *k, const double *v, const double *Q, double *x)
{
    int n = k->n;
    memcpy(x, Q, n * sizeof(double));
    for (int f = 0; f < k->nf; f++) {
        x[k->fcol[f]] -= mk_friction(k, f, v[k->fcol[f]]);
    }
    for (int t = 0; t < k->r; t++) {
        const double *Jd = k->Jd + (size_t)k->rows[t] * n;
        double s = 0.0;
        for (int j = 0; j < n; j++)
            s += Jd[j] * v[j];
        x[n + t] = -s;
    }
}

/* at a point where K is singular or the solution not sane: the linearization supplied for (q, q̇, Q) into the
 * outputs (any may be NULL), 0; else 1, the point kept as `missed` for the caller to supply */
static int
mk_supplied(MechanismKernel *k, const double *q, const double *v, const double *Q, double *a, double *da_dq,
            double *da_dv, double *da_dQ, double *lam)
{
    int n = k->n, m = k->m;
    size_t nn = (size_t)n * n, vw = n + 3 * nn + m, kb = n * sizeof(double);
    for (int t = 0; t < k->nsup; t++) {
        const double *key = k->sup_key + (size_t)t * 3 * n;
        if (memcmp(key, q, kb) || memcmp(key + n, v, kb) || memcmp(key + 2 * n, Q, kb))
            continue;
        const double *val = k->sup_val + (size_t)t * vw;
        if (a)
            memcpy(a, val, kb);
        if (da_dq)
            memcpy(da_dq, val + n, nn * sizeof(double));
        if (da_dv)
            memcpy(da_dv, val + n + nn, nn * sizeof(double));
        if (da_dQ)
            memcpy(da_dQ, val + n + 2 * nn, nn * sizeof(double));
        if (lam)
            memcpy(lam, val + n + 3 * nn, m * sizeof(double));
        return 0;
    }
    memcpy(k->miss, q, kb);
    memcpy(k->miss + n, v, kb);
    memcpy(k->miss + 2 * n, Q, kb);
    k->missed = 1;
    return 1;
}

/* q̈ (n) at (q, q̇, Q) by one LU solve (no derivatives); 0 on success, 1 where K is singular or q̈ not sane (and
 * nothing supplied there) */
static int
mk_acceleration(MechanismKernel *k, const double *q, const double *v, const double *Q, double *a)
{
    mk_positions(k, q);
    mk_hessian_vector(k, v, k->Jd);
    if (mk_factor(k))
        return mk_supplied(k, q, v, Q, a, NULL, NULL, NULL, NULL);
    mk_rhs(k, v, Q, k->x);
    lu_solve(k->lu, k->piv, k->N, k->x);
    if (!is_sane(k->x, k->N))
        return mk_supplied(k, q, v, Q, a, NULL, NULL, NULL, NULL);
    memcpy(a, k->x, k->n * sizeof(double));
    return 0;
}

/* ∂q̈/∂q and ∂q̈/∂q̇ at the last mk_positions and Φ̇q (k->Jd) from q̈ (a), λ (all rows) and the first n rows [A B]
 * of K⁻¹ (AB: n rows of N; from the LU here, or the caller's null-space solver where K is singular).
 * Differentiating M q̈ + Φqᵀλ = Q − F(q̇), Φq q̈ = −Φ̇q q̇ gives
 * K ∂[q̈; λ] = [−Σλᵢ∂²Φᵢ ∂q − ∂F/∂q̇ ∂q̇; −low ∂q − 2 Φ̇q ∂q̇] + [∂Q; 0] with low = ∂(Φq q̈)/∂q + ∂(Φ̇q q̇)/∂q
 * (independent rows), hence ∂q̈/∂q = −(A W + B lowᵣ), W = Σλᵢ∂²Φᵢ, and ∂q̈/∂q̇ = −2 B Φ̇qᵣ − A ∂F/∂q̇ (∂q̈/∂Q = A) */
static void
mk_derivatives(MechanismKernel *k, const double *v, const double *a, const double *lam, const double *AB,
               double *da_dq, double *da_dv)
{
    int n = k->n, N = k->N, r = k->r;
    double *low = k->low, *W = k->W;
    mk_hessian_vector(k, a, low);
    mk_add_third(k, v, low);
    mk_weighted_hessian(k, lam, W);
    for (int i = 0; i < n; i++) {
        const double *Ai = AB + (size_t)i * N, *Bi = Ai + n;
        for (int j = 0; j < n; j++) {
            double s = 0.0, sv = 0.0;
            for (int l = 0; l < n; l++)
                s += Ai[l] * W[(size_t)l * n + j];
            for (int t = 0; t < r; t++) {
                s += Bi[t] * low[(size_t)k->rows[t] * n + j];
                sv += Bi[t] * k->Jd[(size_t)k->rows[t] * n + j];
            }
            da_dq[(size_t)i * n + j] = -s;
            da_dv[(size_t)i * n + j] = -2.0 * sv;
        }
    }
    /* friction, column by friction coordinate */
    for (int f = 0; f < k->nf; f++) {
        int c = k->fcol[f];
        double s = v[c] / k->fvs[f];
        double slope = k->fb[f] + (k->fg[f] / k->fvs[f]) / (1.0 + s * s);
        for (int i = 0; i < n; i++)
            da_dv[(size_t)i * n + c] -= AB[(size_t)i * N + c] * slope;
    }
}

/* the dynamics linearization at (q, q̇, Q): q̈, ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q = K⁻¹[:n, :n], λ (all rows), with Φq and Φ̇q
 * of all rows left in k->J, k->Jd (Q without the friction, which mk_rhs applies).  0 on success (a supplied
 * linearization where K is singular), 1 where K is singular or the solution not sane and nothing is supplied. */
static int
mk_linearize(MechanismKernel *k, const double *q, const double *v, const double *Q, double *a, double *da_dq,
             double *da_dv, double *da_dQ, double *lam)
{
    int n = k->n, m = k->m, N = k->N, r = k->r;
    mk_positions(k, q);
    mk_hessian_vector(k, v, k->Jd);
    if (mk_factor(k))
        return mk_supplied(k, q, v, Q, a, da_dq, da_dv, da_dQ, lam);
    /* the top n rows [A B] of K⁻¹, which turn the derivatives into products: K is symmetric, so they are the
     * transposed first n columns, n solves (not N) */
    double *Kinv = k->Kinv, *col = k->col;
    for (int j = 0; j < n; j++) {
        memset(col, 0, N * sizeof(double));
        col[j] = 1.0;
        lu_solve(k->lu, k->piv, N, col);
        memcpy(Kinv + (size_t)j * N, col, N * sizeof(double));
    }
    double *x = k->x;
    mk_rhs(k, v, Q, x);
    lu_solve(k->lu, k->piv, N, x);
    if (!is_sane(x, N))
        return mk_supplied(k, q, v, Q, a, da_dq, da_dv, da_dQ, lam);
    memcpy(a, x, n * sizeof(double));
    memset(lam, 0, m * sizeof(double));
    for (int t = 0; t < r; t++)
        lam[k->rows[t]] = x[n + t];
    mk_derivatives(k, v, a, lam, Kinv, da_dq, da_dv);
    for (int i = 0; i < n; i++)
        memcpy(da_dQ + (size_t)i * n, Kinv + (size_t)i * N, n * sizeof(double));
    return 0;
}

/* --- Python methods of MechanismKernel */

static int
mk_check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *name)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    return 0;
}

/* the number of states N in a buffer of q (N·n values; N may be 0), or -1 with an exception */
static Py_ssize_t
mk_states(MechanismKernel *k, PyObject *obj, Buf *b, double **q)
{
    *q = get_doubles(obj, b, -1, 0, "q");
    if (!*q)
        return -1;
    Py_ssize_t len = b->view.len / 8;
    if (len % k->n) {
        PyErr_Format(PyExc_ValueError, "q: a multiple of %d values expected, got %zd", k->n, len);
        return -1;
    }
    return len / k->n;
}

/* phi_and_jacobian(q, phi_out, J_out): Φ (N × m) and Φq (N × m × n) of N states q (N × n) */
static PyObject *
mk_py_phi_and_jacobian(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 3, "phi_and_jacobian") < 0)
        return NULL;
    Buf bq = {0}, bp = {0}, bj = {0};
    PyObject *ret = NULL;
    double *q;
    Py_ssize_t S = mk_states(k, args[0], &bq, &q);
    int n = k->n, m = k->m;
    double *phi = NULL, *J = NULL;
    /* (an empty buffer may have no address: the error indicator says whether a buffer was refused) */
    if (S >= 0 && ((phi = get_doubles(args[1], &bp, S * m, 1, "phi")) || !PyErr_Occurred())
        && ((J = get_doubles(args[2], &bj, S * m * n, 1, "J")) || !PyErr_Occurred())) {
        for (Py_ssize_t s = 0; s < S; s++) {
            mk_positions(k, q + s * n);
            memcpy(phi + s * m, k->phi, m * sizeof(double));
            memcpy(J + s * m * n, k->J, (size_t)m * n * sizeof(double));
        }
        ret = Py_NewRef(Py_None);
    }
    release(&bq), release(&bp), release(&bj);
    return ret;
}

/* max_abs_phi(q) -> max |Φ(q)| (0 without constraints; NaN propagates) */
static PyObject *
mk_py_max_abs_phi(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 1, "max_abs_phi") < 0)
        return NULL;
    Buf bq = {0};
    double *q = get_doubles(args[0], &bq, k->n, 0, "q");
    if (!q) {
        release(&bq);
        return NULL;
    }
    mk_positions(k, q);
    release(&bq);
    return PyFloat_FromDouble(max_abs(k->phi, k->m));
}

/* the per-state products of N states: 0 hessian_vector ∂(Φq w)/∂q (w = q̇: Φ̇q), 1 ∂(Φ̇q v)/∂q at fixed v (both
 * m × n), 2 Σᵢ λᵢ ∂²Φᵢ/∂q² (n × n; the second argument is λ, m per state) */
static PyObject *
mk_products(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs, int what, const char *name)
{
    if (mk_check_nargs(nargs, 3, name) < 0)
        return NULL;
    Buf bq = {0}, bv = {0}, bo = {0};
    PyObject *ret = NULL;
    double *q;
    Py_ssize_t S = mk_states(k, args[0], &bq, &q);
    int n = k->n, m = k->m;
    Py_ssize_t per_in = what == 2 ? m : n, per_out = what == 2 ? (Py_ssize_t)n * n : (Py_ssize_t)m * n;
    double *v = NULL, *out = NULL;
    if (S >= 0 && ((v = get_doubles(args[1], &bv, S * per_in, 0, what == 2 ? "lam" : "v")) || !PyErr_Occurred())
        && ((out = get_doubles(args[2], &bo, S * per_out, 1, "out")) || !PyErr_Occurred())) {
        for (Py_ssize_t s = 0; s < S; s++) {
            double *o = out + s * per_out;
            const double *vs = v + s * per_in;
            mk_positions(k, q + s * n);
            if (what == 0)
                mk_hessian_vector(k, vs, o);
            else if (what == 1) {
                memset(o, 0, per_out * sizeof(double));
                mk_add_third(k, vs, o);
            } else
                mk_weighted_hessian(k, vs, o);
        }
        ret = Py_NewRef(Py_None);
    }
    release(&bq), release(&bv), release(&bo);
    return ret;
}

/* jacobian_dot(q, w, out): ∂(Φq w)/∂q (N × m × n) of N states; with w = q̇ this is Φ̇q */
static PyObject *
mk_py_jacobian_dot(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    return mk_products(k, args, nargs, 0, "jacobian_dot");
}

/* jacobian_dot_times_v_derivative(q, v, out): ∂(Φ̇q(q, v) v)/∂q at fixed v (N × m × n) of N states */
static PyObject *
mk_py_third(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    return mk_products(k, args, nargs, 1, "jacobian_dot_times_v_derivative");
}

/* weighted_hessian(q, lam, out): Σᵢ λᵢ ∂²Φᵢ/∂q² (N × n × n) of N states */
static PyObject *
mk_py_weighted_hessian(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    return mk_products(k, args, nargs, 2, "weighted_hessian");
}

/* friction(v, out): the friction force F(q̇) per friction coordinate (N × nf) of N rates v (N × n) */
static PyObject *
mk_py_friction(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 2, "friction") < 0)
        return NULL;
    Buf bv = {0}, bo = {0};
    PyObject *ret = NULL;
    double *v, *out = NULL;
    Py_ssize_t S = mk_states(k, args[0], &bv, &v);
    if (S >= 0 && ((out = get_doubles(args[1], &bo, S * k->nf, 1, "out")) || !PyErr_Occurred())) {
        for (Py_ssize_t s = 0; s < S; s++)
            for (int f = 0; f < k->nf; f++)
                out[s * k->nf + f] = mk_friction(k, f, v[s * k->n + k->fcol[f]]);
        ret = Py_NewRef(Py_None);
    }
    release(&bv), release(&bo);
    return ret;
}

/* derivatives(q, v, a, lam, AB, da_dq, da_dv): ∂q̈/∂q, ∂q̈/∂q̇ from q̈, λ (all rows) and the first n rows [A B]
 * of K⁻¹ (n × (n + r)) of another solver (the null-space solver of a singular K) */
static PyObject *
mk_py_derivatives(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 7, "derivatives") < 0)
        return NULL;
    int n = k->n;
    Py_ssize_t nn = (Py_ssize_t)n * n, sizes[7] = {n, n, n, k->m, (Py_ssize_t)n * k->N, nn, nn};
    static const char *names[7] = {"q", "v", "a", "lam", "AB", "da_dq", "da_dv"};
    Buf b[7];
    double *p[7];
    int ok = get_all(args, 7, b, p, sizes, names, 5);
    if (ok) {
        mk_positions(k, p[0]);
        mk_hessian_vector(k, p[1], k->Jd);
        mk_derivatives(k, p[1], p[2], p[3], p[4], p[5], p[6]);
    }
    release_all(b, 7);
    return ok ? Py_NewRef(Py_None) : NULL;
}

/* supply(q, v, Q, a, da_dq, da_dv, da_dQ, lam): the linearization at a point where K is singular (the caller's
 * null-space solver), which the kernel then takes there */
static PyObject *
mk_py_supply(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 8, "supply") < 0)
        return NULL;
    int n = k->n, m = k->m;
    Py_ssize_t nn = (Py_ssize_t)n * n, sizes[8] = {n, n, n, n, nn, nn, nn, m};
    static const char *names[8] = {"q", "v", "Q", "a", "da_dq", "da_dv", "da_dQ", "lam"};
    Buf b[8];
    double *p[8];
    int ok = get_all(args, 8, b, p, sizes, names, 8);
    if (ok) {
        int t = k->supnext;
        k->supnext = (t + 1) % SUPPLIED;
        if (k->nsup < SUPPLIED)
            k->nsup++;
        double *key = k->sup_key + (size_t)t * 3 * n, *val = k->sup_val + (size_t)t * (n + 3 * nn + m);
        for (int i = 0; i < 3; i++)
            memcpy(key + (size_t)i * n, p[i], n * sizeof(double));
        for (int i = 3, off = 0; i < 8; off += (int)sizes[i], i++)
            if (sizes[i])
                memcpy(val + off, p[i], sizes[i] * sizeof(double));
    }
    release_all(b, 8);
    return ok ? Py_NewRef(Py_None) : NULL;
}

/* missed(q_out, v_out, Q_out) -> bool: the last point where K was singular and nothing supplied (then forgotten) */
static PyObject *
mk_py_missed(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 3, "missed") < 0)
        return NULL;
    int n = k->n;
    Py_ssize_t sizes[3] = {n, n, n};
    static const char *names[3] = {"out", "out", "out"};
    Buf b[3];
    double *p[3];
    int ok = get_all(args, 3, b, p, sizes, names, 0);
    if (ok && k->missed)
        for (int i = 0; i < 3; i++)
            memcpy(p[i], k->miss + (size_t)i * n, n * sizeof(double));
    release_all(b, 3);
    if (!ok)
        return NULL;
    int was = k->missed;
    k->missed = 0;
    return PyBool_FromLong(was);
}

/* acceleration(q, v, Q, a_out) -> bool (False: K singular or q̈ not sane) */
static PyObject *
mk_py_acceleration(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 4, "acceleration") < 0)
        return NULL;
    Buf bq = {0}, bv = {0}, bQ = {0}, ba = {0};
    PyObject *ret = NULL;
    double *q = get_doubles(args[0], &bq, k->n, 0, "q");
    double *v = q ? get_doubles(args[1], &bv, k->n, 0, "v") : NULL;
    double *Q = v ? get_doubles(args[2], &bQ, k->n, 0, "Q") : NULL;
    double *a = Q ? get_doubles(args[3], &ba, k->n, 1, "a") : NULL;
    if (a)
        ret = PyBool_FromLong(mk_acceleration(k, q, v, Q, a) == 0);
    release(&bq), release(&bv), release(&bQ), release(&ba);
    return ret;
}

/* linearize(q, v, Q, a, da_dq, da_dv, da_dQ, lam, J, Jd) -> bool (False: K singular or not sane) */
static PyObject *
mk_py_linearize(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 10, "linearize") < 0)
        return NULL;
    int n = k->n, m = k->m;
    Py_ssize_t sizes[10] = {n, n, n, n, (Py_ssize_t)n * n, (Py_ssize_t)n * n, (Py_ssize_t)n * n, m,
                            (Py_ssize_t)m * n, (Py_ssize_t)m * n};
    static const char *names[10] = {"q", "v", "Q", "a", "da_dq", "da_dv", "da_dQ", "lam", "J", "Jd"};
    Buf b[10];
    double *p[10];
    PyObject *ret = NULL;
    if (get_all(args, 10, b, p, sizes, names, 3)) {
        int fail = mk_linearize(k, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
        if (!fail) {
            memcpy(p[8], k->J, (size_t)m * n * sizeof(double));
            memcpy(p[9], k->Jd, (size_t)m * n * sizeof(double));
        }
        ret = PyBool_FromLong(!fail);
    }
    release_all(b, 10);
    return ret;
}

/* The continuity predictor's Taylor step of a state x (D values, starting with q, q̇, q̈) over h into out (the other
 * blocks copied): q + h q̇ + (h²/2 q̈ + h³/6 j), q̇ + h q̈ + h²/2 j with the jerk j given, else the backward difference
 * of q̈ from ap (the q̈ h_prev earlier), else without it. */
static void
taylor(int n, const double *x, Py_ssize_t D, double h, const double *ap, double h_prev, const double *jerk,
       double *out)
{
    memcpy(out, x, D * sizeof(double));
    double h2 = 0.5 * h * h, h3 = h * h2 / 3.0;
    const double *q = x, *v = x + n, *a = x + 2 * n;
    for (int i = 0; i < n; i++) {
        if (jerk || ap) {
            double j = jerk ? jerk[i] : (a[i] - ap[i]) / h_prev;
            out[i] = q[i] + h * v[i] + (h2 * a[i] + h3 * j);
            out[n + i] = v[i] + h * a[i] + h2 * j;
        } else {
            out[i] = q[i] + h * v[i] + h2 * a[i];
            out[n + i] = v[i] + h * a[i];
        }
    }
}

/* taylor(x, h, a_prev, h_prev, jerk, out): the predictor's Taylor step alone (`taylor`; a_prev, jerk: None or n
 * values), for the step factors whose q̈ is not the kernel's prediction (the independent formulation, the hermite
 * velocity integrator's jerk). */
static PyObject *
mk_py_taylor(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 6, "taylor") < 0)
        return NULL;
    int n = k->n;
    Buf bx = {0}, ba = {0}, bj = {0}, bo = {0};
    PyObject *ret = NULL;
    double *ap = NULL, *jerk = NULL;
    double h = PyFloat_AsDouble(args[1]), h_prev = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        return NULL;
    double *x = get_doubles(args[0], &bx, -1, 0, "x");
    Py_ssize_t D = x ? bx.view.len / 8 : 0;
    double *out = x ? get_doubles(args[5], &bo, D, 1, "out") : NULL;
    if (!out)
        goto done;
    if (D < 3 * n) {
        PyErr_SetString(PyExc_ValueError, "taylor: the state is shorter than its q, q̇, q̈ blocks");
        goto done;
    }
    if (args[2] != Py_None && !(ap = get_doubles(args[2], &ba, n, 0, "a_prev")))
        goto done;
    if (args[4] != Py_None && !(jerk = get_doubles(args[4], &bj, n, 0, "jerk")))
        goto done;
    taylor(n, x, D, h, ap, h_prev, jerk, out);
    ret = Py_NewRef(Py_None);
done:
    release(&bx), release(&ba), release(&bj), release(&bo);
    return ret;
}

/* predict(x, h, a_prev, h_prev, Q_base, tau_start, out) -> ok
 * The continuity predictor of the state h after x (the layout starts with q, q̇, q̈; out gets a copy of x with
 * those replaced): q + h q̇ + (h²/2 q̈ + h³/6 j), q̇ + h q̈ + h²/2 j with the jerk j = (q̈ − a_prev)/h_prev (no
 * jerk terms where a_prev is None), then q̈ at the predicted (q, q̇) under Q = Q_base + E τ, τ = out[tau_start:]
 * (tau_start −1: Q_base): `taylor`, then one LU solve.  False where the dynamics are singular there (out's q̈ is then not set). */
static PyObject *
mk_py_predict(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 7, "predict") < 0)
        return NULL;
    int n = k->n;
    Buf bx = {0}, ba = {0}, bQ = {0}, bo = {0};
    PyObject *ret = NULL;
    double *ap = NULL;
    double h = PyFloat_AsDouble(args[1]), h_prev = PyFloat_AsDouble(args[3]);
    long tau_start = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    double *x = get_doubles(args[0], &bx, -1, 0, "x");
    Py_ssize_t D = x ? bx.view.len / 8 : 0;
    double *out = x ? get_doubles(args[6], &bo, D, 1, "out") : NULL;
    double *Qb = out ? get_doubles(args[4], &bQ, n, 0, "Q_base") : NULL;
    if (!Qb)
        goto done;
    if (D < 3 * n || (tau_start >= 0 && tau_start + k->na > D)) {
        PyErr_SetString(PyExc_ValueError, "predict: the state is shorter than its q, q̇, q̈ (and τ) blocks");
        goto done;
    }
    if (args[2] != Py_None && !(ap = get_doubles(args[2], &ba, n, 0, "a_prev")))
        goto done;
    taylor(n, x, D, h, ap, h_prev, NULL, out);
    double *Q = k->tmp;           /* (n values: the work buffer is N·n + n long) */
    memcpy(Q, Qb, n * sizeof(double));
    if (tau_start >= 0)
        for (int t = 0; t < k->na; t++)
            Q[k->act[t]] += out[tau_start + t];
    ret = PyBool_FromLong(mk_acceleration(k, out, out + n, Q, out + 2 * n) == 0);
done:
    release(&bx), release(&ba), release(&bQ), release(&bo);
    return ret;
}

/* summary(x) -> (max |Φ(q)|, x·x, max |q̇|, (±1 per assembly-mode indicator)) of a state whose layout starts with
 * q, q̇: what an estimate reports and is checked on.  NaN propagates into the first three. */
static PyObject *
mk_py_summary(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 1, "summary") < 0)
        return NULL;
    int n = k->n;
    Buf bx = {0};
    double *x = get_doubles(args[0], &bx, -1, 0, "x");
    if (!x) {
        release(&bx);
        return NULL;
    }
    Py_ssize_t D = bx.view.len / 8;
    if (D < 2 * n) {
        release(&bx);
        PyErr_SetString(PyExc_ValueError, "summary: the state is shorter than its q, q̇ blocks");
        return NULL;
    }
    mk_positions(k, x);
    double residual = max_abs(k->phi, k->m), speed = max_abs(x + n, n), norm2 = 0.0;
    for (Py_ssize_t i = 0; i < D; i++)
        norm2 += x[i] * x[i];
    release(&bx);
    PyObject *modes = PyTuple_New(k->nmodes);
    if (!modes)
        return NULL;
    const double *qe = k->qe1;
    for (int t = 0; t < k->nmodes; t++) {
        const int *c = k->modes + 6 * t;
        double x0 = qe[c[0]], y0 = qe[c[1]];
        double ax = qe[c[2]] - x0, ay = qe[c[3]] - y0, bx_ = qe[c[4]] - x0, by = qe[c[5]] - y0;
        PyTuple_SET_ITEM(modes, t, PyLong_FromLong(ax * by - ay * bx_ >= 0.0 ? 1 : -1));
    }
    return Py_BuildValue("dddN", residual, norm2, speed, modes);
}

/* --- the tuner's filter bank (mbfg_ros.tuning.filter_bank.ReducedModelBank): the reduced model of many rows
 * per call.  z: the d coordinates held (the encoders'), free: the others; a row's pose is solved with its z
 * held, its velocities are ż through the tangent R = ∂q/∂z.  The numpy forms of filter_bank.py are the
 * reference (test_tuning_speed.py compares both). */

/* the z and free index lists, checked against n */
static int *
index_list(PyObject *seq, Py_ssize_t *count, int n, const char *what)
{
    int *out = int_list(seq, count, what);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < *count; i++)
        if (out[i] < 0 || out[i] >= n) {
            PyErr_Format(PyExc_ValueError, "%s: index %d outside 0..%d", what, out[i], n - 1);
            PyMem_Free(out);
            return NULL;
        }
    return out;
}

/* G = Jfᵀ Jf (f × f) of the free columns of J (m × n) */
static void
free_normal_matrix(const double *J, int m, int n, const int *fr, int f, double *G)
{
    for (int i = 0; i < f; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int r = 0; r < m; r++)
                s += J[(size_t)r * n + fr[i]] * J[(size_t)r * n + fr[j]];
            G[i * f + j] = G[j * f + i] = s;
        }
}

/* R (n × d) = ∂q/∂z at the pose of the last mk_positions: Φq R = 0 with R[z] = I, the free rows by the normal
 * equations (Jfᵀ Jf) R_f = −Jfᵀ Jz as velocity_basis solves them.  0 on success, 1 where Jfᵀ Jf is singular. */
static int
mk_tangent(MechanismKernel *k, const int *zi, int d, const int *fr, int f, double *G, int *piv, double *rhs,
           double *R)
{
    int n = k->n, m = k->m;
    free_normal_matrix(k->J, m, n, fr, f, G);
    if (lu_factor(G, piv, f))
        return 1;
    for (int j = 0; j < d; j++) {
        for (int i = 0; i < f; i++) {
            double s = 0.0;
            for (int r = 0; r < m; r++)
                s += k->J[(size_t)r * n + fr[i]] * k->J[(size_t)r * n + zi[j]];
            rhs[i] = -s;
        }
        lu_solve(G, piv, f, rhs);
        for (int i = 0; i < f; i++)
            R[(size_t)fr[i] * d + j] = rhs[i];
        for (int i = 0; i < d; i++)
            R[(size_t)zi[i] * d + j] = i == j ? 1.0 : 0.0;
    }
    return 0;
}

/* One row of reduced_positions: the pose q (n) with z (d) held, from the guess (n) moved along its tangent basis
 * (n × d, NULL: not moved), and its tangent R (n × d, NaN where not solved); Φq at q left in k->J.  1 where
 * solved.  G (f × f), piv (f), rhs (max(f, m)): work. */
static int
reduced_pose(MechanismKernel *k, const double *zr, const double *gr, const double *br, const int *zi, int d,
             const int *fr, int f, double tol, long iterations, double *G, int *piv, double *rhs, double *qr,
             double *Rr)
{
    int n = k->n, m = k->m;
    memcpy(qr, gr, n * sizeof(double));
    if (br)
        for (int i = 0; i < n; i++) {
            double s = 0.0;
            for (int j = 0; j < d; j++)
                s += br[i * d + j] * (zr[j] - gr[zi[j]]);
            qr[i] += s;
        }
    for (int j = 0; j < d; j++)
        qr[zi[j]] = zr[j];
    int solved = 0;
    for (long it = 0; it <= iterations; it++) {
        mk_positions(k, qr);
        if (max_abs(k->phi, m) <= tol) {
            solved = 1;
            break;
        }
        if (it == iterations)
            break;
        free_normal_matrix(k->J, m, n, fr, f, G);
        for (int i = 0; i < f; i++) {
            double s = 0.0;
            for (int r = 0; r < m; r++)
                s += k->J[(size_t)r * n + fr[i]] * k->phi[r];
            rhs[i] = -s;
        }
        if (lu_factor(G, piv, f))
            break;
        lu_solve(G, piv, f, rhs);
        int finite = 1;
        for (int i = 0; i < f; i++)
            finite &= isfinite(rhs[i]);
        if (!finite)
            break;
        for (int i = 0; i < f; i++)
            qr[fr[i]] += rhs[i];
    }
    for (int i = 0; i < n; i++)
        solved &= isfinite(qr[i]);
    if (solved)
        solved = !mk_tangent(k, zi, d, fr, f, G, piv, rhs, Rr);
    if (!solved)
        for (int i = 0; i < n * d; i++)
            Rr[i] = NAN;
    return solved;
}

/* reduced_positions(z, guess, basis, z_index, free_index, tol, iterations, q, J, R, ok)
 * Each row's pose with its z (N × d) held: from its guess (N × n), first moved along the tangent basis (N × n × d;
 * None: not moved), Gauss–Newton on Φ = 0 over the free coordinates (the normal equations, as
 * dynamics.batched.newton_positions) until max |Φ| ≤ tol, at most `iterations` steps.  Into q (N × n), Φq there
 * J (N × m × n) and the tangent R (N × n × d); ok (N) 1.0 where the pose was solved (the others' J and R NaN). */
static PyObject *
mk_py_reduced_positions(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 11, "reduced_positions") < 0)
        return NULL;
    int n = k->n, m = k->m;
    Py_ssize_t d = 0, f = 0;
    Buf bz = {0}, bg = {0}, bb = {0}, bq = {0}, bJ = {0}, bR = {0}, bo = {0};
    PyObject *ret = NULL;
    double *G = NULL, *rhs = NULL;
    int *piv = NULL;
    int *zi = index_list(args[3], &d, n, "z_index");
    int *fr = zi ? index_list(args[4], &f, n, "free_index") : NULL;
    double tol = PyFloat_AsDouble(args[5]);
    long iterations = PyLong_AsLong(args[6]);
    if (!fr || PyErr_Occurred())
        goto done;
    double *z = get_doubles(args[0], &bz, -1, 0, "z");
    Py_ssize_t N = (z && d) ? bz.view.len / 8 / d : 0;
    double *guess = z ? get_doubles(args[1], &bg, N * n, 0, "guess") : NULL;
    double *basis = NULL;
    if (guess && args[2] != Py_None && !(basis = get_doubles(args[2], &bb, N * n * d, 0, "basis")))
        goto done;
    double *q = guess ? get_doubles(args[7], &bq, N * n, 1, "q") : NULL;
    double *J = q ? get_doubles(args[8], &bJ, N * m * n, 1, "J") : NULL;
    double *R = J ? get_doubles(args[9], &bR, N * n * d, 1, "R") : NULL;
    double *ok = R ? get_doubles(args[10], &bo, N, 1, "ok") : NULL;
    if (!ok)
        goto done;
    G = PyMem_Calloc((size_t)f * f + 1, sizeof(double));
    rhs = PyMem_Calloc((size_t)(f > m ? f : m) + 1, sizeof(double));
    piv = PyMem_Calloc((size_t)f + 1, sizeof(int));
    if (!G || !rhs || !piv) {
        PyErr_NoMemory();
        goto done;
    }
    KERNEL_LOOP_BEGIN(k)
    for (Py_ssize_t row = 0; row < N; row++) {
        double *Jr = J + row * m * n, *Rr = R + row * n * d;
        int solved = reduced_pose(k, z + row * d, guess + row * n, basis ? basis + row * n * d : NULL, zi, (int)d,
                                  fr, (int)f, tol, iterations, G, piv, rhs, q + row * n, Rr);
        if (solved)
            memcpy(Jr, k->J, (size_t)m * n * sizeof(double));
        else
            for (Py_ssize_t i = 0; i < (Py_ssize_t)m * n; i++)
                Jr[i] = NAN;
        ok[row] = solved ? 1.0 : 0.0;
    }
    KERNEL_LOOP_END(k)
    ret = Py_NewRef(Py_None);
done:
    PyMem_Free(zi), PyMem_Free(fr), PyMem_Free(G), PyMem_Free(rhs), PyMem_Free(piv);
    release(&bz), release(&bg), release(&bb), release(&bq), release(&bJ), release(&bR), release(&bo);
    return ret;
}

/* v = R ż (n) and Q = Q_base + E τ (n) of one row */
static void
reduced_velocity_and_forces(MechanismKernel *k, const double *R, const double *zdot, int d, const double *tau,
                            const double *Q_base, double *v, double *Q)
{
    int n = k->n;
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += R[(size_t)i * d + j] * zdot[j];
        v[i] = s;
    }
    memcpy(Q, Q_base, n * sizeof(double));
    for (int t = 0; t < k->na; t++)
        Q[k->act[t]] += tau[t];
}

/* reduced_acceleration(q, R, zdot, tau, Q_base, z_index, a, ok)
 * z̈ (N × d) at the poses q (N × n) with tangents R (N × n × d), rates ż (N × d) and actuator efforts τ
 * (N × n_actuated), the other forces Q_base (n, without the friction): q̈[z] by one LU solve of the augmented
 * system per row; ok (N) 0.0 where it is singular or q̈ not sane (the caller's null-space solver then). */
static PyObject *
mk_py_reduced_acceleration(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 8, "reduced_acceleration") < 0)
        return NULL;
    int n = k->n, na = k->na;
    Py_ssize_t d = 0;
    Buf bq = {0}, bR = {0}, bzd = {0}, bt = {0}, bQ = {0}, ba = {0}, bo = {0};
    PyObject *ret = NULL;
    double *work = NULL;
    int *zi = index_list(args[5], &d, n, "z_index");
    if (!zi)
        goto done;
    double *q = get_doubles(args[0], &bq, -1, 0, "q");
    Py_ssize_t N = q ? bq.view.len / 8 / n : 0;
    double *R = q ? get_doubles(args[1], &bR, N * n * d, 0, "R") : NULL;
    double *zdot = R ? get_doubles(args[2], &bzd, N * d, 0, "zdot") : NULL;
    double *tau = zdot ? get_doubles(args[3], &bt, N * na, 0, "tau") : NULL;
    double *Qb = tau ? get_doubles(args[4], &bQ, n, 0, "Q_base") : NULL;
    double *a = Qb ? get_doubles(args[6], &ba, N * d, 1, "a") : NULL;
    double *ok = a ? get_doubles(args[7], &bo, N, 1, "ok") : NULL;
    if (!ok)
        goto done;
    if (!(work = PyMem_Calloc(3 * (size_t)n, sizeof(double)))) {
        PyErr_NoMemory();
        goto done;
    }
    double *v = work, *Q = work + n, *acc = work + 2 * n;
    for (Py_ssize_t row = 0; row < N; row++) {
        reduced_velocity_and_forces(k, R + row * n * d, zdot + row * d, (int)d, tau + row * na, Qb, v, Q);
        int fail = mk_acceleration(k, q + row * n, v, Q, acc);
        for (int j = 0; j < d; j++)
            a[row * d + j] = fail ? NAN : acc[zi[j]];
        ok[row] = fail ? 0.0 : 1.0;
    }
    ret = Py_NewRef(Py_None);
done:
    PyMem_Free(zi), PyMem_Free(work);
    release(&bq), release(&bR), release(&bzd), release(&bt), release(&bQ), release(&ba), release(&bo);
    return ret;
}

/* reduced_linearize(q, R, zdot, tau, Q_base, z_index, free_index, a, dz, dzdot, de, ok)
 * z̈ (N × d) and its derivatives ∂z̈/∂z, ∂z̈/∂ż (N × d × d), ∂z̈/∂τ (N × d × n_actuated) at the rows of
 * reduced_acceleration's arguments, by the chain rule through q = q(z), q̇ = R(z) ż (filter_bank.ReducedModelBank
 * .linearize): ∂z̈/∂z = [∂q̈/∂q R + ∂q̈/∂q̇ ∂q̇/∂z]_z with Φq ∂q̇/∂z = −Φ̇q R (its free rows by the normal
 * equations), ∂z̈/∂ż = [∂q̈/∂q̇ R]_z, ∂z̈/∂τ = [∂q̈/∂Q]_{z, actuated}; ok as in reduced_acceleration. */
static PyObject *
mk_py_reduced_linearize(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 12, "reduced_linearize") < 0)
        return NULL;
    int n = k->n, m = k->m, na = k->na;
    Py_ssize_t d = 0, f = 0;
    Buf bq = {0}, bR = {0}, bzd = {0}, bt = {0}, bQ = {0}, ba = {0}, bdz = {0}, bdzd = {0}, bde = {0}, bo = {0};
    PyObject *ret = NULL;
    double *work = NULL;
    int *piv = NULL;
    int *zi = index_list(args[5], &d, n, "z_index");
    int *fr = zi ? index_list(args[6], &f, n, "free_index") : NULL;
    if (!fr)
        goto done;
    double *q = get_doubles(args[0], &bq, -1, 0, "q");
    Py_ssize_t N = q ? bq.view.len / 8 / n : 0;
    double *R = q ? get_doubles(args[1], &bR, N * n * d, 0, "R") : NULL;
    double *zdot = R ? get_doubles(args[2], &bzd, N * d, 0, "zdot") : NULL;
    double *tau = zdot ? get_doubles(args[3], &bt, N * na, 0, "tau") : NULL;
    double *Qb = tau ? get_doubles(args[4], &bQ, n, 0, "Q_base") : NULL;
    double *a = Qb ? get_doubles(args[7], &ba, N * d, 1, "a") : NULL;
    double *dz = a ? get_doubles(args[8], &bdz, N * d * d, 1, "dz") : NULL;
    double *dzdot = dz ? get_doubles(args[9], &bdzd, N * d * d, 1, "dzdot") : NULL;
    double *de = dzdot ? get_doubles(args[10], &bde, N * d * na, 1, "de") : NULL;
    double *ok = de ? get_doubles(args[11], &bo, N, 1, "ok") : NULL;
    if (!ok)
        goto done;
    size_t nn = (size_t)n * n;
    work = PyMem_Calloc(4 * (size_t)n + 3 * nn + m + (size_t)f * f + (size_t)n * d * 2 + m * d + f + 1,
                        sizeof(double));
    piv = PyMem_Calloc((size_t)f + 1, sizeof(int));
    if (!work || !piv) {
        PyErr_NoMemory();
        goto done;
    }
    double *v = work, *Q = v + n, *acc = Q + n, *da_dq = acc + n, *da_dv = da_dq + nn, *da_dQ = da_dv + nn;
    double *lam = da_dQ + nn, *G = lam + m, *dv = G + (size_t)f * f, *JdR = dv + (size_t)n * d;
    double *rhs = JdR + (size_t)m * d;
    KERNEL_LOOP_BEGIN(k)
    for (Py_ssize_t row = 0; row < N; row++) {
        const double *Rr = R + row * n * d;
        double *ar = a + row * d, *dzr = dz + row * d * d, *dzdr = dzdot + row * d * d, *der = de + row * d * na;
        reduced_velocity_and_forces(k, Rr, zdot + row * d, (int)d, tau + row * na, Qb, v, Q);
        int fail = mk_linearize(k, q + row * n, v, Q, acc, da_dq, da_dv, da_dQ, lam);
        if (!fail) {
            /* k->J, k->Jd: Φq and Φ̇q at this row's (q, q̇) */
            free_normal_matrix(k->J, m, n, fr, (int)f, G);
            fail = lu_factor(G, piv, (int)f);
        }
        if (fail) {
            for (Py_ssize_t i = 0; i < d; i++)
                ar[i] = NAN;
            for (Py_ssize_t i = 0; i < d * d; i++)
                dzr[i] = dzdr[i] = NAN;
            for (Py_ssize_t i = 0; i < d * na; i++)
                der[i] = NAN;
            ok[row] = 0.0;
            continue;
        }
        for (int r = 0; r < m; r++)
            for (int j = 0; j < d; j++) {
                double s = 0.0;
                for (int l = 0; l < n; l++)
                    s += k->Jd[(size_t)r * n + l] * Rr[(size_t)l * d + j];
                JdR[r * d + j] = s;
            }
        memset(dv, 0, (size_t)n * d * sizeof(double));
        for (int j = 0; j < d; j++) {
            for (int i = 0; i < f; i++) {
                double s = 0.0;
                for (int r = 0; r < m; r++)
                    s += k->J[(size_t)r * n + fr[i]] * JdR[r * d + j];
                rhs[i] = -s;
            }
            lu_solve(G, piv, (int)f, rhs);
            for (int i = 0; i < f; i++)
                dv[(size_t)fr[i] * d + j] = rhs[i];
        }
        for (int i = 0; i < d; i++) {
            const double *aq = da_dq + (size_t)zi[i] * n, *av = da_dv + (size_t)zi[i] * n;
            ar[i] = acc[zi[i]];
            for (int j = 0; j < d; j++) {
                double s = 0.0, sv = 0.0, sd = 0.0;
                for (int l = 0; l < n; l++) {
                    s += aq[l] * Rr[(size_t)l * d + j];
                    sv += av[l] * dv[(size_t)l * d + j];
                    sd += av[l] * Rr[(size_t)l * d + j];
                }
                dzr[i * d + j] = s + sv;
                dzdr[i * d + j] = sd;
            }
            for (int t = 0; t < na; t++)
                der[i * na + t] = da_dQ[(size_t)zi[i] * n + k->act[t]];
        }
        ok[row] = 1.0;
    }
    KERNEL_LOOP_END(k)
    ret = Py_NewRef(Py_None);
done:
    PyMem_Free(zi), PyMem_Free(fr), PyMem_Free(work), PyMem_Free(piv);
    release(&bq), release(&bR), release(&bzd), release(&bt), release(&bQ), release(&ba), release(&bdz),
        release(&bdzd), release(&bde), release(&bo);
    return ret;
}

/* reduced_rk4(x, k1, h, command, damping, fused, pose, basis, Q_base, z_index, free_index, tol, iterations, x_out,
 *             pose_ok, dynamics_ok)
 * One classical Runge–Kutta step over h of K filters' means x (K × nx, nx = 2d + 2 n_actuated: z, ż, e, ė) as
 * filter_bank.ReducedEKFBank.step takes it with numpy (the same operations in the same order): k1 (K × nx) the
 * first stage, each further stage's z posed from the filter's pose (K × n) along its tangent basis (K × n × d)
 * (reduced_pose), ż through the stage's tangent, the efforts e (fused: command + e, command K × n_actuated), z̈ by
 * mk_acceleration, ė's rate −w² e − 2w ė (damping w, K).  Into x_out (K × nx); pose_ok (K) 0.0 where a stage's
 * pose was lost, dynamics_ok (K) 0.0 where a stage's augmented system at a solved pose was singular (the caller
 * then takes numpy's step, whose null-space solver handles it). */
static PyObject *
mk_py_reduced_rk4(MechanismKernel *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 16, "reduced_rk4") < 0)
        return NULL;
    int n = k->n, m = k->m, na = k->na;
    Py_ssize_t d = 0, f = 0;
    Buf bx = {0}, bk = {0}, bc = {0}, bw = {0}, bp = {0}, bb = {0}, bQ = {0}, bo = {0}, bpo = {0}, bdo = {0};
    PyObject *ret = NULL;
    double *work = NULL;
    int *piv = NULL;
    double h = PyFloat_AsDouble(args[2]);
    long fused = PyLong_AsLong(args[5]);
    double tol = PyFloat_AsDouble(args[11]);
    long iterations = PyLong_AsLong(args[12]);
    if (PyErr_Occurred())
        return NULL;
    int *zi = index_list(args[9], &d, n, "z_index");
    int *fr = zi ? index_list(args[10], &f, n, "free_index") : NULL;
    if (!fr)
        goto done;
    Py_ssize_t nx = 2 * d + 2 * na;
    double *x = get_doubles(args[0], &bx, -1, 0, "x");
    Py_ssize_t K = x ? bx.view.len / 8 / nx : 0;
    double *k1 = x ? get_doubles(args[1], &bk, K * nx, 0, "k1") : NULL;
    double *command = k1 ? get_doubles(args[3], &bc, K * na, 0, "command") : NULL;
    double *damping = command ? get_doubles(args[4], &bw, K, 0, "damping") : NULL;
    double *pose = damping ? get_doubles(args[6], &bp, K * n, 0, "pose") : NULL;
    double *basis = pose ? get_doubles(args[7], &bb, K * n * d, 0, "basis") : NULL;
    double *Qb = basis ? get_doubles(args[8], &bQ, n, 0, "Q_base") : NULL;
    double *out = Qb ? get_doubles(args[13], &bo, K * nx, 1, "x_out") : NULL;
    double *pose_ok = out ? get_doubles(args[14], &bpo, K, 1, "pose_ok") : NULL;
    double *dyn_ok = pose_ok ? get_doubles(args[15], &bdo, K, 1, "dynamics_ok") : NULL;
    if (!dyn_ok)
        goto done;
    size_t mx = (size_t)(f > m ? f : m);
    work = PyMem_Calloc(5 * (size_t)nx + (size_t)f * f + mx + 4 * (size_t)n + (size_t)n * d + na + 1, sizeof(double));
    piv = PyMem_Calloc((size_t)f + 1, sizeof(int));
    if (!work || !piv) {
        PyErr_NoMemory();
        goto done;
    }
    double *ks[4], *xs = work + 4 * nx;
    ks[1] = work, ks[2] = work + nx, ks[3] = work + 2 * nx;
    double *G = work + 5 * nx, *rhs = G + (size_t)f * f, *q = rhs + mx, *v = q + n, *Q = v + n, *acc = Q + n;
    double *R = acc + n, *tau = R + (size_t)n * d;
    double half = 0.5 * h, sixth = h / 6.0;
    KERNEL_LOOP_BEGIN(k)
    for (Py_ssize_t row = 0; row < K; row++) {
        const double *xr = x + row * nx;
        double w = damping[row];
        int posed = 1, dynamic = 1;
        ks[0] = k1 + row * nx;
        for (int st = 1; st <= 3; st++) {
            double c = st == 3 ? h : half;
            const double *kp = ks[st - 1];
            for (Py_ssize_t i = 0; i < nx; i++)
                xs[i] = xr[i] + c * kp[i];
            int solved = reduced_pose(k, xs, pose + row * n, basis + row * n * d, zi, (int)d, fr, (int)f, tol,
                                      iterations, G, piv, rhs, q, R);
            posed &= solved;
            for (int t = 0; t < na; t++)
                tau[t] = fused ? command[row * na + t] + xs[2 * d + t] : xs[2 * d + t];
            reduced_velocity_and_forces(k, R, xs + d, (int)d, tau, Qb, v, Q);
            int fail = mk_acceleration(k, q, v, Q, acc);
            if (fail && solved)
                dynamic = 0;
            double *ko = ks[st];
            for (Py_ssize_t i = 0; i < d; i++) {
                ko[i] = xs[d + i];
                ko[d + i] = fail ? NAN : acc[zi[i]];
            }
            for (int t = 0; t < na; t++) {
                ko[2 * d + t] = xs[2 * d + na + t];
                ko[2 * d + na + t] = -w * w * xs[2 * d + t] - 2.0 * w * xs[2 * d + na + t];
            }
        }
        double *o = out + row * nx;
        for (Py_ssize_t i = 0; i < nx; i++)
            o[i] = xr[i] + sixth * (ks[0][i] + 2.0 * ks[1][i] + 2.0 * ks[2][i] + ks[3][i]);
        pose_ok[row] = posed ? 1.0 : 0.0;
        dyn_ok[row] = dynamic ? 1.0 : 0.0;
    }
    KERNEL_LOOP_END(k)
    ret = Py_NewRef(Py_None);
done:
    PyMem_Free(zi), PyMem_Free(fr), PyMem_Free(work), PyMem_Free(piv);
    release(&bx), release(&bk), release(&bc), release(&bw), release(&bp), release(&bb), release(&bQ), release(&bo),
        release(&bpo), release(&bdo);
    return ret;
}

static PyMethodDef mech_methods[] = {
    {"summary", (PyCFunction)(void (*)(void))mk_py_summary, METH_FASTCALL,
     "summary(x) -> (max |Φ(q)|, x·x, max |q̇|, assembly-mode indicators) of a state starting with q, q̇."},
    {"predict", (PyCFunction)(void (*)(void))mk_py_predict, METH_FASTCALL,
     "predict(x, h, a_prev, h_prev, Q_base, tau_start, out) -> ok: the continuity predictor (see the C source)."},
    {"taylor", (PyCFunction)(void (*)(void))mk_py_taylor, METH_FASTCALL,
     "taylor(x, h, a_prev, h_prev, jerk, out): the predictor's Taylor step of q, q̇ alone (see the C source)."},
    {"phi_and_jacobian", (PyCFunction)(void (*)(void))mk_py_phi_and_jacobian, METH_FASTCALL,
     "phi_and_jacobian(q, phi_out, J_out): Φ and Φq of N states q (N × n) into the given arrays (N × m, N × m × n)."},
    {"max_abs_phi", (PyCFunction)(void (*)(void))mk_py_max_abs_phi, METH_FASTCALL, "max |Φ(q)|."},
    {"jacobian_dot", (PyCFunction)(void (*)(void))mk_py_jacobian_dot, METH_FASTCALL,
     "jacobian_dot(q, w, out): ∂(Φq w)/∂q of N states into out (N × m × n); w = q̇: Φ̇q."},
    {"jacobian_dot_times_v_derivative", (PyCFunction)(void (*)(void))mk_py_third, METH_FASTCALL,
     "jacobian_dot_times_v_derivative(q, v, out): ∂(Φ̇q(q, v) v)/∂q at fixed v of N states (N × m × n)."},
    {"weighted_hessian", (PyCFunction)(void (*)(void))mk_py_weighted_hessian, METH_FASTCALL,
     "weighted_hessian(q, lam, out): Σᵢ λᵢ ∂²Φᵢ/∂q² of N states (N × n × n)."},
    {"friction", (PyCFunction)(void (*)(void))mk_py_friction, METH_FASTCALL,
     "friction(v, out): the friction force per friction coordinate of N rates (N × n) into out (N × nf)."},
    {"derivatives", (PyCFunction)(void (*)(void))mk_py_derivatives, METH_FASTCALL,
     "derivatives(q, v, a, lam, AB, da_dq, da_dv): ∂q̈/∂q, ∂q̈/∂q̇ from q̈, λ and the rows [A B] of another solver."},
    {"supply", (PyCFunction)(void (*)(void))mk_py_supply, METH_FASTCALL,
     "supply(q, v, Q, a, da_dq, da_dv, da_dQ, lam): the linearization to take at a point where K is singular."},
    {"missed", (PyCFunction)(void (*)(void))mk_py_missed, METH_FASTCALL,
     "missed(q_out, v_out, Q_out) -> bool: the last point where K was singular and nothing was supplied."},
    {"acceleration", (PyCFunction)(void (*)(void))mk_py_acceleration, METH_FASTCALL,
     "acceleration(q, v, Q, a_out) -> ok: q̈ by one LU solve of the augmented system."},
    {"linearize", (PyCFunction)(void (*)(void))mk_py_linearize, METH_FASTCALL,
     "linearize(q, v, Q, a, da_dq, da_dv, da_dQ, lam, J, Jd) -> ok: the dynamics linearization into the arrays."},
    {"reduced_positions", (PyCFunction)(void (*)(void))mk_py_reduced_positions, METH_FASTCALL,
     "reduced_positions(z, guess, basis, z_index, free_index, tol, iterations, q, J, R, ok): poses with z held."},
    {"reduced_acceleration", (PyCFunction)(void (*)(void))mk_py_reduced_acceleration, METH_FASTCALL,
     "reduced_acceleration(q, R, zdot, tau, Q_base, z_index, a, ok): z̈ of many rows."},
    {"reduced_linearize", (PyCFunction)(void (*)(void))mk_py_reduced_linearize, METH_FASTCALL,
     "reduced_linearize(q, R, zdot, tau, Q_base, z_index, free_index, a, dz, dzdot, de, ok): z̈ and its derivatives."},
    {"reduced_rk4", (PyCFunction)(void (*)(void))mk_py_reduced_rk4, METH_FASTCALL,
     "reduced_rk4(x, k1, h, command, damping, fused, pose, basis, Q_base, z_index, free_index, tol, iterations, "
     "x_out, pose_ok, dynamics_ok): a Runge–Kutta step of the filters' means."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject MechanismKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mbfg_ros.native._kernel.MechanismKernel",
    .tp_basicsize = sizeof(MechanismKernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The constrained dynamics of one mechanism (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)mech_init,
    .tp_dealloc = (destructor)mech_dealloc,
    .tp_methods = mech_methods,
};

/* ================================================================================================= StepKernel */
#define MAX_SLOTS 5

typedef struct {
    int code, row, dim, param, check;      /* code: the unit's kind (its index in `unit_kinds`); check: its rows
                                              are in the relinearization check (offset check_row) */
    int check_row;
    int nslots;
    int which[MAX_SLOTS], col[MAX_SLOTS], width[MAX_SLOTS];  /* per slot: 1 this step / 0 previous, its block's
                                                              first column and size */
    double *w;                             /* 1/σ per row */
    int *ints;
    int nints;
    double *doubles;                       /* constants of the kind (the gyroscope's fixed points) */
    int ndoubles;
} Unit;

typedef struct {
    PyObject_HEAD
    PyObject *mech_obj;
    MechanismKernel *mk;
    int D, rows, rs, need_prev, static_prev, nunits, nchecks;
    int dynamic_prev;          /* does a non-static unit read X_{k−1}? (if not, A_prev's non-static rows stay 0) */
    double *S;                 /* rs × (D or 2D): the static rows' whitened Jacobians ([prev | cur]) */
    Unit *units;
    Buf bA_cur, bA_prev, br, bb;
    double *A_cur, *A_prev, *r, *b;
    /* work: one dynamics linearization per call */
    double *a, *da_dq, *da_dv, *da_dQ, *lam, *Q, *e, *dx;
} StepKernel;

/* the per-step parameter of unit u: a float, or a buffer of `len` values (params[u->param][0]; with len 1 a float
 * too) */
static int
unit_param(PyObject *params, const Unit *u, double *scalar, Buf *buf, double **vec, Py_ssize_t len)
{
    if (u->param < 0 || u->param >= PyList_GET_SIZE(params)) {
        PyErr_SetString(PyExc_ValueError, "StepKernel: a unit's parameters are missing");
        return -1;
    }
    PyObject *t = PyList_GET_ITEM(params, u->param);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) {
        PyErr_SetString(PyExc_TypeError, "StepKernel: parameters must be tuples");
        return -1;
    }
    PyObject *p = PyTuple_GET_ITEM(t, 0);
    if (vec && len == 1 && PyFloat_Check(p)) {       /* a one-value parameter given as a float (a reading) */
        *scalar = PyFloat_AS_DOUBLE(p);
        *vec = scalar;
        return 0;
    }
    if (vec) {
        *vec = get_doubles(p, buf, len, 0, "unit parameter");
        return *vec ? 0 : -1;
    }
    *scalar = PyFloat_AsDouble(p);
    return (*scalar == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static inline const double *
slot_block(const Unit *u, int j, const double *xp, const double *xc)
{
    return (u->which[j] ? xc : xp) + u->col[j];
}

/* The unit kinds.  Each evaluates unit u's raw error into e (dim) and, with jac, adds its raw Jacobians into
 * the rows of A[1] (this step's block columns) / A[0] (the previous step's) — D columns, zeroed by the caller,
 * whitened afterwards; the dynamics are linearized (or, without jac, solved) at most once per call (dyn: 0 not
 * yet, 1 done).  0 on success, 1 where the dynamics are singular, −1 on a Python error.  Each kind is one
 * function here and one row of `unit_kinds` below; the Python factor names its kind (`Factor.kernel_kind`). */
#define UNIT_EVAL_ARGS StepKernel *s, const Unit *u, const double *xp, const double *xc, PyObject *params, \
                       double *e, int jac, double *const A[2], int *dyn
typedef int (*UnitEval)(UNIT_EVAL_ARGS);

#define JROW(slot, i) (A[u->which[slot]] + (size_t)(u->row + (i)) * s->D + u->col[slot])

/* Φ(q)                                   slots q */
static int
eval_position(UNIT_EVAL_ARGS)
{
    MechanismKernel *k = s->mk;
    int n = k->n, m = k->m;
    mk_positions(k, slot_block(u, 0, xp, xc));
    memcpy(e, k->phi, m * sizeof(double));
    if (jac)
        for (int i = 0; i < m; i++) {
            double *row = JROW(0, i);
            for (int j = 0; j < n; j++)
                row[j] += k->J[(size_t)i * n + j];
        }
    return 0;
}

/* Φq q̇                                   slots q, v */
static int
eval_velocity(UNIT_EVAL_ARGS)
{
    MechanismKernel *k = s->mk;
    int n = k->n, m = k->m;
    const double *q = slot_block(u, 0, xp, xc), *v = slot_block(u, 1, xp, xc);
    mk_positions(k, q);
    for (int i = 0; i < m; i++) {
        double sum = 0.0;
        for (int j = 0; j < n; j++)
            sum += k->J[(size_t)i * n + j] * v[j];
        e[i] = sum;
    }
    if (jac) {
        mk_hessian_vector(k, v, k->Jd);
        for (int i = 0; i < m; i++) {
            double *rq = JROW(0, i), *rv = JROW(1, i);
            for (int j = 0; j < n; j++) {
                rq[j] += k->Jd[(size_t)i * n + j];
                rv[j] += k->J[(size_t)i * n + j];
            }
        }
    }
    return 0;
}

/* The kinds of identified parameters (mbfg_ros.model.identified), by their codes in an identified_dynamics unit's
 * integers, and their table as Python reads it (PARAMETER_KINDS: model.identified takes its codes from it, after
 * checking the names against model.spec's) */
typedef enum {
    PARAMETER_GAIN, PARAMETER_VISCOUS_FRICTION, PARAMETER_COULOMB_FRICTION, PARAMETER_PAYLOAD_MASS, N_PARAMETER_KINDS
} ParameterCode;

typedef struct {
    const char *name;   /* model.spec's name of the kind */
    const char *on;     /* what it is a parameter of: "actuator" (a force on its coordinate: model.spec's
                           IDENTIFIABLE) or "body" (a payload on it: BODY_IDENTIFIABLE) */
} ParameterKind;

static const ParameterKind parameter_kinds[N_PARAMETER_KINDS] = {
    [PARAMETER_GAIN] = {"gain", "actuator"},
    [PARAMETER_VISCOUS_FRICTION] = {"viscous_friction", "actuator"},
    [PARAMETER_COULOMB_FRICTION] = {"coulomb_friction", "actuator"},
    [PARAMETER_PAYLOAD_MASS] = {"payload_mass", "body"},
};

/* an actuator parameter's force per unit of θ − θ₀ on its coordinate (y) and ∂(force)/∂q̇ of its coordinate per
 * unit of θ − θ₀ (dy): mbfg_ros.model.identified (kind: a gain, viscous or Coulomb friction; c: its doubles θ₀,
 * v_s, v_d) */
static inline void
identified_regressor(int kind, double rate, double command, const double *c, double *y, double *dy)
{
    if (kind == PARAMETER_GAIN) {
        *y = command, *dy = 0.0;
    } else if (kind == PARAMETER_VISCOUS_FRICTION) {
        *y = -rate, *dy = -1.0;
    } else {                /* PARAMETER_COULOMB_FRICTION */
        /* (sliding only: × q̇⁴/(q̇⁴ + v_d⁴)) */
        double vs = c[1], sv = rate / vs, r2 = rate * rate, vd4 = c[2] * c[2] * c[2] * c[2];
        double den = r2 * r2 + vd4, gate = r2 * r2 / den, dgate = 4.0 * r2 * rate * vd4 / (den * den);
        double at = atan(sv);
        *y = -(2.0 / M_PI) * at * gate;
        *dy = -(2.0 / M_PI) * (gate / (vs * (1.0 + sv * sv)) + at * dgate);
    }
}

/* Q += ΔQ, the identified parameters' forces (mbfg_ros.model.identified): per parameter j its kind, coordinate and
 * actuator in par[3j .. 3j+2], its θ₀, v_s, v_d in c[3j .. 3j+2], then per payload (in θ order) gravity (2) and C's
 * two rows (n each), whose force is m Cᵀ(g − C a); θ (np_), rates v and accelerations a (n), commands (actuator
 * order: a gain's) */
static void
identified_add_forces(int n, int np_, const int *par, const double *c, const double *th, const double *v,
                      const double *cmd, const double *acc, double *Q)
{
    const double *payload = c + 3 * np_;
    for (int j = 0, pb = 0; j < np_; j++) {
        int kind = par[3 * j], col = par[3 * j + 1];
        double d = th[j] - c[3 * j];
        if (kind == PARAMETER_PAYLOAD_MASS) {
            const double *g = payload + pb * (2 + 2 * n), *Cx = g + 2, *Cy = Cx + n;
            double rx = 0.0, ry = 0.0;
            for (int i = 0; i < n; i++)
                rx += Cx[i] * acc[i], ry += Cy[i] * acc[i];
            double fx = g[0] - rx, fy = g[1] - ry;
            for (int i = 0; i < n; i++)
                Q[i] += d * (Cx[i] * fx + Cy[i] * fy);
            pb++;
            continue;
        }
        double y, dy;
        identified_regressor(kind, v[col], kind == PARAMETER_GAIN ? cmd[par[3 * j + 2]] : 0.0, c + 3 * j, &y,
                             &dy);
        Q[col] += y * d;
    }
}

/* The dynamics units, by their slots:
 * q̈(q, q̇; Q) − a                          slots q, v, a; param Q (n)                          (forward_dynamics)
 * q̈(q, q̇; Q_known + E τ) − a              slots q, v, a, tau; param Q_known (n); ints: the actuated
 *                                          coordinates of τ                                     (inverse_dynamics)
 * q̈(q, q̇; Q_known + E τ + ΔQ) − a, ΔQ = Σⱼ yⱼ(q̇, u)(θⱼ − θ₀ⱼ) on coordinate cⱼ
 *                                          slots q, v, a, tau, theta; params Q_known (n), u (the commands,
 *                                          actuator order); ints: na, the actuated coordinates of τ (na), then per
 *                                          parameter its kind (ParameterCode), coordinate and actuator; doubles:
 *                                          per parameter θ₀, v_s, v_d, then per payload gravity (2) and C's rows
 *                                          (2 × n)                                              (identified_dynamics) */
static int
eval_dynamics(UNIT_EVAL_ARGS)
{
    MechanismKernel *k = s->mk;
    int n = k->n;
    const double *q = slot_block(u, 0, xp, xc), *v = slot_block(u, 1, xp, xc), *acc = slot_block(u, 2, xp, xc);
    Buf bq = {0}, bu = {0};
    double *Qp, dummy;
    if (unit_param(params, u, &dummy, &bq, &Qp, n) < 0) {
        release(&bq);
        return -1;
    }
    memcpy(s->Q, Qp, n * sizeof(double));
    release(&bq);
    int efforts = u->nslots >= 4, identified = u->nslots == 5;
    int na = identified ? u->ints[0] : u->nints, np_ = identified ? u->width[4] : 0;
    const int *act = u->ints + identified, *par = act + na;
    const double *th = identified ? slot_block(u, 4, xp, xc) : NULL, *cmd = NULL;
    if (identified) {
        PyObject *t = PyList_GET_ITEM(params, u->param);
        if (PyTuple_GET_SIZE(t) < 2) {
            PyErr_SetString(PyExc_ValueError, "StepKernel: an identified_dynamics unit's commands are missing");
            return -1;
        }
        if (!(cmd = get_doubles(PyTuple_GET_ITEM(t, 1), &bu, -1, 0, "commands"))) {
            release(&bu);
            return -1;
        }
        for (int j = 0; j < np_; j++)
            if (par[3 * j] == PARAMETER_GAIN && par[3 * j + 2] >= bu.view.len / 8) {
                release(&bu);
                PyErr_SetString(PyExc_ValueError, "StepKernel: an identified gain's actuator has no command");
                return -1;
            }
    }
    if (efforts) {
        const double *tau = slot_block(u, 3, xp, xc);
        for (int t = 0; t < na; t++)
            s->Q[act[t]] += tau[t];
    }
    identified_add_forces(n, np_, par, u->doubles, th, v, cmd, acc, s->Q);
    const double *payload = u->doubles + 3 * np_;
    int fail = jac ? mk_linearize(k, q, v, s->Q, s->a, s->da_dq, s->da_dv, s->da_dQ, s->lam)
                   : mk_acceleration(k, q, v, s->Q, s->a);
    if (fail) {
        release(&bu);
        return 1;
    }
    *dyn = 1;
    for (int i = 0; i < n; i++)
        e[i] = s->a[i] - acc[i];
    if (jac)
        for (int i = 0; i < n; i++) {
            const double *dQ = s->da_dQ + (size_t)i * n;
            double *rq = JROW(0, i), *rv = JROW(1, i);
            for (int j = 0; j < n; j++) {
                rq[j] += s->da_dq[(size_t)i * n + j];
                rv[j] += s->da_dv[(size_t)i * n + j];
            }
            JROW(2, i)[i] += -1.0;
            if (efforts) {
                double *rt = JROW(3, i);
                for (int t = 0; t < na; t++)
                    rt[t] += dQ[act[t]];
            }
            if (identified) {
                double *rth = JROW(4, i), *ra = JROW(2, i);
                for (int j = 0, pb = 0; j < np_; j++) {
                    int kind = par[3 * j], c = par[3 * j + 1];
                    if (kind == PARAMETER_PAYLOAD_MASS) {
                        /* ∂/∂θ: ∂q̈/∂Q Cᵀ(g − C a); ∂/∂a: −m ∂q̈/∂Q CᵀC */
                        const double *g = payload + pb * (2 + 2 * n), *Cx = g + 2, *Cy = Cx + n;
                        double rx = 0.0, ry = 0.0, wx = 0.0, wy = 0.0;
                        for (int l = 0; l < n; l++) {
                            rx += Cx[l] * acc[l], ry += Cy[l] * acc[l];
                            wx += Cx[l] * dQ[l], wy += Cy[l] * dQ[l];
                        }
                        double m = th[j] - u->doubles[3 * j];
                        rth[j] += wx * (g[0] - rx) + wy * (g[1] - ry);
                        for (int l = 0; l < n; l++)
                            ra[l] -= m * (wx * Cx[l] + wy * Cy[l]);
                        pb++;
                        continue;
                    }
                    double y, dy;
                    identified_regressor(kind, v[c], kind == PARAMETER_GAIN ? cmd[par[3 * j + 2]] : 0.0,
                                         u->doubles + 3 * j, &y, &dy);
                    rv[c] += dQ[c] * dy * (th[j] - u->doubles[3 * j]);
                    rth[j] += dQ[c] * y;
                }
            }
        }
    release(&bu);
    return 0;
}

/* an angle difference moved by whole turns into [−π, π) (mbfg_ros.factors.priors.wrapped_angle's formula) */
static inline double
wrapped_angle(double d)
{
    return d - TWO_PI * floor((d + M_PI) / TWO_PI);
}

/* x[select] − values, each row wrapped to [−π, π) with `wrap` (an angle read in any 2π range)
 *                                        slot x; param values: a float (one row) or dim floats; ints: select (dim) */
static int
selection(StepKernel *s, const Unit *u, const double *xp, const double *xc, PyObject *params, double *e, int jac,
          double *const A[2], int wrap)
{
    Buf bm = {0};
    double scalar = 0.0, *values = NULL;
    if (unit_param(params, u, &scalar, &bm, &values, u->dim) < 0) {
        release(&bm);
        return -1;
    }
    const double *x = slot_block(u, 0, xp, xc);
    for (int i = 0; i < u->dim; i++) {
        double d = x[u->ints[i]] - values[i];
        e[i] = wrap ? wrapped_angle(d) : d;
        if (jac)
            JROW(0, i)[u->ints[i]] += 1.0;
    }
    release(&bm);
    return 0;
}

static int
eval_selection(UNIT_EVAL_ARGS)
{
    return selection(s, u, xp, xc, params, e, jac, A, 0);
}

static int
eval_wrapped_selection(UNIT_EVAL_ARGS)
{
    return selection(s, u, xp, xc, params, e, jac, A, 1);
}

/* x[c] + b[j] − value, wrapped to [−π, π) with `wrap`: a reading of coordinate c through a deflection b[j] (an
 * encoder behind a gear's play: mbfg_ros.factors.sensors.Encoder with a deflection)
 *                                        slots x, b; param value (a float); ints: c (in x), j (in b) */
static int
offset_selection(StepKernel *s, const Unit *u, const double *xp, const double *xc, PyObject *params, double *e,
                 int jac, double *const A[2], int wrap)
{
    double value;
    if (unit_param(params, u, &value, NULL, NULL, 0) < 0)
        return -1;
    double d = slot_block(u, 0, xp, xc)[u->ints[0]] + slot_block(u, 1, xp, xc)[u->ints[1]] - value;
    e[0] = wrap ? wrapped_angle(d) : d;
    if (jac) {
        JROW(0, 0)[u->ints[0]] += 1.0;
        JROW(1, 0)[u->ints[1]] += 1.0;
    }
    return 0;
}

static int
eval_offset_selection(UNIT_EVAL_ARGS)
{
    return offset_selection(s, u, xp, xc, params, e, jac, A, 0);
}

static int
eval_wrapped_offset_selection(UNIT_EVAL_ARGS)
{
    return offset_selection(s, u, xp, xc, params, e, jac, A, 1);
}

/* ω(q, q̇) − value                        slots q, v; param value; ints: cxi, cyi, cxj, cyj (−1: a fixed point,
 *                                        its (x, y) in doubles 0–1 for i, 2–3 for j) */
static int
eval_gyroscope(UNIT_EVAL_ARGS)
{
    double value;
    if (unit_param(params, u, &value, NULL, NULL, 0) < 0)
        return -1;
    const double *q = slot_block(u, 0, xp, xc), *v = slot_block(u, 1, xp, xc);
    const int *c = u->ints;
    double xi, yi, vxi, vyi, xj, yj, vxj, vyj;
    if (c[0] >= 0)
        xi = q[c[0]], yi = q[c[1]], vxi = v[c[0]], vyi = v[c[1]];
    else
        xi = u->doubles[0], yi = u->doubles[1], vxi = 0.0, vyi = 0.0;
    if (c[2] >= 0)
        xj = q[c[2]], yj = q[c[3]], vxj = v[c[2]], vyj = v[c[3]];
    else
        xj = u->doubles[2], yj = u->doubles[3], vxj = 0.0, vyj = 0.0;
    double dx = xj - xi, dy = yj - yi, ddx = vxj - vxi, ddy = vyj - vyi;
    double r2 = dx * dx + dy * dy;
    double om = (dx * ddy - dy * ddx) / r2;
    e[0] = om - value;
    if (jac) {
        double gqx = (ddy - 2.0 * om * dx) / r2, gqy = (-ddx - 2.0 * om * dy) / r2;
        double gvx = -dy / r2, gvy = dx / r2;
        double *rq = JROW(0, 0), *rv = JROW(1, 0);
        if (c[2] >= 0)
            rq[c[2]] += gqx, rq[c[3]] += gqy, rv[c[2]] += gvx, rv[c[3]] += gvy;
        if (c[0] >= 0)
            rq[c[0]] += -gqx, rq[c[1]] += -gqy, rv[c[0]] += -gvx, rv[c[1]] += -gvy;
    }
    return 0;
}

#undef JROW

/* how a kind's rows, integers and slot widths are checked when a step program is built */
enum { ROWS_CONSTRAINTS, ROWS_COORDINATES, ROWS_ONE, ROWS_PER_INDEX };     /* dim = m, n, 1, nints */
#define INDICES_PER_ROW (-1)      /* as many integers as rows */
#define INDICES_ANY (-2)
#define INDICES_IDENTIFIED (-3)   /* 1 + na + 3 per parameter (identified_dynamics: na the tau slot's width, the
                                     parameters the theta slot's) */
#define DOUBLES_PER_PARAMETER (-1)   /* 3 per parameter (the theta slot's width) */
enum { INDEX_COORDINATE, INDEX_COORDINATE_OR_FIXED, INDEX_IN_SLOT, INDEX_IN_SLOTS, INDEX_IDENTIFIED };
/* [0, n), [−1, n), [0, slot 0's width), integer j in [0, slot j's width), identified_dynamics' own layout (checked
 * in identified_check) */
enum { WIDTH_COORDINATES, WIDTH_LAST_PER_INDEX, WIDTH_ANY };  /* every slot n wide; the last nints wide; any */

typedef struct {
    const char *name;             /* the Python factor's `kernel_kind` */
    int rows, slots, indices, index_range, widths, doubles;
    UnitEval eval;
} UnitKind;

static const UnitKind unit_kinds[] = {
    {"position", ROWS_CONSTRAINTS, 1, 0, INDEX_COORDINATE, WIDTH_COORDINATES, 0, eval_position},
    {"velocity", ROWS_CONSTRAINTS, 2, 0, INDEX_COORDINATE, WIDTH_COORDINATES, 0, eval_velocity},
    {"forward_dynamics", ROWS_COORDINATES, 3, 0, INDEX_COORDINATE, WIDTH_COORDINATES, 0, eval_dynamics},
    {"inverse_dynamics", ROWS_COORDINATES, 4, INDICES_ANY, INDEX_COORDINATE, WIDTH_LAST_PER_INDEX, 0, eval_dynamics},
    {"gyroscope", ROWS_ONE, 2, 4, INDEX_COORDINATE_OR_FIXED, WIDTH_COORDINATES, 4, eval_gyroscope},
    {"selection", ROWS_PER_INDEX, 1, INDICES_PER_ROW, INDEX_IN_SLOT, WIDTH_ANY, 0, eval_selection},
    {"wrapped_selection", ROWS_PER_INDEX, 1, INDICES_PER_ROW, INDEX_IN_SLOT, WIDTH_ANY, 0, eval_wrapped_selection},
    {"offset_selection", ROWS_ONE, 2, 2, INDEX_IN_SLOTS, WIDTH_ANY, 0, eval_offset_selection},
    {"wrapped_offset_selection", ROWS_ONE, 2, 2, INDEX_IN_SLOTS, WIDTH_ANY, 0, eval_wrapped_offset_selection},
    {"identified_dynamics", ROWS_COORDINATES, 5, INDICES_IDENTIFIED, INDEX_IDENTIFIED, WIDTH_ANY,
     DOUBLES_PER_PARAMETER, eval_dynamics},
};
#define N_UNIT_KINDS ((int)(sizeof(unit_kinds) / sizeof(unit_kinds[0])))

/* what is wrong with np_ identified parameters of a mechanism of n coordinates (per parameter its kind, coordinate
 * and actuator in par, its θ₀, v_s, v_d in doubles, then per payload 2 + 2n more: ndoubles in all), or NULL */
static const char *
identified_parameters_problem(int n, int np_, const int *par, const double *doubles, Py_ssize_t ndoubles)
{
    Py_ssize_t payloads = 0;
    for (int j = 0; j < np_; j++) {
        const int *p = par + 3 * j;
        if (p[0] < 0 || p[0] >= N_PARAMETER_KINDS || p[1] < 0 || p[1] >= n || p[2] < 0)
            return "a parameter's kind, coordinate or actuator is out of range";
        payloads += p[0] == PARAMETER_PAYLOAD_MASS;
    }
    if (ndoubles != 3 * np_ + payloads * (2 + 2 * n))
        return "it needs 3 doubles per parameter and 2 + 2n more per payload";
    for (int j = 0; j < np_; j++)
        if (par[3 * j] == PARAMETER_COULOMB_FRICTION && !(doubles[3 * j + 1] > 0.0 && doubles[3 * j + 2] >= 0.0))
            return "a Coulomb friction's rates must be v_s > 0, v_d >= 0";
    return NULL;
}

/* identified_dynamics' integers: na = the tau slot's width, na coordinates, per parameter a kind (ParameterCode), a
 * coordinate and an actuator (≥ 0); slots q, v, a n wide */
static int
identified_check(const Unit *u, int n)
{
    const char *bad = NULL;
    int na = u->ints[0];
    for (int j = 0; j < 3; j++)
        if (u->width[j] != n)
            bad = "slots q, v, a must be n wide";
    if (na != u->width[3])
        bad = "its first integer must be the tau slot's width";
    for (int t = 0; t < na && !bad; t++)
        if (u->ints[1 + t] < 0 || u->ints[1 + t] >= n)
            bad = "an actuated coordinate is out of range";
    if (!bad)
        bad = identified_parameters_problem(n, u->width[4], u->ints + 1 + na, u->doubles, u->ndoubles);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "StepKernel: an identified_dynamics unit: %s", bad);
        return -1;
    }
    return 0;
}

/* Is unit u (its code in range) a well-formed unit of its kind?  Else a ValueError naming what is wrong. */
static int
unit_check(const Unit *u, int n, int m, int D, int ndoubles)
{
    const UnitKind *kind = &unit_kinds[u->code];
    int dim = kind->rows == ROWS_CONSTRAINTS ? m : kind->rows == ROWS_COORDINATES ? n
            : kind->rows == ROWS_ONE ? 1 : u->nints;
    if (u->dim != dim) {
        PyErr_Format(PyExc_ValueError, "StepKernel: a %s unit has %d rows, not %d", kind->name, u->dim, dim);
        return -1;
    }
    if (u->nslots != kind->slots) {
        PyErr_Format(PyExc_ValueError, "StepKernel: a %s unit has %d slots, not %d", kind->name, u->nslots,
                     kind->slots);
        return -1;
    }
    int nints = kind->indices == INDICES_PER_ROW ? u->dim
              : kind->indices == INDICES_IDENTIFIED ? (u->nslots == 5 ? 1 + u->width[3] + 3 * u->width[4] : -1)
              : kind->indices;
    if (kind->indices != INDICES_ANY && u->nints != nints) {
        PyErr_Format(PyExc_ValueError, "StepKernel: a %s unit has %d integers, not %d", kind->name, u->nints, nints);
        return -1;
    }
    int want_doubles = kind->doubles;
    if (kind->doubles != DOUBLES_PER_PARAMETER && ndoubles != want_doubles) {
        PyErr_Format(PyExc_ValueError, "StepKernel: a %s unit has %d doubles, not %d", kind->name, ndoubles,
                     want_doubles);
        return -1;
    }
    for (int j = 0; j < u->nslots; j++) {
        int want = kind->widths == WIDTH_ANY ? u->width[j]
                 : kind->widths == WIDTH_LAST_PER_INDEX && j == u->nslots - 1 ? u->nints : n;
        if (u->col[j] < 0 || u->width[j] != want || u->col[j] + u->width[j] > D) {
            PyErr_Format(PyExc_ValueError, "StepKernel: slot %d of a %s unit: columns out of range", j, kind->name);
            return -1;
        }
    }
    if (kind->index_range == INDEX_IDENTIFIED)
        return identified_check(u, n);
    int lo = kind->index_range == INDEX_COORDINATE_OR_FIXED ? -1 : 0;
    for (int j = 0; j < u->nints; j++) {
        int hi = kind->index_range == INDEX_IN_SLOT ? u->width[0] : kind->index_range == INDEX_IN_SLOTS ? u->width[j]
               : n;
        if (u->ints[j] < lo || u->ints[j] >= hi) {
            PyErr_Format(PyExc_ValueError, "StepKernel: index %d of a %s unit out of range", u->ints[j], kind->name);
            return -1;
        }
    }
    return 0;
}

/* table[name] = entry, a new reference (or NULL: a Python error) that this takes: 0, or −1 on a Python error */
static int
table_row(PyObject *table, const char *name, PyObject *entry)
{
    int st = entry ? PyDict_SetItemString(table, name, entry) : -1;
    Py_XDECREF(entry);
    return st;
}

/* the table as Python reads it: {name: {"code", "rows" ("constraints", "coordinates", "one", "per index"),
 * "slots"}} */
static PyObject *
unit_kinds_dict(void)
{
    static const char *rows[] = {"constraints", "coordinates", "one", "per index"};
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < N_UNIT_KINDS; i++)
        if (table_row(d, unit_kinds[i].name, Py_BuildValue("{s:i,s:s,s:i}", "code", i, "rows",
                                                           rows[unit_kinds[i].rows], "slots", unit_kinds[i].slots)) < 0)
            Py_CLEAR(d);
    return d;
}

/* the identified parameters' kinds as Python reads them: {name: {"code", "on" ("actuator", "body")}} */
static PyObject *
parameter_kinds_dict(void)
{
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < N_PARAMETER_KINDS; i++)
        if (table_row(d, parameter_kinds[i].name, Py_BuildValue("{s:i,s:s}", "code", i, "on",
                                                                parameter_kinds[i].on)) < 0)
            Py_CLEAR(d);
    return d;
}

static void
sk_free(StepKernel *s)
{
    if (s->units)
        for (int i = 0; i < s->nunits; i++) {
            PyMem_Free(s->units[i].w);
            PyMem_Free(s->units[i].ints);
            PyMem_Free(s->units[i].doubles);
        }
    PyMem_Free(s->units);
    s->units = NULL;
    void *arrs[] = {s->S, s->a, s->da_dq, s->da_dv, s->da_dQ, s->lam, s->Q, s->e, s->dx};
    for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++)
        PyMem_Free(arrs[i]);
    s->S = s->a = s->da_dq = s->da_dv = s->da_dQ = s->lam = s->Q = s->e = s->dx = NULL;
    release(&s->bA_cur), release(&s->bA_prev), release(&s->br), release(&s->bb);
    Py_CLEAR(s->mech_obj);
}

static void
sk_dealloc(StepKernel *s)
{
    sk_free(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* StepKernel(mech_kernel, D, S, static_prev, units, A_cur, A_prev, r, b)
 *   S: rs × (2D if static_prev else D) flat (rs = its rows); units: [(code, row, dim, param, check,
 *   [(which, first column, width) per slot], w (dim), ints, doubles), ...]; A_cur, A_prev (or None), r, b: the output arrays
 *   (rows × D, rows × D, rows, rows), kept for the kernel's lifetime. */
static int
sk_init(StepKernel *s, PyObject *args, PyObject *kw)
{
    PyObject *mobj, *S, *units, *A_cur, *A_prev, *r, *b;
    int D, static_prev;
    if (!PyArg_ParseTuple(args, "O!iOpOOOOO", &MechanismKernelType, &mobj, &D, &S, &static_prev, &units, &A_cur,
                          &A_prev, &r, &b))
        return -1;
    sk_free(s);
    s->mech_obj = Py_NewRef(mobj);
    s->mk = (MechanismKernel *)mobj;
    s->D = D;
    s->static_prev = static_prev;
    int n = s->mk->n, m = s->mk->m;
    if (!(s->r = get_doubles(r, &s->br, -1, 1, "r")))
        return -1;
    s->rows = (int)(s->br.view.len / 8);
    if (!(s->b = get_doubles(b, &s->bb, s->rows, 1, "b")) ||
        !(s->A_cur = get_doubles(A_cur, &s->bA_cur, (Py_ssize_t)s->rows * D, 1, "A_cur")))
        return -1;
    s->need_prev = A_prev != Py_None;
    if (s->need_prev && !(s->A_prev = get_doubles(A_prev, &s->bA_prev, (Py_ssize_t)s->rows * D, 1, "A_prev")))
        return -1;
    Buf bs = {0};
    if (!get_doubles(S, &bs, -1, 0, "S")) {
        release(&bs);
        return -1;
    }
    Py_ssize_t sl = bs.view.len / 8;
    release(&bs);
    int width = static_prev ? 2 * D : D;
    if (sl % width) {
        PyErr_SetString(PyExc_ValueError, "StepKernel: S is not rs × (D or 2D)");
        return -1;
    }
    s->rs = (int)(sl / width);
    if (!(s->S = copy_doubles(S, sl, "S")))
        return -1;
    PyObject *fast = PySequence_Fast(units, "StepKernel units");
    if (!fast)
        return -1;
    s->nunits = (int)PySequence_Fast_GET_SIZE(fast);
    s->units = PyMem_Calloc(s->nunits + 1, sizeof(Unit));
    if (!s->units) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    int check_row = 0;
    for (int i = 0; i < s->nunits; i++) {
        Unit *u = &s->units[i];
        PyObject *slots, *w, *ints, *dbl;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iiiipOOOO", &u->code, &u->row, &u->dim, &u->param,
                              &u->check, &slots, &w, &ints, &dbl))
            goto fail;
        if (u->row < s->rs || u->row + u->dim > s->rows || u->dim < 0) {
            PyErr_SetString(PyExc_ValueError, "StepKernel: unit rows out of range");
            goto fail;
        }
        PyObject *sf = PySequence_Fast(slots, "slots");
        if (!sf)
            goto fail;
        u->nslots = (int)PySequence_Fast_GET_SIZE(sf);
        if (u->nslots > MAX_SLOTS) {
            Py_DECREF(sf);
            PyErr_SetString(PyExc_ValueError, "StepKernel: too many slots");
            goto fail;
        }
        for (int j = 0; j < u->nslots; j++) {
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(sf, j), "iii", &u->which[j], &u->col[j], &u->width[j])) {
                Py_DECREF(sf);
                goto fail;
            }
            if (!u->which[j] && !s->need_prev) {
                Py_DECREF(sf);
                PyErr_SetString(PyExc_ValueError, "StepKernel: a unit reads the previous state but A_prev is None");
                goto fail;
            }
        }
        Py_DECREF(sf);
        if (!(u->w = copy_doubles(w, u->dim, "w")))
            goto fail;
        Py_ssize_t ni;
        if (!(u->ints = int_list(ints, &ni, "ints")))
            goto fail;
        u->nints = (int)ni;
        PyObject *df = PySequence_Fast(dbl, "doubles");
        if (!df)
            goto fail;
        int ndoubles = (int)PySequence_Fast_GET_SIZE(df);
        u->ndoubles = ndoubles;
        u->doubles = PyMem_Calloc(ndoubles + 1, sizeof(double));
        if (!u->doubles) {
            Py_DECREF(df);
            PyErr_NoMemory();
            goto fail;
        }
        for (int j = 0; j < ndoubles; j++)
            u->doubles[j] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(df, j));
        Py_DECREF(df);
        if (PyErr_Occurred())
            goto fail;
        if (u->code < 0 || u->code >= N_UNIT_KINDS) {
            PyErr_Format(PyExc_ValueError, "StepKernel: unknown unit code %d (the kinds: UNIT_KINDS)", u->code);
            goto fail;
        }
        if (unit_check(u, n, m, D, ndoubles) < 0)
            goto fail;
        u->check_row = check_row;
        if (u->check)
            check_row += u->dim;
        for (int j = 0; j < u->nslots; j++)
            s->dynamic_prev |= !u->which[j];
    }
    Py_DECREF(fast);
    s->nchecks = check_row;
    s->a = PyMem_Calloc(n, sizeof(double));
    s->da_dq = PyMem_Calloc((size_t)n * n, sizeof(double));
    s->da_dv = PyMem_Calloc((size_t)n * n, sizeof(double));
    s->da_dQ = PyMem_Calloc((size_t)n * n, sizeof(double));
    s->lam = PyMem_Calloc(m + 1, sizeof(double));
    s->Q = PyMem_Calloc(n, sizeof(double));
    s->e = PyMem_Calloc(s->rows + 1, sizeof(double));
    s->dx = PyMem_Calloc(2 * (size_t)D + 1, sizeof(double));
    if (!s->a || !s->da_dq || !s->da_dv || !s->da_dQ || !s->lam || !s->Q || !s->e || !s->dx) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* linearize(x_prev, x_cur, static_prev, static_cur, params) -> ok
 * The whitened linearization of the step's rows into A_cur, A_prev, r: the static rows evaluated at
 * (static_prev, static_cur), the others at (x_prev, x_cur); and b = −r − A (static − x) on the non-static rows
 * (the factor in δ = X − θ about θ = the static point).  False where the dynamics are singular (nothing usable
 * written: the caller linearizes in Python). */
static PyObject *
sk_py_linearize(StepKernel *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 5, "linearize") < 0)
        return NULL;
    int D = s->D, rs = s->rs, rows = s->rows;
    Buf bxp = {0}, bxc = {0}, btp = {0}, btc = {0};
    double *xp = NULL, *tp = NULL;
    PyObject *params = args[4];
    PyObject *ret = NULL;
    if (!PyList_Check(params)) {
        PyErr_SetString(PyExc_TypeError, "linearize: params must be a list");
        return NULL;
    }
    double *xc = get_doubles(args[1], &bxc, D, 0, "x_cur");
    double *tc = xc ? get_doubles(args[3], &btc, D, 0, "static_cur") : NULL;
    if (!tc)
        goto done;
    if (s->need_prev) {
        if (!(xp = get_doubles(args[0], &bxp, D, 0, "x_prev")) || !(tp = get_doubles(args[2], &btp, D, 0, "static_prev")))
            goto done;
    }
    /* static rows: r = S [θ_prev; θ_cur] (their A rows are fixed, written by the caller once) */
    for (int i = 0; i < rs; i++) {
        const double *Si = s->S + (size_t)i * (s->static_prev ? 2 * D : D);
        double sum = 0.0;
        if (s->static_prev) {
            for (int j = 0; j < D; j++)
                sum += Si[j] * tp[j];
            Si += D;
        }
        for (int j = 0; j < D; j++)
            sum += Si[j] * tc[j];
        s->r[i] = sum;
        s->b[i] = -sum;
    }
    memset(s->A_cur + (size_t)rs * D, 0, (size_t)(rows - rs) * D * sizeof(double));
    double *A_prev = s->dynamic_prev ? s->A_prev : NULL;     /* (else its non-static rows are zero, and stay) */
    if (A_prev)
        memset(A_prev + (size_t)rs * D, 0, (size_t)(rows - rs) * D * sizeof(double));
    int dyn = 0;
    double *const A[2] = {s->A_prev, s->A_cur};
    for (int i = 0; i < s->nunits; i++) {
        const Unit *u = &s->units[i];
        int st = unit_kinds[u->code].eval(s, u, xp, xc, params, s->r + u->row, 1, A, &dyn);
        if (st < 0)
            goto done;
        if (st > 0) {
            ret = Py_NewRef(Py_False);
            goto done;
        }
        for (int t = 0; t < u->dim; t++) {
            double w = u->w[t];
            int row = u->row + t;
            s->r[row] *= w;
            double *ac = s->A_cur + (size_t)row * D;
            for (int j = 0; j < D; j++)
                ac[j] *= w;
            if (A_prev) {
                double *ap = A_prev + (size_t)row * D;
                for (int j = 0; j < D; j++)
                    ap[j] *= w;
            }
        }
    }
    /* b = −r − A_cur (θ_cur − x_cur) − A_prev (θ_prev − x_prev) on the non-static rows */
    double *dc = s->dx, *dp = s->dx + D;
    for (int j = 0; j < D; j++)
        dc[j] = tc[j] - xc[j];
    if (A_prev)
        for (int j = 0; j < D; j++)
            dp[j] = tp[j] - xp[j];
    for (int i = rs; i < rows; i++) {
        const double *ac = s->A_cur + (size_t)i * D;
        double sum = 0.0;
        for (int j = 0; j < D; j++)
            sum += ac[j] * dc[j];
        if (A_prev) {
            const double *ap = A_prev + (size_t)i * D;
            for (int j = 0; j < D; j++)
                sum += ap[j] * dp[j];
        }
        s->b[i] = -s->r[i] - sum;
    }
    ret = Py_NewRef(Py_True);
done:
    release(&bxp), release(&bxc), release(&btp), release(&btc);
    return ret;
}

/* mismatch(A_cur, r, A_prev, lin_cur, lin_prev, x_cur, x_prev, params, weights) -> float or None
 * max over the checked rows of weight · |r + A_cur (x_cur − lin_cur) + A_prev (x_prev − lin_prev) − e_w(x)|,
 * e_w the whitened nonlinear error at (x_prev, x_cur) (A_prev / lin_prev / x_prev None where the checked rows do
 * not read X_{k−1}; weights None: all 1).  NaN where not finite; None where the dynamics are singular there. */
static PyObject *
sk_py_mismatch(StepKernel *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 9, "mismatch") < 0)
        return NULL;
    int D = s->D, nc = s->nchecks;
    Buf bA = {0}, br = {0}, bAp = {0}, blc = {0}, blp = {0}, bxc = {0}, bxp = {0}, bw = {0};
    double *Ap = NULL, *lp = NULL, *xp = NULL, *wts = NULL;
    PyObject *params = args[7];
    PyObject *ret = NULL;
    if (!PyList_Check(params)) {
        PyErr_SetString(PyExc_TypeError, "mismatch: params must be a list");
        return NULL;
    }
    double *A = get_doubles(args[0], &bA, (Py_ssize_t)nc * D, 0, "A_cur");
    double *r = A ? get_doubles(args[1], &br, nc, 0, "r") : NULL;
    double *lc = r ? get_doubles(args[3], &blc, D, 0, "lin_cur") : NULL;
    double *xc = lc ? get_doubles(args[5], &bxc, D, 0, "x_cur") : NULL;
    if (!xc)
        goto done;
    if (args[2] != Py_None) {
        if (!(Ap = get_doubles(args[2], &bAp, (Py_ssize_t)nc * D, 0, "A_prev")) ||
            !(lp = get_doubles(args[4], &blp, D, 0, "lin_prev")) || !(xp = get_doubles(args[6], &bxp, D, 0, "x_prev")))
            goto done;
    } else if (args[6] != Py_None) {
        if (!(xp = get_doubles(args[6], &bxp, D, 0, "x_prev")))
            goto done;
    }
    if (args[8] != Py_None && !(wts = get_doubles(args[8], &bw, nc, 0, "weights")))
        goto done;
    double *e = s->e;
    int dyn = 0;
    double *const no_jacobians[2] = {NULL, NULL};
    for (int i = 0; i < s->nunits; i++) {
        const Unit *u = &s->units[i];
        if (!u->check)
            continue;
        int reads_prev = 0;
        for (int j = 0; j < u->nslots; j++)
            reads_prev |= !u->which[j];
        if (reads_prev && !xp) {
            PyErr_SetString(PyExc_ValueError, "mismatch: the checked rows read X_{k-1}: x_prev is required");
            goto done;
        }
        int st = unit_kinds[u->code].eval(s, u, xp, xc, params, e + u->check_row, 0, no_jacobians, &dyn);
        if (st < 0)
            goto done;
        if (st > 0) {
            ret = Py_NewRef(Py_None);
            goto done;
        }
        for (int t = 0; t < u->dim; t++)
            e[u->check_row + t] *= u->w[t];
    }
    double *dc = s->dx, *dp = s->dx + D;
    for (int j = 0; j < D; j++)
        dc[j] = xc[j] - lc[j];
    if (Ap)
        for (int j = 0; j < D; j++)
            dp[j] = xp[j] - lp[j];
    double mx = 0.0;
    for (int i = 0; i < nc; i++) {
        const double *Ai = A + (size_t)i * D;
        double sum = 0.0;
        for (int j = 0; j < D; j++)
            sum += Ai[j] * dc[j];
        double lin = sum + r[i];
        if (Ap) {
            const double *Api = Ap + (size_t)i * D;
            double sp = 0.0;
            for (int j = 0; j < D; j++)
                sp += Api[j] * dp[j];
            lin += sp;
        }
        double d = fabs(lin - e[i]);
        if (wts)
            d *= wts[i];
        if (d != d) {
            mx = d;
            break;
        }
        if (d > mx)
            mx = d;
    }
    ret = PyFloat_FromDouble(mx);
done:
    release(&bA), release(&br), release(&bAp), release(&blc), release(&blp), release(&bxc), release(&bxp), release(&bw);
    return ret;
}

static PyObject *
sk_get_rows(StepKernel *s, void *closure)
{
    return PyLong_FromLong(s->nchecks);
}

static PyGetSetDef sk_getset[] = {
    {"check_rows", (getter)sk_get_rows, NULL, "number of rows in the relinearization check", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef sk_methods[] = {
    {"linearize", (PyCFunction)(void (*)(void))sk_py_linearize, METH_FASTCALL,
     "linearize(x_prev, x_cur, static_prev, static_cur, params) -> ok (see the C source)."},
    {"mismatch", (PyCFunction)(void (*)(void))sk_py_mismatch, METH_FASTCALL,
     "mismatch(A_cur, r, A_prev, lin_cur, lin_prev, x_cur, x_prev, params, weights) -> float, or None where the "
     "dynamics are singular."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StepKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mbfg_ros.native._kernel.StepKernel",
    .tp_basicsize = sizeof(StepKernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One step model's linearization and relinearization check (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sk_init,
    .tp_dealloc = (destructor)sk_dealloc,
    .tp_methods = sk_methods,
    .tp_getset = sk_getset,
};

/* ================================================================================================== module */

/* scaled_distance2(A, x, lin) -> Σⱼ (‖A[:, j]‖ (xⱼ − linⱼ))²: the squared distance of x from lin, each variable
 * scaled by the column norm of A (rows × D) — the relinearization check's quadratic bound (FixedLagWindow). */
static PyObject *
py_scaled_distance2(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 3, "scaled_distance2") < 0)
        return NULL;
    Buf bA = {0}, bx = {0}, bl = {0};
    PyObject *ret = NULL;
    double *x = get_doubles(args[1], &bx, -1, 0, "x");
    Py_ssize_t D = x ? bx.view.len / 8 : 0;
    double *lin = x ? get_doubles(args[2], &bl, D, 0, "lin") : NULL;
    double *A = lin ? get_doubles(args[0], &bA, -1, 0, "A") : NULL;
    if (A) {
        Py_ssize_t len = bA.view.len / 8;
        if (D == 0 ? len != 0 : len % D) {
            PyErr_Format(PyExc_ValueError, "A: rows of %zd values expected, got %zd values", D, len);
        } else {
            Py_ssize_t rows = D ? len / D : 0;
            double sum = 0.0;
            for (Py_ssize_t j = 0; j < D; j++) {
                double c = 0.0;
                for (Py_ssize_t i = 0; i < rows; i++) {
                    double a = A[i * D + j];
                    c += a * a;
                }
                double t = (x[j] - lin[j]) * sqrt(c);
                sum += t * t;
            }
            ret = PyFloat_FromDouble(sum);
        }
    }
    release(&bA), release(&bx), release(&bl);
    return ret;
}

/* C = A B (p × p, row-major), row by row (each C[i][j] sums over l in order); skip_zeros: A's zeros left out (a
 * NaN or infinity in B then spreads only where A reaches it) */
static void
matmul_rows(const double *A, const double *B, int p, double *C, int skip_zeros)
{
    for (int i = 0; i < p; i++) {
        double *Ci = C + (size_t)i * p;
        for (int j = 0; j < p; j++)
            Ci[j] = 0.0;
        for (int l = 0; l < p; l++) {
            double a = A[(size_t)i * p + l];
            if (skip_zeros && a == 0.0)
                continue;
            const double *Bl = B + (size_t)l * p;
            for (int j = 0; j < p; j++)
                Ci[j] += a * Bl[j];
        }
    }
}

static void
matmul_square(const double *A, const double *B, int p, double *C)
{
    matmul_rows(A, B, p, C, 1);
}

/* C = A Bᵀ (p × p, row-major), Bᵀ first written to Bt (p × p): each C[i][j] sums A[i][l] B[j][l] over l in order,
 * as the plain dot product does, in rows the compiler can vectorize */
static void
times_transposed(const double *A, const double *B, int p, double *C, double *Bt)
{
    for (int i = 0; i < p; i++)
        for (int j = 0; j < p; j++)
            Bt[(size_t)j * p + i] = B[(size_t)i * p + j];
    matmul_rows(A, Bt, p, C, 0);
}

/* C = A B with A sparse (a filter's model Jacobian is mostly zeros and identities): A's non-zeros by row, as
 * (start per row p + 1, column, value) */
static void
sparse_times(const int *start, const int *col, const double *val, const double *B, int p, double *C)
{
    for (int i = 0; i < p; i++) {
        double *Ci = C + (size_t)i * p;
        for (int j = 0; j < p; j++)
            Ci[j] = 0.0;
        for (int e = start[i]; e < start[i + 1]; e++) {
            double a = val[e];
            const double *Bl = B + (size_t)col[e] * p;
            for (int j = 0; j < p; j++)
                Ci[j] += a * Bl[j];
        }
    }
}

/* C = B A with A sparse as in sparse_times */
static void
times_sparse(const double *B, const int *start, const int *col, const double *val, int p, double *C)
{
    memset(C, 0, (size_t)p * p * sizeof(double));
    for (int i = 0; i < p; i++) {
        const double *Bi = B + (size_t)i * p;
        double *Ci = C + (size_t)i * p;
        for (int l = 0; l < p; l++) {
            double b = Bi[l];
            for (int e = start[l]; e < start[l + 1]; e++)
                Ci[col[e]] += b * val[e];
        }
    }
}

/* The work of discretize_one for p × p matrices: 6 p² doubles, p² + p + 1 ints (Bt: times_transposed's). */
typedef struct {
    double *At, *tF, *tQ, *tmp, *val, *Bt;
    int *start, *col;
} DiscretizeWork;

static int
discretize_work(DiscretizeWork *w, int p)
{
    size_t pp = (size_t)p * p;
    w->At = PyMem_Calloc(6 * pp + 1, sizeof(double));
    w->start = PyMem_Calloc(pp + p + 2, sizeof(int));
    if (!w->At || !w->start) {
        PyMem_Free(w->At), PyMem_Free(w->start);
        PyErr_NoMemory();
        return -1;
    }
    w->tF = w->At + pp, w->tQ = w->tF + pp, w->tmp = w->tQ + pp, w->val = w->tmp + pp, w->Bt = w->val + pp;
    w->col = w->start + p + 1;
    return 0;
}

static void
discretize_free(DiscretizeWork *w)
{
    PyMem_Free(w->At), PyMem_Free(w->start);
}

/* F = e^{A h} and Q = ∫₀ʰ e^{As} W e^{Aᵀs} ds (p × p; W symmetric) by the series of
 * mbfg_ros.estimation.reduced_ekf.discretize: `order` terms over h/2ˢ with ‖A‖∞ h/2ˢ ≤ 1/4, then s doublings.
 * L(X) = AX + XAᵀ keeps a symmetric X symmetric: each Q term is one product and its transpose.  A non-finite A
 * gives NaN. */
static void
discretize_one(const double *A, const double *W, double h, long order, int p, double *F, double *Q,
               DiscretizeWork *w)
{
    size_t pp = (size_t)p * p;
    double norm = 0.0;
    for (int i = 0; i < p; i++) {
        double r = 0.0;
        for (int j = 0; j < p; j++)
            r += fabs(A[(size_t)i * p + j]);
        if (r > norm || r != r)
            norm = r;
    }
    norm *= h;
    if (!(norm < 1e300)) {
        for (size_t i = 0; i < pp; i++)
            F[i] = Q[i] = NAN;
        return;
    }
    int squarings = norm > 0.25 ? (int)ceil(log2(norm / 0.25)) : 0;
    double tau = h / ldexp(1.0, squarings);
    int nnz = 0;
    for (int i = 0; i < p; i++) {
        w->start[i] = nnz;
        for (int j = 0; j < p; j++) {
            double a = A[(size_t)i * p + j] * tau;
            w->At[(size_t)i * p + j] = a;
            if (a != 0.0)
                w->col[nnz] = j, w->val[nnz++] = a;
        }
    }
    w->start[p] = nnz;
    for (size_t i = 0; i < pp; i++) {
        w->tQ[i] = Q[i] = W[i] * tau;
        w->tF[i] = F[i] = 0.0;
    }
    for (int i = 0; i < p; i++)
        w->tF[(size_t)i * p + i] = F[(size_t)i * p + i] = 1.0;
    double *tmp = w->tmp;
    for (long t = 1; t <= order; t++) {
        times_sparse(w->tF, w->start, w->col, w->val, p, tmp);
        for (size_t i = 0; i < pp; i++) {
            w->tF[i] = tmp[i] / (double)t;
            F[i] += w->tF[i];
        }
        sparse_times(w->start, w->col, w->val, w->tQ, p, tmp);
        for (int i = 0; i < p; i++)
            for (int j = 0; j < p; j++) {
                double v = (tmp[(size_t)i * p + j] + tmp[(size_t)j * p + i]) / (double)(t + 1);
                w->tQ[(size_t)i * p + j] = v;
                Q[(size_t)i * p + j] += v;
            }
    }
    for (int t = 0; t < squarings; t++) {
        /* Q ← F Q Fᵀ + Q, F ← F F */
        matmul_square(F, Q, p, tmp);
        times_transposed(tmp, F, p, w->tQ, w->Bt);
        for (size_t i = 0; i < pp; i++)
            Q[i] += w->tQ[i];
        matmul_square(F, F, p, tmp);
        memcpy(F, tmp, pp * sizeof(double));
    }
}

/* the p of a stack of square p × p matrices (the buffer's last axis), or −1 with an exception */
static Py_ssize_t
square_size(Buf *b, Py_ssize_t len, const char *what)
{
    Py_ssize_t p = (b->view.ndim >= 2 && b->view.shape) ? b->view.shape[b->view.ndim - 1] : 0;
    if (p <= 0 || len % (p * p)) {
        PyErr_Format(PyExc_ValueError, "%s: a stack of square matrices is expected", what);
        return -1;
    }
    return p;
}

/* discretize(A, W, h, order, F, Q): discretize_one of each of N stacked p × p matrices A and symmetric W, each
 * scaled by its own norm (the numpy form scales a stack by its largest: the same numbers to rounding). */
static PyObject *
py_discretize(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (mk_check_nargs(nargs, 6, "discretize") < 0)
        return NULL;
    double h = PyFloat_AsDouble(args[2]);
    long order = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Buf bA = {0}, bW = {0}, bF = {0}, bQ = {0};
    PyObject *ret = NULL;
    DiscretizeWork w = {0};
    double *A = get_doubles(args[0], &bA, -1, 0, "A");
    Py_ssize_t len = A ? bA.view.len / 8 : 0;
    double *W = A ? get_doubles(args[1], &bW, len, 0, "W") : NULL;
    double *F = W ? get_doubles(args[4], &bF, len, 1, "F") : NULL;
    double *Qd = F ? get_doubles(args[5], &bQ, len, 1, "Q") : NULL;
    Py_ssize_t p = Qd ? square_size(&bA, len, "A") : -1;
    if (p < 0 || discretize_work(&w, (int)p) < 0)
        goto done;
    for (Py_ssize_t s = 0, pp = p * p; s < len / pp; s++)
        discretize_one(A + s * pp, W + s * pp, h, order, (int)p, F + s * pp, Qd + s * pp, &w);
    ret = Py_NewRef(Py_None);
done:
    discretize_free(&w);
    release(&bA), release(&bW), release(&bF), release(&bQ);
    return ret;
}

/* The work of kalman_one for p states and r readings: F, Qd, a product, I − GH; S and its LU, ν, S⁻¹ν, S⁻¹ P_yx,
 * the gain G (p × n_read), R_yy Gᵀ. */
typedef struct {
    double *F, *Qd, *T, *IKH, *S, *nu, *wnu, *X, *G;
    int *read, *piv;
    int nr;
    double *mem;
    int *imem;
} KalmanWork;

static int
kalman_work(KalmanWork *kw, Py_ssize_t p, Py_ssize_t r, const double *y)
{
    size_t pp = (size_t)p * p;
    kw->mem = PyMem_Calloc(4 * pp + 2 * (size_t)r * r + 3 * (size_t)r + 2 * (size_t)r * p + 1, sizeof(double));
    kw->imem = PyMem_Calloc(2 * (size_t)r + 1, sizeof(int));
    if (!kw->mem || !kw->imem) {
        PyMem_Free(kw->mem), PyMem_Free(kw->imem);
        kw->mem = NULL, kw->imem = NULL;
        PyErr_NoMemory();
        return -1;
    }
    kw->F = kw->mem, kw->Qd = kw->F + pp, kw->T = kw->Qd + pp, kw->IKH = kw->T + pp, kw->S = kw->IKH + pp;
    kw->nu = kw->S + r * r + r * r, kw->wnu = kw->nu + r, kw->X = kw->wnu + r + r, kw->G = kw->X + r * p;
    kw->read = kw->imem, kw->piv = kw->imem + r;
    kw->nr = 0;
    for (int i = 0; i < r; i++)
        if (isfinite(y[i]))
            kw->read[kw->nr++] = i;
    return 0;
}

static void
kalman_work_free(KalmanWork *kw)
{
    PyMem_Free(kw->mem), PyMem_Free(kw->imem);
}

/* The z̈ block of a filter's noise density (rows and columns `offset`..offset + d − 1 of the p × p W): S (BᵀB)⁻¹
 * for the tangents B (n × d) of its pose, the density S on every generalized acceleration restricted to the
 * motions the constraints allow (estimation.reduced_ekf.encoded_acceleration_noise).  A singular BᵀB gives NaN
 * (the bank fails that filter).  work: d² + d doubles, piv: d ints. */
static void
acceleration_noise_block(const double *B, Py_ssize_t n, Py_ssize_t d, double S, double *W, Py_ssize_t p,
                         Py_ssize_t offset, double *work, int *piv)
{
    double *G = work, *c = work + d * d;
    for (Py_ssize_t a = 0; a < d; a++)
        for (Py_ssize_t b = 0; b < d; b++) {
            double v = 0.0;
            for (Py_ssize_t i = 0; i < n; i++)
                v += B[i * d + a] * B[i * d + b];
            G[a * d + b] = v;
        }
    int singular = lu_factor(G, piv, (int)d);
    for (Py_ssize_t j = 0; j < d; j++) {
        for (Py_ssize_t a = 0; a < d; a++)
            c[a] = a == j ? 1.0 : 0.0;
        if (!singular)
            lu_solve(G, piv, (int)d, c);
        for (Py_ssize_t a = 0; a < d; a++)
            W[(offset + a) * p + offset + j] = singular ? NAN : S * c[a];
    }
}

/* The optional z̈ noise of kalman_step and deflected_kalman_step: (acceleration_density (K), basis (K × n × d))
 * as args[i], args[i + 1] when given (nargs > i), and acceleration_noise_block's work. */
typedef struct {
    Buf bS, bB;
    const double *S, *B;
    Py_ssize_t n;
    double *mem;
    int *piv;
} AccelerationNoise;

static int
acceleration_noise_args(AccelerationNoise *an, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t i,
                        Py_ssize_t K, Py_ssize_t d, const char *name)
{
    memset(an, 0, sizeof *an);
    if (nargs <= i)
        return 0;
    an->S = get_doubles(args[i], &an->bS, K, 0, "acceleration_density");
    an->B = an->S ? get_doubles(args[i + 1], &an->bB, -1, 0, "basis") : NULL;
    if (!an->B)
        return -1;
    if (d <= 0 || an->bB.view.len / 8 % (K * d)) {
        PyErr_Format(PyExc_ValueError, "%s: basis must be K × n × d (d the readings)", name);
        return -1;
    }
    an->n = an->bB.view.len / 8 / (K * d);
    an->mem = PyMem_Calloc((size_t)(d * d + d), sizeof(double));
    an->piv = PyMem_Calloc((size_t)d, sizeof(int));
    if (!an->mem || !an->piv) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
acceleration_noise_free(AccelerationNoise *an)
{
    PyMem_Free(an->mem), PyMem_Free(an->piv);
    release(&an->bS), release(&an->bB);
}

/* One filter's covariance prediction and update (kalman_step's docstring), in place: P (p × p), x (p), its log-
 * likelihood; y (r) and the filter's R (r × r). */
static void
kalman_one(const double *A, const double *W, double h, long order, Py_ssize_t p, double *Pk, double *xk,
           const double *y, Py_ssize_t r, const double *Rk, double *llk, KalmanWork *kw, DiscretizeWork *w)
{
    size_t pp = (size_t)p * p;
    double *F = kw->F, *Qd = kw->Qd, *T = kw->T, *IKH = kw->IKH, *S = kw->S, *nu = kw->nu, *wnu = kw->wnu;
    double *X = kw->X, *G = kw->G;
    const int *read = kw->read;
    int *piv = kw->piv, nr = kw->nr;
    discretize_one(A, W, h, order, (int)p, F, Qd, w);
    matmul_square(F, Pk, (int)p, T);
    times_transposed(T, F, (int)p, Pk, w->Bt);
    for (size_t i = 0; i < pp; i++)
        Pk[i] += Qd[i];
    if (!nr)
        return;
    for (int a = 0; a < nr; a++) {
        for (int b = 0; b < nr; b++)
            S[a * nr + b] = Pk[(Py_ssize_t)read[a] * p + read[b]] + Rk[(Py_ssize_t)read[a] * r + read[b]];
        nu[a] = y[read[a]] - xk[read[a]];
    }
    if (lu_factor(S, piv, nr)) {
        *llk = NAN;
        return;
    }
    double logdet = 0.0;
    for (int a = 0; a < nr; a++)
        logdet += log(fabs(S[a * nr + a]));
    memcpy(wnu, nu, nr * sizeof(double));
    lu_solve(S, piv, nr, wnu);
    double quad = 0.0;
    for (int a = 0; a < nr; a++)
        quad += nu[a] * wnu[a];
    *llk -= 0.5 * (quad + logdet + nr * log(2.0 * M_PI));
    /* G = (S⁻¹ P_yx)ᵀ, column by column of P_yx */
    for (Py_ssize_t j = 0; j < p; j++) {
        double *c = X + j * nr;
        for (int a = 0; a < nr; a++)
            c[a] = Pk[(Py_ssize_t)read[a] * p + j];
        lu_solve(S, piv, nr, c);
        for (int a = 0; a < nr; a++)
            G[j * nr + a] = c[a];
    }
    for (Py_ssize_t i = 0; i < p; i++) {
        double s = 0.0;
        for (int a = 0; a < nr; a++)
            s += G[i * nr + a] * nu[a];
        xk[i] += s;
    }
    for (size_t i = 0; i < pp; i++)
        IKH[i] = 0.0;
    for (Py_ssize_t i = 0; i < p; i++) {
        IKH[i * p + i] = 1.0;
        for (int a = 0; a < nr; a++)
            IKH[i * p + read[a]] -= G[i * nr + a];
    }
    /* RG = R_yy Gᵀ (n_read × p, in X), then P ← IKH P IKHᵀ + G RG */
    for (int a = 0; a < nr; a++)
        for (Py_ssize_t j = 0; j < p; j++) {
            double s = 0.0;
            for (int b = 0; b < nr; b++)
                s += Rk[(Py_ssize_t)read[a] * r + read[b]] * G[j * nr + b];
            X[a * p + j] = s;
        }
    matmul_square(IKH, Pk, (int)p, T);
    times_transposed(T, IKH, (int)p, Pk, w->Bt);
    for (Py_ssize_t i = 0; i < p; i++)
        for (int a = 0; a < nr; a++) {
            double g = G[i * nr + a];
            for (Py_ssize_t j = 0; j < p; j++)
                Pk[i * p + j] += g * X[a * p + j];
        }
}

/* kalman_step(A, W, h, order, P, x, y, R, log_likelihood[, acceleration_density, basis])
 * The covariance half of a step of K Kalman filters whose readings y (r) measure the first r states (NaN: no
 * reading of that one), in place (filter_bank.ReducedEKFBank.step's numpy form): P ← F P Fᵀ + Qd with
 * (F, Qd) = discretize_one(A, W, h) (A, W, P: K × p × p), then the update with the readings present at the
 * predicted means x (K × p) and their covariances R (K × r × r): S = P_yy + R_yy, log_likelihood (K) −=
 * ½ (νᵀS⁻¹ν + log det S + n_read log 2π), x += G ν, P ← (I − G H) P (I − G H)ᵀ + G R Gᵀ (Joseph form) with the
 * gain G = P Hᵀ S⁻¹.  A filter whose S is singular gets NaN (the bank fails it).  With acceleration_density (K)
 * and the tangents `basis` (K × n × r) of each filter's pose, W's z̈ block (rows and columns r..2r − 1) is
 * acceleration_noise_block's instead of W's own.
 *
 * deflected_kalman_step(A, W, h, order, P, x, y, R, log_likelihood, b, time_constant, deflection_noise
 *                       [, acceleration_density, basis])
 * The same for filters that also carry the encoders' deflection b (K × r, a Gauss–Markov state of time constant
 * T_b per encoder, white-noise density deflection_noise (K × r)), the readings measuring m = z + b
 * (filter_bank.ReducedEKFBank: the motion's x (K × nx) with z its first r entries, its A and W (K × nx × nx), the
 * covariance P (K × (nx + r)²) over x' = (m, ż, e, ė, b)).  Per filter: A' = T [A 0; 0 −I/T_b] T⁻¹ and
 * W' = T [W 0; 0 diag(noise)] Tᵀ for T: (z, …, b) ↦ (z + b, …, b); the mean x' = (z + b', …, b') with
 * b' = b e^{−h/T_b}; the step over x'; then b = x'_b, x = x'_x with z = m − b.  In place: P, x, b,
 * log_likelihood. */
static PyObject *
kalman_steps(PyObject *const *args, Py_ssize_t nargs, int deflected, const char *name)
{
    Py_ssize_t base = deflected ? 12 : 9;
    if (nargs != base && nargs != base + 2) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd or %zd arguments (%zd given)", name, base, base + 2, nargs);
        return NULL;
    }
    double h = PyFloat_AsDouble(args[2]);
    long order = PyLong_AsLong(args[3]);
    double tb = deflected ? PyFloat_AsDouble(args[10]) : 1.0;
    if (PyErr_Occurred())
        return NULL;
    if (!(tb > 0.0)) {
        PyErr_Format(PyExc_ValueError, "%s: the time constant must be > 0", name);
        return NULL;
    }
    Buf bA = {0}, bW = {0}, bP = {0}, bx = {0}, by = {0}, bR = {0}, bl = {0}, bb = {0}, bn = {0};
    PyObject *ret = NULL;
    DiscretizeWork w = {0};
    KalmanWork kw = {0};
    AccelerationNoise an = {0};
    double *work = NULL, *b = NULL, *noise = NULL;
    double *A = get_doubles(args[0], &bA, -1, 0, "A");
    Py_ssize_t len = A ? bA.view.len / 8 : 0;
    Py_ssize_t nx = A ? square_size(&bA, len, "A") : -1;
    if (nx < 0)
        goto done;
    Py_ssize_t K = len / (nx * nx);
    double *W = get_doubles(args[1], &bW, len, 0, "W");
    double *y = W ? get_doubles(args[6], &by, -1, 0, "y") : NULL;
    Py_ssize_t r = y ? by.view.len / 8 : 0, p = nx + (deflected ? r : 0), pp = p * p;
    double *P = y ? get_doubles(args[4], &bP, K * pp, 1, "P") : NULL;
    double *x = P ? get_doubles(args[5], &bx, K * nx, 1, "x") : NULL;
    double *R = x ? get_doubles(args[7], &bR, K * r * r, 0, "R") : NULL;
    double *ll = R ? get_doubles(args[8], &bl, K, 1, "log_likelihood") : NULL;
    if (ll && deflected) {
        b = get_doubles(args[9], &bb, K * r, 1, "b");
        noise = b ? get_doubles(args[11], &bn, K * r, 0, "deflection_noise") : NULL;
    }
    if (!ll || (deflected && !noise))
        goto done;
    if (r > nx || (nargs > base && 2 * r > nx)) {
        PyErr_Format(PyExc_ValueError, "%s: more readings than states", name);
        goto done;
    }
    if (acceleration_noise_args(&an, args, nargs, base, K, r, name) < 0)
        goto done;
    if (discretize_work(&w, (int)p) < 0 || kalman_work(&kw, p, r, y) < 0)
        goto done;
    /* the filter's A', W' (p × p) and x' (p) where they are not the caller's */
    if (!(work = PyMem_Calloc(2 * (size_t)pp + (size_t)p, sizeof(double)))) {
        PyErr_NoMemory();
        goto done;
    }
    double *A1 = work, *W1 = A1 + pp, *x1 = W1 + pp;
    double decay = exp(-h / tb);
    Py_BEGIN_ALLOW_THREADS      /* plain numbers from here (another thread's filter bank runs meanwhile) */
    for (Py_ssize_t k = 0; k < K; k++) {
        const double *Ak = A + k * nx * nx, *Wk = W + k * nx * nx;
        double *xk = x + k * nx;
        if (!deflected) {
            if (an.S) {
                memcpy(W1, Wk, pp * sizeof(double));
                acceleration_noise_block(an.B + k * an.n * r, an.n, r, an.S[k], W1, p, r, an.mem, an.piv);
                Wk = W1;
            }
            kalman_one(Ak, Wk, h, order, p, P + k * pp, xk, y, r, R + k * r * r, ll + k, &kw, &w);
            continue;
        }
        double *bk = b + k * r;
        for (Py_ssize_t i = 0; i < pp; i++)
            A1[i] = W1[i] = 0.0;
        for (Py_ssize_t i = 0; i < nx; i++)
            for (Py_ssize_t j = 0; j < nx; j++)
                A1[i * p + j] = Ak[i * nx + j], W1[i * p + j] = Wk[i * nx + j];
        if (an.S)
            acceleration_noise_block(an.B + k * an.n * r, an.n, r, an.S[k], W1, p, r, an.mem, an.piv);
        for (Py_ssize_t i = nx; i < p; i++)
            A1[i * p + i] = -1.0 / tb, W1[i * p + i] = noise[k * r + (i - nx)];
        /* T from the left: row i of m gains row nx + i; then T⁻¹ (A') or Tᵀ (W') from the right */
        for (Py_ssize_t i = 0; i < r; i++)
            for (Py_ssize_t j = 0; j < p; j++)
                A1[i * p + j] += A1[(nx + i) * p + j], W1[i * p + j] += W1[(nx + i) * p + j];
        for (Py_ssize_t row = 0; row < p; row++)
            for (Py_ssize_t i = 0; i < r; i++) {
                A1[row * p + nx + i] -= A1[row * p + i];
                W1[row * p + i] += W1[row * p + nx + i];
            }
        for (Py_ssize_t i = 0; i < nx; i++)
            x1[i] = xk[i];
        for (Py_ssize_t i = 0; i < r; i++) {
            double bi = bk[i] * decay;
            x1[nx + i] = bi;
            x1[i] += bi;
        }
        kalman_one(A1, W1, h, order, p, P + k * pp, x1, y, r, R + k * r * r, ll + k, &kw, &w);
        for (Py_ssize_t i = 0; i < r; i++)
            bk[i] = x1[nx + i];
        for (Py_ssize_t i = 0; i < nx; i++)
            xk[i] = x1[i];
        for (Py_ssize_t i = 0; i < r; i++)
            xk[i] -= bk[i];
    }
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyMem_Free(work);
    acceleration_noise_free(&an);
    discretize_free(&w);
    kalman_work_free(&kw);
    release(&bA), release(&bW), release(&bP), release(&bx), release(&by), release(&bR), release(&bl);
    release(&bb), release(&bn);
    return ret;
}

static PyObject *
py_kalman_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return kalman_steps(args, nargs, 0, "kalman_step");
}

static PyObject *
py_deflected_kalman_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return kalman_steps(args, nargs, 1, "deflected_kalman_step");
}

/* identified_forces(par, doubles, theta, v, commands, a, out): out (n) = ΔQ, the identified parameters' forces
 * (identified_add_forces; par: per parameter its kind, coordinate and actuator, as an identified_dynamics unit's
 * integers after its efforts' part, doubles its doubles) at θ, rates v, commands and accelerations a (n each) */
static PyObject *
py_identified_forces(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "identified_forces: 7 arguments expected, got %zd", nargs);
        return NULL;
    }
    PyObject *fast = PySequence_Fast(args[0], "identified_forces: par must be a sequence of integers");
    if (!fast)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    int np_ = (int)(len / 3), *par = PyMem_Malloc((size_t)(len ? len : 1) * sizeof(int));
    Buf b[6];
    double *p[6];
    PyObject *ret = NULL;
    memset(b, 0, sizeof b);
    if (!par) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (x == -1 && PyErr_Occurred())
            goto done;
        par[i] = (int)x;
    }
    static const char *names[6] = {"doubles", "theta", "v", "commands", "a", "out"};
    Py_ssize_t sizes[6] = {-1, np_, -1, -1, -1, -1};
    if (!get_all(args + 1, 6, b, p, sizes, names, 5))
        goto done;
    Py_ssize_t n = b[2].view.len / 8, nu = b[3].view.len / 8;
    if (len % 3 || b[4].view.len / 8 != n || b[5].view.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "identified_forces: par must hold 3 integers per parameter and v, a, out "
                                          "as many values as the mechanism has coordinates");
        goto done;
    }
    const char *bad = identified_parameters_problem((int)n, np_, par, p[0], b[0].view.len / 8);
    for (int j = 0; j < np_ && !bad; j++)
        if (par[3 * j] == PARAMETER_GAIN && par[3 * j + 2] >= nu)
            bad = "a gain's actuator has no command";
    if (bad) {
        PyErr_Format(PyExc_ValueError, "identified_forces: %s", bad);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        p[5][i] = 0.0;
    identified_add_forces((int)n, np_, par, p[0], p[1], p[2], p[3], p[4], p[5]);
    ret = Py_NewRef(Py_None);
done:
    release_all(b, 6);
    PyMem_Free(par);
    Py_DECREF(fast);
    return ret;
}

static PyMethodDef module_methods[] = {
    {"scaled_distance2", (PyCFunction)(void (*)(void))py_scaled_distance2, METH_FASTCALL,
     "scaled_distance2(A, x, lin) -> Σⱼ (‖A[:, j]‖ (xⱼ − linⱼ))²."},
    {"discretize", (PyCFunction)(void (*)(void))py_discretize, METH_FASTCALL,
     "discretize(A, W, h, order, F, Q): e^{Ah} and the integrated noise of stacked square matrices."},
    {"kalman_step", (PyCFunction)(void (*)(void))py_kalman_step, METH_FASTCALL,
     "kalman_step(A, W, h, order, P, x, y, R, log_likelihood[, acceleration_density, basis]): a bank's "
     "covariance prediction and update."},
    {"deflected_kalman_step", (PyCFunction)(void (*)(void))py_deflected_kalman_step, METH_FASTCALL,
     "deflected_kalman_step(A, W, h, order, P, x, y, R, log_likelihood, b, time_constant, deflection_noise): "
     "kalman_step of a bank whose readings also carry the encoders' deflection b."},
    {"identified_forces", (PyCFunction)(void (*)(void))py_identified_forces, METH_FASTCALL,
     "identified_forces(par, doubles, theta, v, commands, a, out): the identified parameters' forces into out."},
    {NULL, NULL, 0, NULL}};

/* The SHA-256 of this file as setup.py read it when it compiled it ("unknown" in a build that did not say):
   mbfg_ros.native.SOURCE_SHA256, checked against the sources by the tests. */
#ifndef MBFG_KERNEL_SOURCE_SHA256
#define MBFG_KERNEL_SOURCE_SHA256 "unknown"
#endif

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "mbfg_ros.native._kernel",
    "The per-step numerics of mbfg_ros's fast path in C (see mbfg_ros.native).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__kernel(void)
{
    if (PyType_Ready(&MechanismKernelType) < 0 || PyType_Ready(&StepKernelType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&kernel_module);
    if (!mod)
        return NULL;
    if (PyModule_AddObjectRef(mod, "MechanismKernel", (PyObject *)&MechanismKernelType) < 0 ||
        PyModule_AddObjectRef(mod, "StepKernel", (PyObject *)&StepKernelType) < 0 ||
        PyModule_AddStringConstant(mod, "SOURCE_SHA256", MBFG_KERNEL_SOURCE_SHA256) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    PyObject *kinds = unit_kinds_dict();
    if (!kinds || PyModule_AddObject(mod, "UNIT_KINDS", kinds) < 0) {
        Py_XDECREF(kinds);
        Py_DECREF(mod);
        return NULL;
    }
    PyObject *parameters = parameter_kinds_dict();
    if (!parameters || PyModule_AddObject(mod, "PARAMETER_KINDS", parameters) < 0) {
        Py_XDECREF(parameters);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
