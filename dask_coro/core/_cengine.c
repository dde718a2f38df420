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
 * CPython's public C API (PyIter_Send: 3.10), 3.10 to 3.13.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* -- what setup() gives ---------------------------------------------------- */

static int READY = 0;
static PyObject *NOT_DONE, *PENDING, *STEPPED, *EMPTY, *RANGES, *FAILED, *REQUEST;
static PyObject *ZERO, *NO_KWARGS;
static PyObject *TRAMP, *FRAME, *IDLE, *CALL, *PARTIAL, *IS_OWN, *OWN_SEEN, *ANN_VAR;
static Py_ssize_t NRANGES;
/* slot offsets */
static Py_ssize_t F_BODY, F_FUNC, F_DONE, F_UP, F_AT, F_INDEX, F_SHAPE, F_LEAVES, F_RESULTS,
    F_TODO, F_NEXT, F_REMOTE, F_SENT, F_SCOPE, F_ANN, F_IS_ASYNC;
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

/* A slot's offset, from its member descriptor on ``type``. */
static int
offset_of(PyObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL)
        return -1;
    if (Py_TYPE(d) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", type, name);
        Py_DECREF(d);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a writable object slot", type, name);
        Py_DECREF(d);
        return -1;
    }
    *out = m->offset;
    Py_DECREF(d);
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

static Py_ssize_t
int_slot(PyObject *o, Py_ssize_t off)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL || !PyLong_CheckExact(v))
        return -2; /* not a plain int: the pure loop decides */
    return PyLong_AsSsize_t(v);
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
    if (n < NRANGES) {
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
        int rc = PyObject_SetItem(results, k, value);
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
    return v == NULL ? truthy_attr(tramp, S_STOP) : PyObject_IsTrue(v);
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
                         F_REMOTE, F_SCOPE, F_ANN, F_IS_ASYNC};
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
} Exit;

