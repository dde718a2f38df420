/* The compiled engine: the hot path of dask_coro.core.engine, in C.
 *
 * Optional. The pure engine (engine.py, runtime/call.py) is the reference:
 * this module holds no state of its own and defines no data layout. It reads
 * and writes the very slots of the Python classes (engine.Frame, the call
 * type CoroutineCall, stealing.Idle), at the offsets their member descriptors
 * give (``setup``), so a frame or a call is the same object whichever code
 * touched it last, and either engine can take over from the other between
 * two steps.
 *
 *   steps(tramp, top, run, countdown, barren, stack, idle, call_type, annotations_now,
 *         own_annotations)
 *       The inner loop of Trampoline._steps ("go on with top's current
 *       yield"), for the common case only: leaves of the trampoline's call
 *       type that may run inline, generator bodies that yield a list or tuple
 *       of such calls, or return. It stops at anything else and says where
 *       the pure loop goes on (``SLOW``: the pure loop runs the iteration it
 *       stopped before, nothing of which was done; ``BREAK``: a body is to
 *       be stepped, as the pure inner loop's ``break``; ``DONE``: the root
 *       returned).
 *   FunctionBase
 *       The base of runtime.call.CoroutineFunction: calling it makes a call
 *       object as CoroutineFunction.__call__ (pure: runtime/call.py
 *       _MakesCalls) does, in C.
 *
 * CPython's public C API (PyIter_Send: 3.10), 3.10 to 3.13, with the GIL;
 * one read beyond it, whether a step changed its context's variables
 * (``ContextHead``: the layout is checked by ``setup``, which falls back to
 * comparing contexts). Every entry checks what it is given: no call from
 * Python, whatever its arguments, crashes the interpreter
 * (tests/core/test_engines.py calls each with wrong ones).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The versions it was written and tested for (setup.py leaves it out of
 * others, as where no compiler is found): it reads member descriptors and
 * pops a list in place. */
#if PY_VERSION_HEX < 0x030A0000 || PY_VERSION_HEX >= 0x030E0000
#error "the compiled engine is written for CPython 3.10 to 3.13"
#endif
/* A free-threaded build: lists and the free list of calls are shared
 * between threads without a lock; the pure engine runs there. */
#ifdef Py_GIL_DISABLED
#error "the compiled engine needs the GIL (a free-threaded build runs the pure engine)"
#endif

/* -- what setup() gives ---------------------------------------------------- */

static int READY = 0;
static PyObject *NOT_DONE, *PENDING, *STEPPED, *EMPTY, *RANGES, *FAILED, *REQUEST;
static PyObject *ZERO, *NO_KWARGS;
static PyObject *TRAMP, *FRAME, *IDLE, *CALL, *PARTIAL, *IS_OWN, *OWN_SEEN, *ANN_VAR;
/* slot offsets */
static Py_ssize_t F_BODY, F_FUNC, F_DONE, F_UP, F_AT, F_INDEX, F_SHAPE, F_LEAVES, F_RESULTS,
    F_TODO, F_NEXT, F_REMOTE, F_SENT, F_SCOPE, F_ANN, F_CTX;
static Py_ssize_t C_FN, C_ARGS, C_KWARGS, C_NAME, C_INLINE, C_VALUE, C_ANN;
static Py_ssize_t I_N, T_STOP;

static PyObject *S_STACK, *S_IDLE, *S_CALL_TYPE, *S_STOP, *S_CLOSING, *S_CHILD_ERROR,
    *S_ANN_NOW, *S_OWN, *S_STARTED, *S_FAILED, *S_CALL_ENDED, *S_ABANDON, *S_THROW, *S_SEND,
    *S_VALUE, *S_KEYNAME, *S_N;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static inline void
set_slot(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject **p = &SLOT(o, off);
    Py_XINCREF(v);
    Py_XSETREF(*p, v);
}

/* The message of a class whose layout the compiled engine cannot use. */
#define LAYOUT_HINT "(the compiled engine reads and writes it: dask_coro/core/_cengine.c)"

/* A slot's offset, from its member descriptor on ``type`` (a type): one
 * of its own ``__slots__`` or of a base's. */
static int
offset_of(PyObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%R has no slot %s " LAYOUT_HINT, type, name);
        return -1;
    }
    if (Py_TYPE(d) != &PyMemberDescr_Type ||
        !PyType_IsSubtype((PyTypeObject *)type, ((PyMemberDescrObject *)d)->d_common.d_type)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a slot of the class " LAYOUT_HINT, type, name);
        Py_DECREF(d);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a writable object slot " LAYOUT_HINT, type,
                     name);
        Py_DECREF(d);
        return -1;
    }
    *out = m->offset;
    Py_DECREF(d);
    return 0;
}

/* The layout of ``type`` is exactly what the loop reads and writes: the
 * object slots (``__slots__``) of the classes of its MRO from ``type`` up
 * to ``top`` (NULL: all but object) are ``names``, each once; no
 * ``__dict__``, and no ``__weakref__`` unless ``weakrefs``. A slot added to
 * the Python class, or one removed, fails here, loudly. */
static int
check_layout(PyTypeObject *type, PyTypeObject *top, const char *const *names, size_t n,
             int weakrefs)
{
    if (type->tp_dictoffset) {
        PyErr_Format(PyExc_TypeError, "%R has a __dict__: the compiled engine takes only a class "
                     "with __slots__ " LAYOUT_HINT, type);
        return -1;
    }
    if (!weakrefs && type->tp_weaklistoffset) {
        PyErr_Format(PyExc_TypeError, "%R has a __weakref__ slot " LAYOUT_HINT, type);
        return -1;
    }
    size_t seen = 0;
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *b = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (b == &PyBaseObject_Type)
            break;
        if (!(b->tp_flags & Py_TPFLAGS_HEAPTYPE) || b->tp_dict == NULL) {
            PyErr_Format(PyExc_TypeError, "%R derives from %R, not a class defined in Python "
                         LAYOUT_HINT, type, b);
            return -1;
        }
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(b->tp_dict, &pos, &key, &value)) {
            if (Py_TYPE(value) != &PyMemberDescr_Type ||
                ((PyMemberDescrObject *)value)->d_common.d_type != b)
                continue;
            const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
            if (name == NULL) {
                PyErr_Clear();
                name = "";
            }
            size_t k = 0;
            while (k < n && strcmp(names[k], name) != 0)
                k++;
            if (k == n) {
                PyErr_Format(PyExc_TypeError, "%R has a slot %R that the compiled engine does "
                             "not know " LAYOUT_HINT, b, key);
                return -1;
            }
            seen++;
        }
        if (b == top)
            break;
    }
    if (seen != n) {
        PyErr_Format(PyExc_TypeError, seen > n ? "%R defines a slot of its base again " LAYOUT_HINT
                                               : "%R has its slots on other classes " LAYOUT_HINT,
                     type);
        return -1;
    }
    return 0;
}

/* -- small helpers --------------------------------------------------------- */

/* The pending exception, normalized, with its traceback on it (what
 * ``except BaseException as e`` binds). */
static PyObject *
fetch_error(void)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(v, tb);
        Py_DECREF(tb);
    }
    Py_XDECREF(t);
    return v;
}

static int
truthy_attr(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* A slot holding an int, or -2 (no error set) where it holds none, or one
 * a Py_ssize_t does not hold: the pure loop decides. */
static Py_ssize_t
int_slot(PyObject *o, Py_ssize_t off)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL || !PyLong_CheckExact(v))
        return -2;
    Py_ssize_t r = PyLong_AsSsize_t(v);
    if (r == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* OverflowError */
        return -2;
    }
    return r;
}

/* 0 .. NSMALL-1 as int objects, made once: a frame's positions and yield
 * counts are written per call */
#define NSMALL 1024
static PyObject *SMALL[NSMALL];

static int
set_int_slot(PyObject *o, Py_ssize_t off, Py_ssize_t v)
{
    PyObject *n = v >= 0 && v < NSMALL ? Py_NewRef(SMALL[v]) : PyLong_FromSsize_t(v);
    if (n == NULL)
        return -1;
    Py_XSETREF(SLOT(o, off), n);
    return 0;
}

/* The annotations in effect: ``tramp.annotations_now()``, read straight from
 * its ContextVar when it is one's ``get``. 1: none, or the run's own. */
typedef struct {
    PyObject *var;  /* borrowed: a ContextVar, or NULL (call ``now``) */
    PyObject *now;  /* borrowed */
    PyObject *own;  /* borrowed */
} Ann;

static int
ann_plain(Ann *a)
{
    PyObject *v;
    if (a->var != NULL) {
        if (PyContextVar_Get(a->var, NULL, &v) < 0)
            return -1;
        if (v == NULL)
            return 1;
    } else {
        v = PyObject_CallNoArgs(a->now);
        if (v == NULL)
            return -1;
    }
    if (v == a->own) {
        Py_DECREF(v);
        return 1;
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t < 0 ? -1 : !t;
}

/* Whether every item of ``y`` (a list or tuple) is a call that runs inline
 * or ran: the common yield. */
static int
all_calls(PyObject *y, PyTypeObject *call_type)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(y);
    PyObject **items = PySequence_Fast_ITEMS(y);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = items[i];
        if (Py_TYPE(x) != call_type)
            return 0;
        PyObject *f = SLOT(x, C_INLINE), *v = SLOT(x, C_VALUE);
        if (f == NULL || v == NULL)
            return 0;
        if (f == Py_None && v == NOT_DONE)
            return 0;
    }
    return 1;
}