static PyObject *
exit_tuple(Exit *e)
{
#define OR_NONE(x) ((x) != NULL ? (x) : Py_NewRef(Py_None))
    PyObject *r = Py_BuildValue("(iNnNNNNinNN)", e->code, e->top, e->countdown,
                                PyBool_FromLong(e->barren), OR_NONE(e->method),
                                OR_NONE(e->arg), OR_NONE(e->out), e->ended, e->fresh,
                                OR_NONE(e->body), OR_NONE(e->func));
#undef OR_NONE
    e->top = e->method = e->arg = e->out = e->body = e->func = NULL;
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
    Exit e = {SLOW, Py_NewRef(args[1]), 0, 0, NULL, NULL, NULL, 0, -1, NULL, NULL};
    e.countdown = PyLong_AsSsize_t(args[3]);
    if (e.countdown == -1 && PyErr_Occurred()) {
        Py_DECREF(e.top);
        return NULL;
    }
    e.barren = PyObject_IsTrue(args[4]);
    Py_ssize_t iters = 0; /* iterations begun */
    if (run == Py_None)
        run = NULL;
    else if (!PyList_CheckExact(run) || PyList_GET_SIZE(run) != 2) {
        Py_DECREF(e.top);
        PyErr_SetString(PyExc_TypeError, "run must be None or [func, n]");
        return NULL;
    }
    PyObject *y = NULL, *out = NULL, *leaf = NULL, *func = NULL;
    Spare spare = {{NULL}, 0};
    Py_ssize_t run_add = 0; /* calls of run[0] started, not yet added to run[1] */
    if (!PyList_CheckExact(stack)) {
        PyErr_SetString(PyExc_TypeError, "Trampoline.stack must be a list");
        goto error;
    }
    if (call_type != CALL) {
        PyErr_Format(PyExc_TypeError, "steps() runs calls of %R only, not %R", CALL, call_type);
        goto error;
    }
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
            PyObject *remote = SLOT(top, F_REMOTE), *shape = SLOT(top, F_SHAPE),
                     *scope = SLOT(top, F_SCOPE), *body = SLOT(top, F_BODY);
            if (remote == NULL || shape == NULL || scope == NULL || body == NULL)
                goto slow;
            int r = PyObject_IsTrue(remote);
            if (r != 0)
                goto slow_or_error;
            r = stop_set(tramp);
            if (r != 0)
                goto slow_or_error;
            if ((shape != (PyObject *)&PyList_Type && shape != (PyObject *)&PyTuple_Type) ||
                scope != Py_None || !PyGen_CheckExact(body))
                goto slow;
            PyObject *results = SLOT(top, F_RESULTS);
            if (results == NULL || !PyList_CheckExact(results))
                goto slow;
            PyObject *value = shape == (PyObject *)&PyList_Type ? Py_NewRef(results)
                                                                : PyList_AsTuple(results);
            if (value == NULL)
                goto error;
            set_slot(top, F_LEAVES, EMPTY);
            set_slot(top, F_RESULTS, EMPTY);
            set_slot(top, F_ANN, Py_None);
            Py_INCREF(body);
            PySendResult rc = PyIter_Send(body, value, &y);
            Py_DECREF(value);
            Py_DECREF(body);
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
                PyObject *done_frame = e.top;
                e.top = Py_NewRef(PyList_GET_ITEM(stack, n - 2));
                spare_put(&spare, done_frame);
                PyObject *up_leaves = SLOT(e.top, F_LEAVES);
                if (up_leaves == NULL) {
                    PyErr_SetString(PyExc_AttributeError, "leaves");
                    goto error;
                }
                leaf = PySequence_GetItem(up_leaves, at);
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
            PyTypeObject *yt = Py_TYPE(y);
            if (yt == &PyList_Type || yt == &PyTuple_Type) {
                r = ann_plain(&ann);
                if (r < 0)
                    goto error;
                if (r && all_calls(y, ctype)) {
                    Py_ssize_t index = int_slot(top, F_INDEX);
                    if (index < -1)
                        goto error_index;
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
            }
            if (n > 0)
                goto slow; /* hand calls out: Stealing._steal */
        }
        PyObject *posobj = PySequence_Fast_GET_ITEM(todo, i);
        Py_ssize_t pos = PyLong_AsSsize_t(posobj);
        if (pos == -1 && PyErr_Occurred())
            goto error;
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
        {
            int r = stop_set(tramp);
            if (r != 0)
                goto slow_or_error;
        }
        if (e.countdown <= 1)
            goto slow; /* the pure loop counts and asks ``cancelled`` */
        PyObject *cargs = SLOT(lf, C_ARGS);
        if (cargs == NULL || !PyTuple_CheckExact(cargs))
            goto slow;
        e.countdown--;
        if (set_int_slot(top, F_NEXT, i + 1) < 0)
            goto error;
        leaf = Py_NewRef(lf);
        func = Py_NewRef(fn);
        if (run != NULL) {
            if (PyList_GET_ITEM(run, 0) == func) {
                run_add++;
            } else {
                if (run_flush(run, &run_add) < 0)
                    goto error;
                PyObject *rf = PyList_GET_ITEM(run, 0), *rn = PyList_GET_ITEM(run, 1);
                if (PyObject_IsTrue(rn)) {
                    PyObject *r = PyObject_CallMethodObjArgs(tramp, S_STARTED, rf, rn, NULL);
                    if (r == NULL)
                        goto error;
                    Py_DECREF(r);
                }
                PyList_SetItem(run, 0, Py_NewRef(func));
                PyList_SetItem(run, 1, PyLong_FromLong(1));
            }
        }
        out = PyObject_Vectorcall(func, &PyTuple_GET_ITEM(cargs, 0), PyTuple_GET_SIZE(cargs),
                                  NULL);
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
            if (tb == NULL || bound(&e, tb, S_THROW) < 0) {
                Py_DECREF(err);
                if (tb == NULL)
                    PyErr_SetString(PyExc_AttributeError, "body");
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
            /* Its first step, here. */
            PySendResult rc = PyIter_Send(out, Py_None, &y);
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
                int r = ann_plain(&ann);
                if (r < 0)
                    goto error;
                if (r && all_calls(y, ctype)) {
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

error_index:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "Frame.index is not an int");
    goto error;
slow_or_error:
    if (PyErr_Occurred())
        goto error;
slow:
    e.code = SLOW;
    if (iters == 1) {
        /* stopped in its first iteration, before it did anything of it: the
         * pure loop goes on as it was */
        Py_CLEAR(e.top);
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
    spare_free(&spare);
    Py_XDECREF(y);
    Py_XDECREF(out);
    Py_XDECREF(leaf);
    Py_XDECREF(func);
    return exit_tuple(&e);
error:
    {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        if (run_flush(run, &run_add) < 0)
            PyErr_WriteUnraisable(tramp);
        PyErr_Restore(t, v, tb);
    }
    spare_free(&spare);
    Py_XDECREF(y);
    Py_XDECREF(out);
    Py_XDECREF(leaf);
    Py_XDECREF(func);
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
 * collected here. 0: taken, 1: left as it is, -1: error. */
static int
fast_dealloc(PyTypeObject *t)
{
    destructor plain = t->tp_dealloc;
    if (t->tp_finalize || t->tp_del || t->tp_dictoffset || !(t->tp_flags & Py_TPFLAGS_HEAPTYPE) ||
        t->tp_free != PyObject_GC_Del)
        return 1;
    PyObject *mro = t->tp_mro;
    NCALL_SLOTS = 0;
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
            if (NCALL_SLOTS == MAX_CALL_SLOTS)
                return 1;
            CALL_SLOTS[NCALL_SLOTS++] = m->offset;
        }
    }
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
            if (ann != PyList_GET_ITEM(OWN_SEEN, 0)) {
                PyObject *r = PyObject_CallOneArg(IS_OWN, ann);
                if (r == NULL)
                    goto error;
                int own = PyObject_IsTrue(r);
                Py_DECREF(r);
                if (own < 0)
                    goto error;
                if (own)
                    PyList_SetItem(OWN_SEEN, 0, Py_NewRef(ann));
                else
                    func = NULL;
            }
        }
        Py_CLEAR(ann);
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

static PyObject *
getkw(PyObject *kw, const char *name)
{
    PyObject *v = kw ? PyDict_GetItemString(kw, name) : NULL;
    if (v == NULL)
        PyErr_Format(PyExc_TypeError, "setup: missing %s", name);
    return v;
}

#define TAKE(var, name)                     \
    do {                                    \
        PyObject *_v = getkw(kw, name);     \
        if (_v == NULL)                     \
            return NULL;                    \
        Py_XSETREF(var, Py_NewRef(_v));     \
    } while (0)

/* setup(**engine's objects): what the loop shares with engine.py */
static PyObject *
setup(PyObject *module, PyObject *args, PyObject *kw)
{
    TAKE(TRAMP, "Trampoline");
    TAKE(FRAME, "Frame");
    TAKE(IDLE, "Idle");
    TAKE(NOT_DONE, "NOT_DONE");
    TAKE(PENDING, "PENDING");
    TAKE(STEPPED, "STEPPED");
    TAKE(EMPTY, "EMPTY");
    TAKE(RANGES, "RANGES");
    TAKE(FAILED, "Failed");
    TAKE(REQUEST, "Request");
    if (!PyType_Check(FRAME) || !PyType_Check(IDLE) || !PyType_Check(FAILED) ||
        !PyType_Check(REQUEST) || !PyList_CheckExact(RANGES)) {
        PyErr_SetString(PyExc_TypeError, "setup: Frame, Idle, Failed and Request are types, "
                                         "RANGES a list");
        return NULL;
    }
    NRANGES = PyList_GET_SIZE(RANGES);
    struct {
        const char *name;
        Py_ssize_t *off;
    } fields[] = {
        {"body", &F_BODY},       {"func", &F_FUNC},       {"done", &F_DONE},
        {"up", &F_UP},           {"at", &F_AT},           {"index", &F_INDEX},
        {"shape", &F_SHAPE},     {"leaves", &F_LEAVES},   {"results", &F_RESULTS},
        {"todo", &F_TODO},       {"next", &F_NEXT},       {"remote", &F_REMOTE},
        {"sent", &F_SENT},       {"scope", &F_SCOPE},     {"ann", &F_ANN},
        {"is_async", &F_IS_ASYNC},
    };
    for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
        if (offset_of(FRAME, fields[k].name, fields[k].off) < 0)
            return NULL;
    if (offset_of(IDLE, "n", &I_N) < 0 || offset_of(TRAMP, "stop", &T_STOP) < 0)
        return NULL;
    if (((PyTypeObject *)FRAME)->tp_alloc != PyType_GenericAlloc) {
        PyErr_SetString(PyExc_TypeError, "setup: Frame must be a plain class with __slots__");
        return NULL;
    }
    READY = CALL != NULL;
    Py_RETURN_NONE;
}

/* setup_calls(call_type, partial, is_own, own_seen, annotations): what making
 * a call shares with runtime/call.py */
static PyObject *
setup_calls(PyObject *module, PyObject *args, PyObject *kw)
{
    PyObject *call = getkw(kw, "call_type");
    if (call == NULL)
        return NULL;
    if (!PyType_Check(call) || ((PyTypeObject *)call)->tp_alloc != PyType_GenericAlloc ||
        ((PyTypeObject *)call)->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_Format(PyExc_TypeError, "setup_calls: %R must be a class with __slots__ and "
                                      "object's __new__", call);
        return NULL;
    }
    struct {
        const char *name;
        Py_ssize_t *off;
    } fields[] = {
        {"_fn", &C_FN},        {"__dask_coro_args__", &C_ARGS},
        {"_kwargs", &C_KWARGS}, {"_name", &C_NAME},
        {"__dask_coro_inline__", &C_INLINE}, {"__dask_coro_value__", &C_VALUE},
        {"_ann", &C_ANN},
    };
    for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
        if (offset_of(call, fields[k].name, fields[k].off) < 0)
            return NULL;
    TAKE(PARTIAL, "partial");
    TAKE(IS_OWN, "is_own");
    TAKE(OWN_SEEN, "own_seen");
    TAKE(ANN_VAR, "annotations");
    if (!PyList_CheckExact(OWN_SEEN) || PyList_GET_SIZE(OWN_SEEN) != 1 ||
        !PyContextVar_CheckExact(ANN_VAR)) {
        PyErr_SetString(PyExc_TypeError, "setup_calls: own_seen is a list of one, annotations "
                                         "a ContextVar");
        return NULL;
    }
    if (((PyTypeObject *)call)->tp_dealloc != call_dealloc && fast_dealloc((PyTypeObject *)call) < 0)
        return NULL;
    Py_XSETREF(CALL, Py_NewRef(call));
    READY = FRAME != NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"steps", (PyCFunction)(void (*)(void))steps, METH_FASTCALL,
     "steps(tramp, top, run, countdown, barren, stack, idle, call_type, annotations_now, "
     "own_annotations): Trampoline._steps's inner loop, the common case; returns None (it did "
     "nothing) or (code, top, countdown, barren, method, arg, out, ended, fresh, body, func)"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(**objects of engine.py)"},
    {"setup_calls", (PyCFunction)(void (*)(void))setup_calls, METH_VARARGS | METH_KEYWORDS,
     "setup_calls(call_type=, partial=, is_own=, own_seen=, annotations=)"},
    {"fast_calls", fast_calls, METH_O, "fast_calls(cls): vectorcall for a FunctionBase subclass"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dask_coro.core._cengine",
    "The compiled engine (optional): see dask_coro.core.accel.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__cengine(void)
{
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
    if (PyModule_AddIntConstant(m, "SLOW", SLOW) < 0 ||
        PyModule_AddIntConstant(m, "BREAK", BREAK) < 0 ||
        PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
        PyModule_AddObjectRef(m, "FunctionBase", (PyObject *)&FunctionBase_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