/* [PENDING] * n, and the positions to run (engine._RANGES) */
static int
set_yield(PyObject *frame, PyObject *y, Py_ssize_t index)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(y);
    PyObject *results = PyList_New(n);
    if (results == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(results, i, Py_NewRef(PENDING));
    PyObject *todo;
    if (n < PyList_GET_SIZE(RANGES)) {
        todo = Py_NewRef(PyList_GET_ITEM(RANGES, n));
    } else {
        todo = PyTuple_New(n);
        if (todo == NULL) {
            Py_DECREF(results);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k = PyLong_FromSsize_t(i);
            if (k == NULL) {
                Py_DECREF(results);
                Py_DECREF(todo);
                return -1;
            }
            PyTuple_SET_ITEM(todo, i, k);
        }
    }
    if (set_int_slot(frame, F_INDEX, index) < 0 || set_int_slot(frame, F_NEXT, 0) < 0) {
        Py_DECREF(results);
        Py_DECREF(todo);
        return -1;
    }
    set_slot(frame, F_SHAPE, (PyObject *)Py_TYPE(y));
    set_slot(frame, F_LEAVES, y);
    Py_XSETREF(SLOT(frame, F_RESULTS), results);
    Py_XSETREF(SLOT(frame, F_TODO), todo);
    return 0;
}

/* call ``leaf`` computed ``value`` (engine: leaf.__dask_coro_value__ = value;
 * leaf.__dask_coro_inline__ = None), and results[pos] = value */
static int
deliver(PyObject *frame, PyObject *leaf, Py_ssize_t pos, PyObject *value)
{
    PyObject *results = SLOT(frame, F_RESULTS);
    if (results == NULL) {
        PyErr_SetString(PyExc_AttributeError, "results");
        return -1;
    }
    if (PyList_CheckExact(results) && pos < PyList_GET_SIZE(results)) {
        Py_INCREF(value);
        PyList_SetItem(results, pos, value);
    } else {
        PyObject *k = PyLong_FromSsize_t(pos);
        if (k == NULL)
            return -1;
        Py_INCREF(results);
        int rc = PyObject_SetItem(results, k, value);
        Py_DECREF(results);
        Py_DECREF(k);
        if (rc < 0)
            return -1;
    }
    if (Py_TYPE(leaf) == (PyTypeObject *)CALL) {
        set_slot(leaf, C_VALUE, value);
        set_slot(leaf, C_INLINE, Py_None);
        return 0;
    }
    if (PyObject_SetAttrString(leaf, "__dask_coro_value__", value) < 0)
        return -1;
    return PyObject_SetAttrString(leaf, "__dask_coro_inline__", Py_None);
}

static inline PyObject *
stack_top(PyObject *stack)
{
    Py_ssize_t n = PyList_GET_SIZE(stack);
    return n ? PyList_GET_ITEM(stack, n - 1) : NULL;
}

/* -- steps ----------------------------------------------------------------- */

/* ``tramp.stop``, read before every call: a slot of Trampoline (a plain
 * attribute store from any thread lands there). 1: set, 0: not, -1: error. */
static inline int
stop_set(PyObject *tramp)
{
    PyObject *v = Py_TYPE(tramp) == (PyTypeObject *)TRAMP ? SLOT(tramp, T_STOP) : NULL;
    if (v == Py_False)
        return 0;
    if (v == Py_True)
        return 1;
    if (v == NULL)
        return truthy_attr(tramp, S_STOP);
    Py_INCREF(v);
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* Frames whose body returned and that nobody else holds, for the next
 * push (a Frame made and freed per body that yields costs more than the
 * rest of its bookkeeping). Each steps() has its own: nothing is shared. */
#define NSPARE 16
typedef struct {
    PyObject *f[NSPARE];
    int n;
} Spare;

static void
spare_put(Spare *sp, PyObject *frame)
{
    /* ``frame`` is ours alone: drop what it holds, keep the object */
    if (sp->n == NSPARE || Py_REFCNT(frame) != 1) {
        Py_DECREF(frame);
        return;
    }
    Py_ssize_t offs[] = {F_BODY, F_FUNC, F_UP, F_SHAPE, F_LEAVES, F_RESULTS, F_TODO,
                         F_REMOTE, F_SCOPE, F_ANN, F_CTX};
    for (size_t k = 0; k < sizeof(offs) / sizeof(offs[0]); k++)
        Py_CLEAR(SLOT(frame, offs[k]));
    sp->f[sp->n++] = frame;
}

static PyObject *
spare_get(Spare *sp)
{
    if (sp->n)
        return sp->f[--sp->n];
    return ((PyTypeObject *)FRAME)->tp_alloc((PyTypeObject *)FRAME, 0);
}

static void
spare_free(Spare *sp)
{
    while (sp->n)
        Py_DECREF(sp->f[--sp->n]);
}

/* -- the context a call steps in (engine._Scratch) ------------------------ */

/* A call, and a body but the root's, steps in a copy of its parent's
 * context (a frame's ``ctx``: None for the run's own), so that what it sets
 * in a ContextVar reaches neither its parent nor its siblings. One copy
 * serves every step that changes nothing in it: it stays entered across
 * them, and a step that changed it hands it to the body stepped (its own
 * context from then on). Whether a step changed it: whether the context's
 * variables are another mapping (contexts share an immutable mapping, and a
 * set makes a new one), read at the layout CPython 3.7 to 3.13 give a
 * Context (checked once by ``setup``); else comparing it with the base,
 * which costs more. */
typedef struct {
    PyObject_HEAD
    PyObject *prev;
    PyObject *vars;
} ContextHead;

static int PEEK_VARS = 0; /* ContextHead is the layout of this Python's Context */

typedef struct {
    PyObject *ctx;  /* entered, or NULL */
    PyObject *of;   /* the base it copies: Py_None or a Context */
    PyObject *ref;  /* the base's variables: ``of``, or a copy of the run's context */
    PyObject *vars; /* ctx's variables when made (held: compared by address) */
} Scratch;

/* Leave the copy (an error pending is kept). */
static int
scratch_leave(Scratch *sc)
{
    if (sc->ctx == NULL)
        return 0;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    int r = PyContext_Exit(sc->ctx);
    Py_CLEAR(sc->ctx);
    Py_CLEAR(sc->of);
    Py_CLEAR(sc->ref);
    Py_CLEAR(sc->vars);
    if (t != NULL) {
        if (r < 0)
            PyErr_WriteUnraisable(NULL);
        PyErr_Restore(t, v, tb);
    }
    return t != NULL ? 0 : r;
}

static int scratch_new(Scratch *sc, PyObject *base);

/* Enter a copy of ``base`` (Py_None: of the context entered now, the
 * run's), unless the one entered is one and unchanged. */
static inline int
scratch_enter(Scratch *sc, PyObject *base)
{
    if (sc->ctx != NULL && sc->of == base)
        return 0;
    return scratch_new(sc, base);
}

static int
scratch_new(Scratch *sc, PyObject *base)
{
    Py_INCREF(base); /* held: leaving the copy frees what may run Python code */
    if (scratch_leave(sc) < 0) {
        Py_DECREF(base);
        return -1;
    }
    PyObject *ref = base == Py_None ? PyContext_CopyCurrent() : Py_NewRef(base);
    if (ref == NULL) {
        Py_DECREF(base);
        return -1;
    }
    if (!PyContext_CheckExact(ref)) {
        PyErr_Format(PyExc_TypeError, "Frame.ctx must be a Context or None, not %R", ref);
        Py_DECREF(ref);
        Py_DECREF(base);
        return -1;
    }
    PyObject *ctx = PyContext_Copy(ref);
    if (ctx == NULL || PyContext_Enter(ctx) < 0) {
        Py_XDECREF(ctx);
        Py_DECREF(ref);
        Py_DECREF(base);
        return -1;
    }
    sc->ctx = ctx;
    sc->of = base;
    sc->ref = ref;
    sc->vars = PEEK_VARS ? Py_XNewRef(((ContextHead *)ctx)->vars) : NULL;
    return 0;
}

static PyObject *scratch_changed(Scratch *sc);

/* How a body steps (engine._Scratch.step_in): the root in the run's own
 * context, a body that changed a variable once in its own (entered itself:
 * what it sets before a yield it resets after it), any other in the copy. */
enum { IN_RUN, IN_OWN, IN_COPY };

static int
step_enter(Scratch *sc, int how, PyObject *ctx)
{
    if (how == IN_COPY)
        return scratch_enter(sc, ctx);
    if (scratch_leave(sc) < 0)
        return -1;
    if (how == IN_RUN)
        return 0;
    if (!PyContext_CheckExact(ctx)) {
        PyErr_Format(PyExc_TypeError, "Frame.ctx must be a Context or None, not %R", ctx);
        return -1;
    }
    return PyContext_Enter(ctx);
}

/* Leave a body's own context after its step (an error pending is kept). */
static int
own_leave(PyObject *ctx)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    int r = PyContext_Exit(ctx);
    if (t != NULL) {
        if (r < 0)
            PyErr_WriteUnraisable(NULL);
        PyErr_Restore(t, v, tb);
        return 0;
    }
    return r;
}

/* After a step in the copy: NULL (no error set) if it changed nothing;
 * else the copy (a new reference), left, the stepped body's own now. NULL
 * with an error set on failure. */
static inline PyObject *
scratch_took(Scratch *sc)
{
    if (sc->ctx == NULL || (PEEK_VARS && ((ContextHead *)sc->ctx)->vars == sc->vars))
        return NULL;
    return scratch_changed(sc);
}

static PyObject *
scratch_changed(Scratch *sc)
{
    if (!PEEK_VARS) {
        int eq = PyObject_RichCompareBool(sc->ctx, sc->ref, Py_EQ);
        if (eq < 0)
            return NULL;
        if (eq)
            return NULL;
    }
    PyObject *took = Py_NewRef(sc->ctx);
    if (scratch_leave(sc) < 0) {
        Py_DECREF(took);
        return NULL;
    }
    return took;
}

/* Whether ContextHead is how this Python lays a Context out: two copies
 * share one mapping, a set in one gives it another. */
static int
check_context_layout(void)
{
    PyObject *a = PyContext_New(), *b = NULL, *var = NULL, *tok = NULL;
    int ok = 0;
    if (a == NULL)
        goto done;
    b = PyContext_Copy(a);
    var = PyContextVar_New("dask_coro.layout", NULL);
    if (b == NULL || var == NULL)
        goto done;
    PyObject *va = ((ContextHead *)a)->vars, *vb = ((ContextHead *)b)->vars;
    if (va == NULL || va != vb || strcmp(Py_TYPE(va)->tp_name, "hamt") != 0)
        goto done;
    if (PyContext_Enter(a) < 0)
        goto done;
    tok = PyContextVar_Set(var, Py_True);
    ok = tok != NULL && ((ContextHead *)a)->vars != va && ((ContextHead *)b)->vars == va &&
         strcmp(Py_TYPE(((ContextHead *)a)->vars)->tp_name, "hamt") == 0;
    if (PyContext_Exit(a) < 0)
        ok = 0;
done:
    Py_XDECREF(tok);
    Py_XDECREF(var);
    Py_XDECREF(b);
    Py_XDECREF(a);
    PyErr_Clear();
    return ok;
}

enum { SLOW = 0, BREAK = 1, DONE = 2 };
enum { RETURNED = 1, RAISED = 2 }; /* engine._RETURNED, engine._RAISED */

typedef struct {
    int code;
    PyObject *top;  /* owned */
    Py_ssize_t countdown;
    int barren;
    PyObject *method, *arg, *out; /* owned, or NULL for None */
    int ended;
    Py_ssize_t fresh;
    PyObject *body, *func; /* owned, or NULL */
    PyObject *fctx;        /* owned, or NULL: with fresh, the call's context */
} Exit;

/* What steps() returns where it stopped having done something: a named
 * result (``_cengine.Exit``, a struct sequence made once), the pure loop's
 * locals by name. */
static PyStructSequence_Field EXIT_FIELDS[] = {
    {"code", "SLOW (go on from here), BREAK (step a body) or DONE (the root returned)"},
    {"top", "the top frame"},
    {"countdown", "calls left before cancelled() is asked"},
    {"barren", "a look found nothing to hand out, no yield of calls since"},
    {"method", "with BREAK: the step to take (a body's send or throw), or STEPPED"},
    {"arg", "what to send or throw"},
    {"out", "with STEPPED: what the step came to; with DONE: the root's value"},
    {"ended", "with STEPPED: 0 (it yielded out), RETURNED or RAISED"},
    {"fresh", "the position of the call whose body is stepped with no frame yet, or -1"},
    {"body", "with fresh: that body"},
    {"func", "with fresh: that call's function"},
    {"ctx", "with fresh: that call's context (Frame.ctx)"},
    {NULL, NULL},
};
static PyStructSequence_Desc EXIT_DESC = {
    "dask_coro.core._cengine.Exit", "Where steps() stopped, and what the pure loop goes on with.",
    EXIT_FIELDS, 12,
};
static PyTypeObject *EXIT_TYPE;

static void exit_clear(Exit *e);

static PyObject *
exit_result(Exit *e)
{
    PyObject *r = PyStructSequence_New(EXIT_TYPE);
    if (r == NULL) {
        exit_clear(e);
        return NULL;
    }
#define OR_NONE(x) ((x) != NULL ? (x) : Py_NewRef(Py_None))
    PyObject *v[12] = {PyLong_FromLong(e->code), e->top, PyLong_FromSsize_t(e->countdown),
                       PyBool_FromLong(e->barren), OR_NONE(e->method), OR_NONE(e->arg),
                       OR_NONE(e->out), PyLong_FromLong(e->ended), PyLong_FromSsize_t(e->fresh),
                       OR_NONE(e->body), OR_NONE(e->func), OR_NONE(e->fctx)};
#undef OR_NONE
    e->top = e->method = e->arg = e->out = e->body = e->func = e->fctx = NULL;
    int bad = 0;
    for (int k = 0; k < 12; k++) {
        if (v[k] == NULL)
            bad = 1;
        PyStructSequence_SET_ITEM(r, k, v[k] != NULL ? v[k] : Py_NewRef(Py_None));
    }
    if (bad) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static void
exit_clear(Exit *e)
{
    Py_CLEAR(e->top);
    Py_CLEAR(e->method);
    Py_CLEAR(e->arg);
    Py_CLEAR(e->out);
    Py_CLEAR(e->body);
    Py_CLEAR(e->func);
    Py_CLEAR(e->fctx);
}

/* A body yielded ``*y``, which the pure loop sets up: BREAK with the step
 * taken (``_STEPPED``) and what it yielded, a Request's value unwrapped.
 * Takes ``*y``. */
static int
stepped(Exit *e, PyObject **y)
{
    e->code = BREAK;
    e->method = Py_NewRef(STEPPED);
    if (Py_TYPE(*y) == (PyTypeObject *)REQUEST) {
        e->out = PyObject_GetAttr(*y, S_VALUE);
        Py_CLEAR(*y);
        return e->out == NULL ? -1 : 0;
    }
    e->out = *y;
    *y = NULL;
    return 0;
}

/* ``body.<name>`` as the step to take next */
static int
bound(Exit *e, PyObject *body, PyObject *name)
{
    e->method = PyObject_GetAttr(body, name);
    return e->method == NULL ? -1 : 0;
}

/* What ``except BaseException as e`` binds, unless ``tramp._closing``
 * (unwinding a parked body, Trampoline.close: then the error propagates and
 * this returns NULL with it set). */
static PyObject *
caught(PyObject *tramp)
{
    PyObject *err = fetch_error();
    if (err == NULL)
        return NULL;
    int c = truthy_attr(tramp, S_CLOSING);
    if (c < 0) {
        Py_DECREF(err);
        return NULL;
    }
    if (c) {
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(err)), err, PyException_GetTraceback(err));
        return NULL;
    }
    return err;
}

/* A body raised (the error pending): BREAK with what it raised, as the pure
 * loop's ``except BaseException``; -1 with the error still set when the
 * trampoline is closing. */
static int
raised(Exit *e, PyObject *tramp)
{
    e->out = caught(tramp);
    if (e->out == NULL)
        return -1;
    e->code = BREAK;
    e->method = Py_NewRef(STEPPED);
    e->ended = RAISED;
    return 0;
}

/* run[1] += *add (the calls counted in C since the last time) */
static int
run_flush(PyObject *run, Py_ssize_t *add)
{
    if (run == NULL || !*add)
        return 0;
    if (PyList_GET_SIZE(run) != 2) {
        PyErr_SetString(PyExc_RuntimeError, "run changed size under a step");
        return -1;
    }
    Py_ssize_t k = PyLong_AsSsize_t(PyList_GET_ITEM(run, 1));
    if (k == -1 && PyErr_Occurred())
        return -1;
    PyObject *nk = PyLong_FromSsize_t(k + *add);
    if (nk == NULL)
        return -1;
    PyList_SetItem(run, 1, nk);
    *add = 0;
    return 0;
}

static PyObject *
steps(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!READY) {
        PyErr_SetString(PyExc_RuntimeError, "_cengine.setup() was not called");
        return NULL;
    }
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "steps(tramp, top, run, countdown, barren, stack, idle, "
                                         "call_type, annotations_now, own_annotations)");
        return NULL;
    }
    /* The trampoline's own attributes come as arguments: the pure loop holds
     * them in locals already, and this is called once per iteration the
     * pure loop runs itself. */
    PyObject *tramp = args[0], *run = args[2], *stack = args[5], *idle = args[6],
             *call_type = args[7], *ann_now = args[8], *own = args[9];
    if (Py_TYPE(args[1]) != (PyTypeObject *)FRAME) {
        PyErr_Format(PyExc_TypeError, "steps(): top must be a %R, not %R", FRAME, Py_TYPE(args[1]));
        return NULL;
    }
    if (!PyLong_CheckExact(args[3])) {
        PyErr_Format(PyExc_TypeError, "steps(): countdown must be an int, not %R", Py_TYPE(args[3]));
        return NULL;
    }
    if (run == Py_None)
        run = NULL;
    else if (!PyList_CheckExact(run) || PyList_GET_SIZE(run) != 2) {
        PyErr_SetString(PyExc_TypeError, "steps(): run must be None or [func, n]");
        return NULL;
    }
    if (!PyList_CheckExact(stack)) {
        PyErr_SetString(PyExc_TypeError, "steps(): stack must be a list");
        return NULL;
    }
    if (call_type != CALL) {
        PyErr_Format(PyExc_TypeError, "steps() runs calls of %R only, not %R", CALL, call_type);
        return NULL;
    }
    Exit e = {SLOW, NULL, 0, 0, NULL, NULL, NULL, 0, -1, NULL, NULL, NULL};
    e.countdown = PyLong_AsSsize_t(args[3]);
    if (e.countdown == -1 && PyErr_Occurred())
        return NULL;
    e.barren = PyObject_IsTrue(args[4]);
    if (e.barren < 0)
        return NULL;
    e.top = Py_NewRef(args[1]);
    Py_ssize_t iters = 0; /* iterations begun */
    PyObject *y = NULL, *out = NULL, *leaf = NULL, *func = NULL, *cargs = NULL;
    PyObject *fctx = NULL; /* the context of the call made last (owned), as Exit.fctx */
    Scratch sc = {NULL, NULL, NULL, NULL};
    Spare spare = {{NULL}, 0};
    Py_ssize_t run_add = 0; /* calls of run[0] started, not yet added to run[1] */
    PyTypeObject *ctype = (PyTypeObject *)call_type;
    Ann ann = {NULL, ann_now, own};
    if (PyCFunction_Check(ann_now)) {
        PyObject *self = PyCFunction_GET_SELF(ann_now);
        if (self != NULL && PyContextVar_CheckExact(self) &&
            strcmp(((PyCFunctionObject *)ann_now)->m_ml->ml_name, "get") == 0)
            ann.var = self;
    }
    int idle_slot = Py_TYPE(idle) == (PyTypeObject *)IDLE;

    for (;;) {
        iters++;
        PyObject *top = e.top;
        PyObject *todo = SLOT(top, F_TODO), *leaves = SLOT(top, F_LEAVES);
        Py_ssize_t i = int_slot(top, F_NEXT);
        if (todo == NULL || leaves == NULL || i < 0 ||
            !(PyTuple_CheckExact(todo) || PyList_CheckExact(todo)))
            goto slow; /* not set up as the loop sets a yield up */
        Py_ssize_t end = PySequence_Fast_GET_SIZE(todo);
        if (i >= end) {
            /* -- top's yield is done: resume it -------------------------- */
            PyObject *remote = SLOT(top, F_REMOTE);
            if (remote == NULL)
                goto slow;
            /* held while its __bool__ runs; this and stop_set may run Python
             * code: the other slots are read after them */
            Py_INCREF(remote);
            int r = PyObject_IsTrue(remote);
            Py_DECREF(remote);
            if (r != 0)
                goto slow_or_error;
            r = stop_set(tramp);
            if (r != 0)
                goto slow_or_error;
            PyObject *shape = SLOT(top, F_SHAPE), *scope = SLOT(top, F_SCOPE),
                     *body = SLOT(top, F_BODY);
            if (shape == NULL || scope == NULL || body == NULL ||
                (shape != (PyObject *)&PyList_Type && shape != (PyObject *)&PyTuple_Type) ||
                scope != Py_None || !PyGen_CheckExact(body))
                goto slow;
            PyObject *results = SLOT(top, F_RESULTS);
            if (results == NULL || !PyList_CheckExact(results))
                goto slow;
            PyObject *value = shape == (PyObject *)&PyList_Type ? Py_NewRef(results)
                                                                : PyList_AsTuple(results);
            if (value == NULL)
                goto error;
            PyObject *up = SLOT(top, F_UP), *tctx = SLOT(top, F_CTX);
            if (up == NULL || tctx == NULL) {
                Py_DECREF(value);
                goto slow;
            }
            int how = IN_RUN;
            if (up != Py_None) {
                PyObject *uctx = Py_TYPE(up) == (PyTypeObject *)FRAME ? SLOT(up, F_CTX) : NULL;
                if (uctx == NULL) {
                    Py_DECREF(value);
                    goto slow;
                }
                how = tctx == uctx ? IN_COPY : IN_OWN;
            }
            /* held before the stores: what they free may run Python code */
            Py_INCREF(body);
            Py_INCREF(tctx);
            if (step_enter(&sc, how, tctx) < 0) {
                Py_DECREF(value);
                Py_DECREF(body);
                Py_DECREF(tctx);
                goto error;
            }
            set_slot(top, F_LEAVES, EMPTY);
            set_slot(top, F_RESULTS, EMPTY);
            set_slot(top, F_ANN, Py_None);
            PySendResult rc = PyIter_Send(body, value, &y);
            Py_DECREF(value);
            Py_DECREF(body);
            /* the annotations it set at its yield, read in its context */
            PyTypeObject *yt = rc == PYGEN_NEXT ? Py_TYPE(y) : NULL;
            r = 0;
            if (yt == &PyList_Type || yt == &PyTuple_Type)
                r = ann_plain(&ann);
            if (how == IN_OWN) {
                if (own_leave(tctx) < 0)
                    r = -1;
            } else if (how == IN_COPY && rc != PYGEN_ERROR && r >= 0) {
                /* what it set goes with it if it returned, else it is its own */
                PyObject *took = scratch_took(&sc);
                if (took == NULL && PyErr_Occurred()) {
                    r = -1;
                } else if (took != NULL) {
                    if (rc == PYGEN_NEXT)
                        set_slot(top, F_CTX, took);
                    Py_DECREF(took);
                }
            }
            Py_DECREF(tctx);
            if (r < 0)
                goto error;
            if (rc == PYGEN_RETURN) {
                /* the body returned y: its frame goes, its call has the value */
                Py_ssize_t n = PyList_GET_SIZE(stack);
                if (!n || PyList_GET_ITEM(stack, n - 1) != top) {
                    PyErr_SetString(PyExc_RuntimeError, "the stack changed under a step");
                    goto error;
                }
                /* stack.pop(): its last item is ``top``, which e.top holds */
                Py_SET_SIZE(stack, n - 1);
                Py_DECREF(top);
                set_slot(top, F_DONE, Py_True);
                set_slot(top, F_BODY, Py_None);
                if (n == 1) {
                    e.code = DONE;
                    e.out = y;
                    y = NULL;
                    goto leave;
                }
                Py_ssize_t at = int_slot(top, F_AT);
                if (at < 0) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_TypeError, "Frame.at is not an int");
                    goto error;
                }
                PyObject *below = PyList_GET_ITEM(stack, n - 2);
                if (Py_TYPE(below) != (PyTypeObject *)FRAME) {
                    PyErr_Format(PyExc_TypeError, "the stack holds %R, not a Frame", below);
                    goto error;
                }
                PyObject *done_frame = e.top;
                e.top = Py_NewRef(below);
                spare_put(&spare, done_frame);
                PyObject *up_leaves = SLOT(e.top, F_LEAVES);
                if (up_leaves == NULL) {
                    PyErr_SetString(PyExc_AttributeError, "leaves");
                    goto error;
                }
                if ((PyList_CheckExact(up_leaves) || PyTuple_CheckExact(up_leaves)) &&
                    at < PySequence_Fast_GET_SIZE(up_leaves)) {
                    leaf = Py_NewRef(PySequence_Fast_GET_ITEM(up_leaves, at));
                } else {
                    Py_INCREF(up_leaves); /* held while its __getitem__ runs */
                    leaf = PySequence_GetItem(up_leaves, at);
                    Py_DECREF(up_leaves);
                }
                if (leaf == NULL || deliver(e.top, leaf, at, y) < 0)
                    goto error;
                Py_CLEAR(leaf);
                Py_CLEAR(y);
                continue;
            }
            if (rc == PYGEN_ERROR) {
                if (raised(&e, tramp) < 0)
                    goto error;
                goto leave;
            }
            /* it yielded y */
            if (yt == &PyList_Type || yt == &PyTuple_Type) {
                Py_ssize_t index = int_slot(top, F_INDEX);
                /* else (not an int, or one a Py_ssize_t does not hold) the
                 * pure loop sets the yield up */
                if (r && index >= -1 && index < PY_SSIZE_T_MAX && all_calls(y, ctype)) {
                    if (set_yield(top, y, index + 1) < 0)
                        goto error;
                    Py_CLEAR(y);
                    continue;
                }
            }
            if (stepped(&e, &y) < 0)
                goto error;
            goto leave;
        }
        /* -- the next inline leaf ------------------------------------------ */
        if (!i && end > 1)
            e.barren = 0;
        if (!e.barren) {
            Py_ssize_t n;
            PyObject *nobj = idle_slot ? SLOT(idle, I_N) : NULL;
            if (nobj != NULL && PyLong_CheckExact(nobj)) {
                n = PyLong_AsSsize_t(nobj);
            } else {
                nobj = PyObject_GetAttr(idle, S_N);
                if (nobj == NULL)
                    goto error;
                int gt = PyObject_RichCompareBool(nobj, ZERO, Py_GT);
                Py_DECREF(nobj);
                if (gt < 0)
                    goto error;
                n = gt;
                /* Python code ran (idle.n): top's yield, read again */
                todo = SLOT(top, F_TODO);
                leaves = SLOT(top, F_LEAVES);
                if (todo == NULL || leaves == NULL ||
                    !(PyTuple_CheckExact(todo) || PyList_CheckExact(todo)) ||
                    i >= PySequence_Fast_GET_SIZE(todo))
                    goto slow;
            }
            if (n > 0)
                goto slow; /* hand calls out: Stealing._steal */
        }
        PyObject *posobj = PySequence_Fast_GET_ITEM(todo, i);
        if (!PyLong_CheckExact(posobj))
            goto slow;
        Py_ssize_t pos = PyLong_AsSsize_t(posobj);
        if (pos == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* OverflowError: the pure loop raises what it raises */
            goto slow;
        }
        if (!(PyList_CheckExact(leaves) || PyTuple_CheckExact(leaves)) ||
            pos >= PySequence_Fast_GET_SIZE(leaves) || pos < 0)
            goto slow;
        PyObject *lf = PySequence_Fast_GET_ITEM(leaves, pos);
        if (Py_TYPE(lf) != ctype)
            goto slow; /* computed in place, a feature's own step, ... */
        PyObject *fn = SLOT(lf, C_INLINE);
        if (fn == NULL)
            goto slow;
        if (fn == Py_None) {
            PyObject *done = SLOT(lf, C_VALUE);
            if (done == NULL || done == NOT_DONE || Py_TYPE(done) == (PyTypeObject *)FAILED)
                goto slow;
            PyObject *results = SLOT(top, F_RESULTS);
            if (results == NULL || !PyList_CheckExact(results) ||
                pos >= PyList_GET_SIZE(results))
                goto slow;
            if (set_int_slot(top, F_NEXT, i + 1) < 0)
                goto error;
            Py_INCREF(done);
            PyList_SetItem(results, pos, done);
            continue;
        }
        /* From here on Python code may run (a stop's __bool__, _started, the
         * call): what the call needs is held, not borrowed. */
        leaf = Py_NewRef(lf);
        func = Py_NewRef(fn);
        {
            int r = stop_set(tramp);
            if (r != 0)
                goto slow_or_error;
        }
        if (e.countdown <= 1)
            goto slow; /* the pure loop counts and asks ``cancelled`` */
        cargs = SLOT(leaf, C_ARGS);
        if (cargs == NULL || !PyTuple_CheckExact(cargs)) {
            cargs = NULL;
            goto slow;
        }
        Py_INCREF(cargs);
        e.countdown--;
        if (set_int_slot(top, F_NEXT, i + 1) < 0)
            goto error;
        if (run != NULL) {
            if (PyList_GET_SIZE(run) != 2) {
                PyErr_SetString(PyExc_RuntimeError, "run changed size under a step");
                goto error;
            }
            if (PyList_GET_ITEM(run, 0) == func) {
                run_add++;
            } else {
                if (run_flush(run, &run_add) < 0)
                    goto error;
                PyObject *rf = Py_NewRef(PyList_GET_ITEM(run, 0)),
                         *rn = Py_NewRef(PyList_GET_ITEM(run, 1)), *r = NULL;
                int started = PyObject_IsTrue(rn);
                if (started > 0)
                    r = PyObject_CallMethodObjArgs(tramp, S_STARTED, rf, rn, NULL);
                Py_DECREF(rf);
                Py_DECREF(rn);
                if (started < 0 || (started && r == NULL))
                    goto error;
                Py_XDECREF(r);
                if (PyList_GET_SIZE(run) != 2) {
                    PyErr_SetString(PyExc_RuntimeError, "run changed size under a step");
                    goto error;
                }
                if (PyList_SetItem(run, 0, Py_NewRef(func)) < 0 ||
                    PyList_SetItem(run, 1, Py_NewRef(SMALL[1])) < 0)
                    goto error;
            }
        }
        /* in a context of its own: a copy of top's (held: the call runs
         * Python code) */
        PyObject *tctx = SLOT(top, F_CTX);
        if (tctx == NULL) {
            PyErr_SetString(PyExc_AttributeError, "ctx");
            goto error;
        }
        Py_INCREF(tctx);
        if (scratch_enter(&sc, tctx) < 0) {
            Py_DECREF(tctx);
            goto error;
        }
        out = PyObject_Vectorcall(func, &PyTuple_GET_ITEM(cargs, 0), PyTuple_GET_SIZE(cargs),
                                  NULL);
        Py_CLEAR(cargs);
        if (out != NULL && PyGen_CheckExact(out) && stack_top(stack) == top) {
            /* its body's first step runs here, in the same copy: the call's
             * context is its parent's unless the two changed it (below) */
            Py_XSETREF(fctx, tctx);
        } else if (out != NULL) {
            PyObject *took = scratch_took(&sc);
            if (took == NULL && PyErr_Occurred()) {
                Py_DECREF(tctx);
                goto error;
            }
            if (took != NULL) {
                Py_DECREF(tctx);
                Py_XSETREF(fctx, took);
            } else {
                Py_XSETREF(fctx, tctx);
            }
        } else {
            Py_DECREF(tctx);
        }
        if (out == NULL) {
            /* it raised: the error goes to its parent's yield */
            PyObject *err = caught(tramp);
            if (err == NULL)
                goto error;
            /* tramp.child_error, read only when a call raised */
            PyObject *child_error = PyObject_GetAttr(tramp, S_CHILD_ERROR);
            if (child_error == NULL) {
                Py_DECREF(err);
                goto error;
            }
            if (child_error != Py_None) {
                PyObject *e2 = PyObject_CallOneArg(child_error, err);
                Py_DECREF(err);
                err = e2;
            }
            Py_DECREF(child_error);
            if (err == NULL)
                goto error;
            PyObject *failed = PyObject_CallOneArg(FAILED, err);
            if (failed == NULL) {
                Py_DECREF(err);
                goto error;
            }
            set_slot(leaf, C_VALUE, failed);
            set_slot(leaf, C_INLINE, Py_None);
            Py_DECREF(failed);
            if (run != NULL) {
                PyObject *r2 = PyObject_CallMethodOneArg(tramp, S_FAILED, func);
                if (r2 == NULL) {
                    Py_DECREF(err);
                    goto error;
                }
                Py_DECREF(r2);
            }
            if (stack_top(stack) != top) {
                PyObject *r2 = PyObject_CallMethodNoArgs(tramp, S_CALL_ENDED);
                if (r2 == NULL) {
                    Py_DECREF(err);
                    goto error;
                }
                Py_DECREF(r2);
            }
            PyObject *r3 = PyObject_CallMethodOneArg(tramp, S_ABANDON, top);
            if (r3 == NULL) {
                Py_DECREF(err);
                goto error;
            }
            Py_DECREF(r3);
            PyObject *tb = SLOT(top, F_BODY);
            if (tb == NULL) {
                Py_DECREF(err);
                PyErr_SetString(PyExc_AttributeError, "body");
                goto error;
            }
            Py_INCREF(tb);
            int b = bound(&e, tb, S_THROW);
            Py_DECREF(tb);
            if (b < 0) {
                Py_DECREF(err);
                goto error;
            }
            e.code = BREAK;
            e.arg = err;
            goto leave_call;
        }
        if (PyGen_CheckExact(out) || PyCoro_CheckExact(out)) {
            PyObject *now = stack_top(stack);
            if (now != top) {
                /* It waited (dask_coro.result), then returned a body: run
                 * that in the frame it got. */
                if (now == NULL || Py_TYPE(now) != (PyTypeObject *)FRAME) {
                    PyErr_Format(PyExc_TypeError, "the stack holds %R, not a Frame",
                                 now ? now : Py_None);
                    goto error;
                }
                Py_SETREF(e.top, Py_NewRef(now));
                set_slot(now, F_BODY, out);
                if (bound(&e, out, S_SEND) < 0)
                    goto error;
                e.code = BREAK;
                goto leave_call;
            }
            if (PyCoro_CheckExact(out)) {
                e.code = BREAK;
                e.fresh = pos;
                e.body = Py_NewRef(out);
                if (bound(&e, out, S_SEND) < 0)
                    goto error;
                goto leave_call;
            }
            /* Its first step, here, in the copy the call ran in. */
            PySendResult rc = PyIter_Send(out, Py_None, &y);
            /* the annotations it set at its yield, read in its context */
            int plain_ann = 0;
            if (rc == PYGEN_NEXT && (Py_TYPE(y) == &PyList_Type || Py_TYPE(y) == &PyTuple_Type) &&
                stack_top(stack) == top) {
                plain_ann = ann_plain(&ann);
                if (plain_ann < 0) {
                    Py_CLEAR(y);
                    goto error;
                }
            }
            if (rc != PYGEN_ERROR) {
                PyObject *took = scratch_took(&sc);
                if (took == NULL && PyErr_Occurred()) {
                    Py_CLEAR(y);
                    goto error;
                }
                if (took != NULL) {
                    if (rc == PYGEN_NEXT) {
                        Py_SETREF(fctx, took); /* its frame's */
                    } else {
                        Py_DECREF(took);
                    }
                }
            }
            if (rc == PYGEN_RETURN) {
                if (stack_top(stack) != top) { /* it waited, then returned */
                    e.code = BREAK;
                    e.fresh = pos;
                    e.body = Py_NewRef(out);
                    e.method = Py_NewRef(STEPPED);
                    e.out = y;
                    y = NULL;
                    e.ended = RETURNED;
                    goto leave_call;
                }
                if (deliver(top, leaf, pos, y) < 0)
                    goto error;
                Py_CLEAR(y);
                Py_CLEAR(out);
                Py_CLEAR(leaf);
                Py_CLEAR(func);
                continue;
            }
            if (rc == PYGEN_ERROR) {
                if (raised(&e, tramp) < 0)
                    goto error;
                e.fresh = pos;
                e.body = Py_NewRef(out);
                goto leave_call;
            }
            PyTypeObject *yt = Py_TYPE(y);
            if ((yt == &PyList_Type || yt == &PyTuple_Type) && stack_top(stack) == top) {
                if (plain_ann && all_calls(y, ctype)) {
                    /* its frame, with this yield */
                    PyObject *new = spare_get(&spare);
                    if (new == NULL)
                        goto error;
                    set_slot(new, F_BODY, out);
                    set_slot(new, F_FUNC, func);
                    set_slot(new, F_DONE, Py_False);
                    set_slot(new, F_UP, top);
                    set_slot(new, F_SCOPE, Py_None);
                    set_slot(new, F_REMOTE, EMPTY);
                    set_slot(new, F_ANN, Py_None);
                    set_slot(new, F_CTX, fctx);
                    if (set_int_slot(new, F_AT, pos) < 0 || set_int_slot(new, F_SENT, 0) < 0 ||
                        set_yield(new, y, 0) < 0 || PyList_Append(stack, new) < 0) {
                        Py_DECREF(new);
                        goto error;
                    }
                    Py_SETREF(e.top, new);
                    Py_CLEAR(y);
                    Py_CLEAR(out);
                    Py_CLEAR(leaf);
                    Py_CLEAR(func);
                    continue;
                }
            }
            e.fresh = pos;
            e.body = Py_NewRef(out);
            if (stepped(&e, &y) < 0)
                goto error;
            goto leave_call;
        }
        /* a plain value */
        if (stack_top(stack) != top) {
            /* it waited in wait(), then returned: its frame goes */
            PyObject *r = PyObject_CallMethodNoArgs(tramp, S_CALL_ENDED);
            if (r == NULL)
                goto error;
            Py_DECREF(r);
        }
        if (deliver(top, leaf, pos, out) < 0)
            goto error;
        Py_CLEAR(out);
        Py_CLEAR(leaf);
        Py_CLEAR(func);
        continue;
    }

slow_or_error:
    if (PyErr_Occurred())
        goto error;
slow:
    e.code = SLOW;
    Py_CLEAR(cargs);
    Py_CLEAR(leaf);
    Py_CLEAR(func);
    if (iters == 1) {
        /* stopped in its first iteration, before it did anything of it: the
         * pure loop goes on as it was */
        Py_CLEAR(e.top);
        Py_CLEAR(fctx);
        if (scratch_leave(&sc) < 0)
            return NULL;
        return Py_NewRef(Py_None);
    }
    goto leave;
leave_call:
    e.func = func;
    func = NULL;
leave:
    if (run_flush(run, &run_add) < 0) {
        PyErr_WriteUnraisable(tramp);
    }
    if (scratch_leave(&sc) < 0)
        PyErr_WriteUnraisable(tramp);
    if (e.fresh >= 0 && e.fctx == NULL)
        e.fctx = Py_NewRef(fctx != NULL ? fctx : Py_None);
    Py_CLEAR(fctx);
    spare_free(&spare);
    Py_XDECREF(y);
    Py_XDECREF(out);
    Py_XDECREF(leaf);
    Py_XDECREF(func);
    return exit_result(&e);
error:
    {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        if (run_flush(run, &run_add) < 0)
            PyErr_WriteUnraisable(tramp);
        PyErr_Restore(t, v, tb);
    }
    scratch_leave(&sc);
    Py_CLEAR(fctx);
    spare_free(&spare);
    Py_XDECREF(y);
    Py_XDECREF(out);
    Py_XDECREF(leaf);
    Py_XDECREF(func);
    Py_XDECREF(cargs);
    exit_clear(&e);
    return NULL;
}

/* -- freeing a call ------------------------------------------------------- */

/* The call type's slots, in every class of its MRO (CoroutineCall's and
 * Delayed's): what subtype_dealloc would clear, walking the classes one by
 * one. A call is made and freed per call of fine-grained recursion, and
 * that walk costs more than the rest of freeing it. */
#define MAX_CALL_SLOTS 24
static Py_ssize_t CALL_SLOTS[MAX_CALL_SLOTS];
static int NCALL_SLOTS;

/* Calls freed, kept for the next ones made (as CPython keeps tuples and
 * frames): their slots cleared, untracked by the GC, holding no reference
 * to their type. Under the GIL only. */
#ifdef Py_GIL_DISABLED
#define NFREE_CALLS 0
#else
#define NFREE_CALLS 256
#endif
static PyObject *FREE_CALLS[NFREE_CALLS + 1];
static int NFREE;

static void
call_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_TRASHCAN_BEGIN(self, call_dealloc)
    if (type->tp_weaklistoffset && *(PyObject **)((char *)self + type->tp_weaklistoffset))
        PyObject_ClearWeakRefs(self);
    for (int k = 0; k < NCALL_SLOTS; k++)
        Py_CLEAR(SLOT(self, CALL_SLOTS[k]));
    if (NFREE < NFREE_CALLS && type == (PyTypeObject *)CALL) {
        FREE_CALLS[NFREE++] = self;
    } else {
        type->tp_free(self);
    }
    Py_DECREF(type);
    Py_TRASHCAN_END
}

/* A new call object: one freed before, or a new one (its slots all NULL). */
static PyObject *
new_call(PyTypeObject *ct)
{
    if (NFREE && ct->tp_dealloc == call_dealloc) {
        PyObject *op = FREE_CALLS[--NFREE];
        PyObject_Init(op, ct); /* its type (a reference) and a reference count of 1 */
        PyObject_GC_Track(op);
        return op;
    }
    return ct->tp_alloc(ct, 0);
}

/* call_dealloc stands for subtype_dealloc only where that does nothing
 * else: no finalizer, no __del__, no instance dict, and every class of the
 * MRO but object one defined in Python (same dealloc) whose slots are
 * collected here. Called once (setup_calls): the table is that type's.
 * 0: taken, 1: left as it is. */
static int
fast_dealloc(PyTypeObject *t)
{
    destructor plain = t->tp_dealloc;
    if (t->tp_finalize || t->tp_del || t->tp_dictoffset || !(t->tp_flags & Py_TPFLAGS_HEAPTYPE) ||
        t->tp_free != PyObject_GC_Del)
        return 1;
    PyObject *mro = t->tp_mro;
    Py_ssize_t slots[MAX_CALL_SLOTS];
    int nslots = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *b = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (b == &PyBaseObject_Type)
            continue;
        if (!(b->tp_flags & Py_TPFLAGS_HEAPTYPE) || b->tp_dealloc != plain || b->tp_finalize ||
            b->tp_del || b->tp_dictoffset)
            return 1;
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(b->tp_dict, &pos, &key, &value)) {
            if (Py_TYPE(value) != &PyMemberDescr_Type ||
                ((PyMemberDescrObject *)value)->d_common.d_type != b)
                continue;
            PyMemberDef *m = ((PyMemberDescrObject *)value)->d_member;
            if (m->type != T_OBJECT_EX)
                continue;
            if (nslots == MAX_CALL_SLOTS)
                return 1;
            slots[nslots++] = m->offset;
        }
    }
    memcpy(CALL_SLOTS, slots, sizeof(slots));
    NCALL_SLOTS = nslots;
    t->tp_dealloc = call_dealloc;
    return 0;
}

/* -- FunctionBase: making a call ------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *inline_; /* what a call runs inline (the function), or None */
} FunctionBaseObject;

/* runtime.call._PLAIN: argument types that hold no dask collection (exact) */
static inline int
is_plain(PyObject *a)
{
    PyTypeObject *t = Py_TYPE(a);
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyUnicode_Type || t == &PyBool_Type ||
           a == Py_None || t == &PyBytes_Type || t == &PyComplex_Type;
}

/* CoroutineFunction.__call__ (runtime/call.py, _MakesCalls.__call__), step
 * for step: no key, no graph, five slot stores for a call that may run
 * inline. */
static PyObject *
make_call(PyObject *self_, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FunctionBaseObject *self = (FunctionBaseObject *)self_;
    if (CALL == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cengine.setup_calls() was not called");
        return NULL;
    }
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), i;
    PyTypeObject *ct = (PyTypeObject *)CALL;
    PyObject *call = new_call(ct);
    if (call == NULL)
        return NULL;
    /* Without keywords, every call shares one empty dict (nobody writes a
     * call's ``_kwargs``; an equal dict, so keys and tokens are the same as
     * the pure engine's). */
    int keywords = kwnames != NULL && PyTuple_GET_SIZE(kwnames);
    PyObject *targs = PyTuple_New(n), *ann = NULL;
    PyObject *kwargs = keywords ? PyDict_New() : Py_NewRef(NO_KWARGS);
    if (targs == NULL || kwargs == NULL)
        goto error;
    for (i = 0; i < n; i++)
        PyTuple_SET_ITEM(targs, i, Py_NewRef(args[i]));
    set_slot(call, C_FN, self_);
    set_slot(call, C_ARGS, targs);
    set_slot(call, C_KWARGS, kwargs);
    set_slot(call, C_VALUE, NOT_DONE);
    PyObject *func = self->inline_ == Py_None ? NULL : self->inline_;
    if (keywords) {
        PyObject *name = NULL;
        int plain = 1;
        for (i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[n + i];
            if (PyUnicode_Compare(k, S_KEYNAME) == 0) {
                name = v;
                continue;
            }
            if (PyErr_Occurred() || PyDict_SetItem(kwargs, k, v) < 0)
                goto error;
            if (!is_plain(v))
                plain = 0;
        }
        if (name != NULL && name != Py_None) {
            set_slot(call, C_NAME, name);
            func = NULL;
        } else if (!plain) {
            func = NULL;
        }
    }
    /* What dask.annotate set here: an annotated call is a task, but for the
     * run's own annotations (runtime.call: _own_seen, _is_own). */
    if (PyContextVar_Get(ANN_VAR, NULL, &ann) < 0)
        goto error;
    if (ann != NULL) {
        int t = PyObject_IsTrue(ann);
        if (t < 0)
            goto error;
        if (t) {
            set_slot(call, C_ANN, ann);
            if (PyList_GET_SIZE(OWN_SEEN) != 1) {
                PyErr_SetString(PyExc_RuntimeError, "setup_calls(own_seen=) changed size");
                goto error;
            }
            if (ann != PyList_GET_ITEM(OWN_SEEN, 0)) {
                PyObject *r = PyObject_CallOneArg(IS_OWN, ann);
                if (r == NULL)
                    goto error;
                int own = PyObject_IsTrue(r);
                Py_DECREF(r);
                if (own < 0)
                    goto error;
                if (!own)
                    func = NULL;
                else if (PyList_SetItem(OWN_SEEN, 0, Py_NewRef(ann)) < 0)
                    goto error;
            }
        }
        Py_CLEAR(ann);
        /* Python code may have run (is_own): what to run inline, read again */
        if (func != NULL)
            func = self->inline_ == Py_None ? NULL : self->inline_;
    }
    if (func != NULL) {
        for (i = 0; i < n; i++)
            if (!is_plain(args[i]))
                break;
        if (i == n) {
            if (PyDict_GET_SIZE(kwargs)) {
                PyObject *one = PyTuple_Pack(1, func);
                if (one == NULL)
                    goto error;
                PyObject *p = PyObject_Call(PARTIAL, one, kwargs);
                Py_DECREF(one);
                if (p == NULL)
                    goto error;
                set_slot(call, C_INLINE, p);
                Py_DECREF(p);
            } else {
                set_slot(call, C_INLINE, func);
            }
            Py_DECREF(targs);
            Py_DECREF(kwargs);
            return call;
        }
    }
    set_slot(call, C_INLINE, Py_None);
    Py_DECREF(targs);
    Py_DECREF(kwargs);
    return call;
error:
    Py_XDECREF(ann);
    Py_XDECREF(targs);
    Py_XDECREF(kwargs);
    Py_DECREF(call);
    return NULL;
}

static PyObject *
fbase_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    FunctionBaseObject *self = (FunctionBaseObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = make_call;
    self->inline_ = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int
fbase_traverse(FunctionBaseObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->inline_);
    return 0;
}

static int
fbase_clear(FunctionBaseObject *self)
{
    Py_CLEAR(self->inline_);
    return 0;
}

static void
fbase_dealloc(FunctionBaseObject *self)
{
    PyObject_GC_UnTrack(self);
    fbase_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef fbase_members[] = {
    {"_inline", T_OBJECT, offsetof(FunctionBaseObject, inline_), 0,
     "what a call runs inline (the function), or None"},
    {NULL},
};

static PyTypeObject FunctionBase_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dask_coro.core._cengine.FunctionBase",
    .tp_doc = "Calling it makes a call object, in C (runtime.call.CoroutineFunction's base).",
    .tp_basicsize = sizeof(FunctionBaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE |
                Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = fbase_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FunctionBaseObject, vectorcall),
    .tp_traverse = (traverseproc)fbase_traverse,
    .tp_clear = (inquiry)fbase_clear,
    .tp_dealloc = (destructor)fbase_dealloc,
    .tp_members = fbase_members,
};

/* fast_calls(cls): calls of ``cls`` (a Python subclass of FunctionBase that
 * does not define __call__) take the vectorcall path. CPython 3.12 does this
 * itself; 3.10 and 3.11 give a class defined in Python no vectorcall, so a
 * call would pack its arguments in a tuple first (PyVectorcall_Call). */
static PyObject *
fast_calls(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &FunctionBase_Type)) {
        PyErr_Format(PyExc_TypeError, "expected a subclass of FunctionBase, got %R", cls);
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    if (t->tp_call != PyVectorcall_Call ||
        t->tp_vectorcall_offset != offsetof(FunctionBaseObject, vectorcall)) {
        PyErr_Format(PyExc_TypeError, "%R defines __call__ of its own", cls);
        return NULL;
    }
    t->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
    Py_RETURN_NONE;
}

/* -- setup ----------------------------------------------------------------- */

/* The keyword arguments ``names`` of ``fn`` (all of them, and no other), in
 * ``out``, borrowed. */
static int
take_kwargs(const char *fn, PyObject *args, PyObject *kw, const char *const *names, size_t n,
            PyObject **out)
{
    if (PyTuple_GET_SIZE(args) || kw == NULL || !PyDict_CheckExact(kw)) {
        PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only", fn);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        out[k] = PyDict_GetItemString(kw, names[k]);
        if (out[k] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s(): missing %s", fn, names[k]);
            return -1;
        }
    }
    if ((size_t)PyDict_GET_SIZE(kw) != n) {
        PyErr_Format(PyExc_TypeError, "%s(): unexpected keyword arguments", fn);
        return -1;
    }
    return 0;
}

/* A second set-up: one with the very objects of the first does nothing,
 * one with others is an error (a step or a call may be running on the first
 * ones: the loop never changes them). 1: it was set up, 0: not yet. */
static int
set_up_already(const char *fn, PyObject **now, PyObject *const *given, const char *const *names,
               size_t n)
{
    if (now[0] == NULL)
        return 0;
    for (size_t k = 0; k < n; k++)
        if (now[k] != given[k]) {
            PyErr_Format(PyExc_RuntimeError, "_cengine.%s() was called already, with another "
                         "%s: the compiled engine is set up once", fn, names[k]);
            return -1;
        }
    return 1;
}

static const char *const SETUP_NAMES[] = {"Trampoline", "Frame", "NOT_DONE", "PENDING", "STEPPED",
                                          "EMPTY",      "RANGES", "Failed",  "Request",  "Idle"};
#define NSETUP (sizeof(SETUP_NAMES) / sizeof(SETUP_NAMES[0]))
/* Frame's slots: all of them, each with what its offset goes to. */
static const char *const FRAME_SLOTS[] = {"body",   "func",    "done", "up",     "at",    "index",
                                          "shape",  "leaves",  "results", "todo", "next",
                                          "remote", "sent",    "scope", "ann",   "ctx"};
static Py_ssize_t *const FRAME_OFFSETS[] = {&F_BODY,   &F_FUNC,   &F_DONE,    &F_UP,
                                            &F_AT,     &F_INDEX,  &F_SHAPE,   &F_LEAVES,
                                            &F_RESULTS, &F_TODO,  &F_NEXT,    &F_REMOTE,
                                            &F_SENT,   &F_SCOPE,  &F_ANN,     &F_CTX};
#define NFRAME (sizeof(FRAME_SLOTS) / sizeof(FRAME_SLOTS[0]))

/* setup(**engine's objects): what the loop shares with engine.py. Every
 * object is checked before any is kept. */
static PyObject *
setup(PyObject *module, PyObject *args, PyObject *kw)
{
    PyObject *v[NSETUP];
    if (take_kwargs("setup", args, kw, SETUP_NAMES, NSETUP, v) < 0)
        return NULL;
    PyObject *tramp = v[0], *frame = v[1], *ranges = v[6], *failed = v[7], *request = v[8],
             *idle = v[9];
    if (!PyType_Check(tramp) || !PyType_Check(frame) || !PyType_Check(idle) ||
        !PyType_Check(failed) || !PyType_Check(request) || !PyList_CheckExact(ranges)) {
        PyErr_SetString(PyExc_TypeError, "setup(): Trampoline, Frame, Idle, Failed and Request "
                                         "are classes, RANGES a list");
        return NULL;
    }
    Py_ssize_t offs[NFRAME], i_n, t_stop;
    for (size_t k = 0; k < NFRAME; k++)
        if (offset_of(frame, FRAME_SLOTS[k], &offs[k]) < 0)
            return NULL;
    if (check_layout((PyTypeObject *)frame, NULL, FRAME_SLOTS, NFRAME, 0) < 0)
        return NULL;
    if (((PyTypeObject *)frame)->tp_alloc != PyType_GenericAlloc) {
        PyErr_Format(PyExc_TypeError, "setup(): %R must be a plain class with __slots__", frame);
        return NULL;
    }
    if (offset_of(idle, "n", &i_n) < 0 || offset_of(tramp, "stop", &t_stop) < 0)
        return NULL;
    PyObject **now[NSETUP] = {&TRAMP, &FRAME,  &NOT_DONE, &PENDING, &STEPPED,
                              &EMPTY, &RANGES, &FAILED,   &REQUEST, &IDLE};
    PyObject *cur[NSETUP];
    for (size_t k = 0; k < NSETUP; k++)
        cur[k] = *now[k];
    int again = set_up_already("setup", cur, v, SETUP_NAMES, NSETUP);
    if (again < 0)
        return NULL;
    if (again)
        return Py_NewRef(PEEK_VARS ? Py_True : Py_False);
    PEEK_VARS = check_context_layout();
    for (size_t k = 0; k < NSETUP; k++)
        *now[k] = Py_NewRef(v[k]);
    for (size_t k = 0; k < NFRAME; k++)
        *FRAME_OFFSETS[k] = offs[k];
    I_N = i_n;
    T_STOP = t_stop;
    READY = CALL != NULL;
    /* whether a step's change of context is seen at the cheap way */
    return Py_NewRef(PEEK_VARS ? Py_True : Py_False);
}

static const char *const CALLS_NAMES[] = {"call_type", "partial", "is_own", "own_seen",
                                          "annotations"};
#define NCALLS (sizeof(CALLS_NAMES) / sizeof(CALLS_NAMES[0]))
/* the call type's own slots */
static const char *const CALL_NAMES[] = {"_fn",  "__dask_coro_args__",   "_kwargs",
                                         "_name", "__dask_coro_inline__", "__dask_coro_value__",
                                         "_ann"};
static Py_ssize_t *const CALL_OFFSETS[] = {&C_FN, &C_ARGS, &C_KWARGS, &C_NAME,
                                           &C_INLINE, &C_VALUE, &C_ANN};
#define NCALL (sizeof(CALL_NAMES) / sizeof(CALL_NAMES[0]))

/* setup_calls(call_type, partial, is_own, own_seen, annotations): what making
 * a call shares with runtime/call.py. Once: the free list of calls and the
 * table of their slots are the call type's. */
static PyObject *
setup_calls(PyObject *module, PyObject *args, PyObject *kw)
{
    PyObject *v[NCALLS];
    if (take_kwargs("setup_calls", args, kw, CALLS_NAMES, NCALLS, v) < 0)
        return NULL;
    PyObject *call = v[0], *own_seen = v[3], *ann_var = v[4];
    if (!PyType_Check(call) || ((PyTypeObject *)call)->tp_alloc != PyType_GenericAlloc ||
        ((PyTypeObject *)call)->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_Format(PyExc_TypeError, "setup_calls(): %R must be a class with __slots__ and "
                                      "object's __new__", call);
        return NULL;
    }
    Py_ssize_t offs[NCALL];
    for (size_t k = 0; k < NCALL; k++)
        if (offset_of(call, CALL_NAMES[k], &offs[k]) < 0)
            return NULL;
    /* the class that defines them defines no other, nor does a subclass of it */
    PyObject *d = PyObject_GetAttrString(call, CALL_NAMES[0]);
    if (d == NULL)
        return NULL;
    PyTypeObject *owner = ((PyMemberDescrObject *)d)->d_common.d_type;
    Py_DECREF(d);
    if (check_layout((PyTypeObject *)call, owner, CALL_NAMES, NCALL, 1) < 0)
        return NULL;
    if (!PyList_CheckExact(own_seen) || PyList_GET_SIZE(own_seen) != 1 ||
        !PyContextVar_CheckExact(ann_var)) {
        PyErr_SetString(PyExc_TypeError, "setup_calls(): own_seen is a list of one, annotations "
                                         "a ContextVar");
        return NULL;
    }
    PyObject *cur[NCALLS] = {CALL, PARTIAL, IS_OWN, OWN_SEEN, ANN_VAR};
    int again = set_up_already("setup_calls", cur, v, CALLS_NAMES, NCALLS);
    if (again)
        return again < 0 ? NULL : Py_NewRef(Py_None);
    fast_dealloc((PyTypeObject *)call);
    CALL = Py_NewRef(call);
    PARTIAL = Py_NewRef(v[1]);
    IS_OWN = Py_NewRef(v[2]);
    OWN_SEEN = Py_NewRef(own_seen);
    ANN_VAR = Py_NewRef(ann_var);
    for (size_t k = 0; k < NCALL; k++)
        *CALL_OFFSETS[k] = offs[k];
    READY = FRAME != NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"steps", (PyCFunction)(void (*)(void))steps, METH_FASTCALL,
     "steps(tramp, top, run, countdown, barren, stack, idle, call_type, annotations_now, "
     "own_annotations): Trampoline._steps's inner loop, the common case; returns None (it did "
     "nothing) or an Exit: where it stopped, by name"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(**objects of engine.py): whether a Context's layout is the one the loop reads"},
    {"setup_calls", (PyCFunction)(void (*)(void))setup_calls, METH_VARARGS | METH_KEYWORDS,
     "setup_calls(call_type=, partial=, is_own=, own_seen=, annotations=)"},
    {"fast_calls", fast_calls, METH_O, "fast_calls(cls): vectorcall for a FunctionBase subclass"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dask_coro.core._cengine",
    "The compiled engine (optional): see dask_coro.core.accel.", -1, module_methods,
};

/* The interpreter is the one it was built for: the same CPython 3.x (the
 * layout of objects and types changes between them), with the GIL. Checked
 * before anything else touches an object: only functions are called. */
static int
same_python(void)
{
    const char *have = Py_GetVersion();
    char want[16], shown[24];
    PyOS_snprintf(want, sizeof(want), "%d.%d.", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    size_t k = 0;
    while (k < sizeof(shown) - 1 && have[k] && have[k] != ' ')
        shown[k] = have[k], k++;
    shown[k] = '\0';
    if (strncmp(have, want, strlen(want)) != 0) {
        PyErr_Format(PyExc_ImportError, "dask_coro.core._cengine was built for CPython %d.%d, "
                     "not %s: build it again (pip install, or python setup.py build_ext "
                     "--inplace)", PY_MAJOR_VERSION, PY_MINOR_VERSION, shown);
        return -1;
    }
    if (strstr(have, "free-threading") != NULL) {
        PyErr_SetString(PyExc_ImportError, "dask_coro.core._cengine needs the GIL: a "
                        "free-threaded Python runs the pure engine");
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__cengine(void)
{
    if (same_python() < 0)
        return NULL;
    if (PyType_Ready(&FunctionBase_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#define INTERN(var, s)                                  \
    if ((var = PyUnicode_InternFromString(s)) == NULL) \
        return NULL;
    INTERN(S_STACK, "stack");
    INTERN(S_IDLE, "idle");
    INTERN(S_CALL_TYPE, "call_type");
    INTERN(S_STOP, "stop");
    INTERN(S_CLOSING, "_closing");
    INTERN(S_CHILD_ERROR, "child_error");
    INTERN(S_ANN_NOW, "annotations_now");
    INTERN(S_OWN, "own_annotations");
    INTERN(S_STARTED, "_started");
    INTERN(S_FAILED, "_failed");
    INTERN(S_CALL_ENDED, "_call_ended");
    INTERN(S_ABANDON, "_abandon");
    INTERN(S_THROW, "throw");
    INTERN(S_SEND, "send");
    INTERN(S_VALUE, "value");
    INTERN(S_KEYNAME, "dask_key_name");
    INTERN(S_N, "n");
#undef INTERN
    if ((ZERO = PyLong_FromLong(0)) == NULL || (NO_KWARGS = PyDict_New()) == NULL)
        return NULL;
    for (int i = 0; i < NSMALL; i++)
        if ((SMALL[i] = PyLong_FromLong(i)) == NULL)
            return NULL;
    EXIT_TYPE = PyStructSequence_NewType(&EXIT_DESC);
    if (EXIT_TYPE == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Exit", (PyObject *)EXIT_TYPE) < 0 ||
        PyModule_AddIntConstant(m, "SLOW", SLOW) < 0 ||
        PyModule_AddIntConstant(m, "BREAK", BREAK) < 0 ||
        PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
        PyModule_AddObjectRef(m, "FunctionBase", (PyObject *)&FunctionBase_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
