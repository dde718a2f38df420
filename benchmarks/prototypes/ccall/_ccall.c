/* A prototype, not part of dask_coro: the call object and the inline stepping
 * loop of dask_coro.core.engine.Trampoline in C, for the hot path of
 * fine-grained recursion only. See README.md and
 * benchmarks/RESULTS.md for what it keeps, what it leaves out, and what it
 * measures.
 *
 *   coroutine(func)         a decorated function (CFunction): calling it makes
 *                           a CCall (C fields: function, args, value), with a
 *                           C vectorcall, no argument tuple of its own beyond
 *                           the call's args, no kwargs dict without keywords.
 *   Trampoline(cancelled=None, check_every=256)
 *     .run(call)            runs the call's body and every call it yields
 *                           inline, depth first, resuming each body with
 *                           PyIter_Send; returns its value, raises its error,
 *                           or returns STOPPED once cancelled.
 *     .stop                 set it (any thread) and no call starts after the
 *                           loop next reads it (before each call).
 *     .calls                {CFunction: [started, failed]} (progress).
 *
 * CPython 3.11, public C API plus PyIter_Send (public since 3.10).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *NOT_DONE;     /* a call's value before it ran */
static PyObject *STOPPED;      /* what run() returns once cancelled */
static PyObject *ANN_VAR;      /* a contextvar, or NULL: annotations in effect */
static PyObject *OWN_SEEN;     /* annotations a call found to be its run's own */
static PyObject *CURRENT_OWN;  /* the running run's own annotations, or NULL */
static PyObject *STR_THROW;
static PyObject *STR_CLOSE;
static PyObject *STR_KEYNAME;  /* "dask_key_name" */
static PyObject *STR_N;

/* -- CFunction ----------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *func;      /* the body function */
    PyObject *inline_;   /* func if calls may run inline, else NULL */
    PyObject *dict;      /* __dict__ (__name__, __wrapped__, ...) */
    vectorcallfunc vectorcall;
    PyTypeObject *call_type;  /* CCall_Type, or DCALL_TYPE (a Delayed subclass) */
} CFunctionObject;

/* -- CCall --------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    /* The layout of a dask.delayed.Delayed instance (its base's __weakref__,
     * then its four slots), so that one struct serves both call types: the
     * plain CCall leaves them NULL, DelayedCCall is a Delayed subclass
     * (make_delayed_type). Checked against Delayed.__basicsize__. */
    PyObject *weakref;
    PyObject *dslots[4];
    CFunctionObject *fn;
    PyObject *args;      /* tuple */
    PyObject *kwargs;    /* dict or NULL */
    PyObject *inline_;   /* what to call here, or NULL: not inline, or done */
    PyObject *value;     /* NOT_DONE, or the value computed inline */
    PyObject *error;     /* the exception it raised inline, or NULL */
    PyObject *name;      /* dask_key_name, or NULL */
} CCallObject;

static PyTypeObject CFunction_Type;
static PyTypeObject CCall_Type;
static PyTypeObject *DCALL_TYPE;  /* made by make_delayed_type, or NULL */
#define IS_CALL(o) (Py_TYPE(o) == &CCall_Type || Py_TYPE(o) == DCALL_TYPE)

static inline int
is_plain(PyObject *a)
{
    PyTypeObject *t = Py_TYPE(a);
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyUnicode_Type ||
           t == &PyBool_Type || a == Py_None || t == &PyBytes_Type ||
           t == &PyComplex_Type;
}

static PyObject *
cfunction_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                     PyObject *kwnames)
{
    CFunctionObject *self = (CFunctionObject *)self_;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), i;
    PyObject *targs = PyTuple_New(n);
    if (targs == NULL)
        return NULL;
    int plain = self->inline_ != NULL;
    for (i = 0; i < n; i++) {
        PyObject *a = args[i];
        Py_INCREF(a);
        PyTuple_SET_ITEM(targs, i, a);
        if (plain && !is_plain(a))
            plain = 0;
    }
    PyObject *kwargs = NULL, *name = NULL;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        kwargs = PyDict_New();
        if (kwargs == NULL) {
            Py_DECREF(targs);
            return NULL;
        }
        for (i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[n + i];
            if (PyUnicode_Compare(k, STR_KEYNAME) == 0) {
                Py_INCREF(v);
                Py_XSETREF(name, v);
                plain = 0; /* a named call is a task */
                continue;
            }
            if (PyDict_SetItem(kwargs, k, v) < 0) {
                Py_DECREF(targs);
                Py_DECREF(kwargs);
                Py_XDECREF(name);
                return NULL;
            }
            if (plain && !is_plain(v))
                plain = 0;
        }
        if (PyDict_GET_SIZE(kwargs) == 0)
            Py_CLEAR(kwargs);
    }
    if (plain && ANN_VAR != NULL) {
        /* What dask.annotate set here: an annotated call is a task. */
        PyObject *ann;
        if (PyContextVar_Get(ANN_VAR, NULL, &ann) < 0) {
            Py_DECREF(targs);
            Py_XDECREF(kwargs);
            Py_XDECREF(name);
            return NULL;
        }
        if (ann != NULL && ann != OWN_SEEN) {
            /* As CoroutineFunction.__call__: annotations other than the
             * run's own (on a worker, the span its task runs in) make the
             * call a task; the run's own are looked up once, not per call. */
            int truth = PyObject_IsTrue(ann), own = 0;
            if (truth > 0 && CURRENT_OWN != NULL)
                own = ann == CURRENT_OWN || PyObject_RichCompareBool(ann, CURRENT_OWN, Py_EQ) > 0;
            if (own)
                Py_XSETREF(OWN_SEEN, Py_NewRef(ann));
            else if (truth)
                plain = 0;
        }
        Py_XDECREF(ann);
    }
    CCallObject *call = PyObject_GC_New(CCallObject, self->call_type);
    if (call == NULL) {
        Py_DECREF(targs);
        Py_XDECREF(kwargs);
        Py_XDECREF(name);
        return NULL;
    }
    Py_INCREF(self);
    call->weakref = NULL;
    call->dslots[0] = call->dslots[1] = call->dslots[2] = call->dslots[3] = NULL;
    call->fn = self;
    call->args = targs;
    call->kwargs = kwargs;
    call->inline_ = plain ? Py_NewRef(self->inline_) : NULL;
    call->value = Py_NewRef(NOT_DONE);
    call->error = NULL;
    call->name = name;
    PyObject_GC_Track(call);
    return (PyObject *)call;
}

static PyObject *
cfunction_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *func;
    int inline_ = 1, delayed = 0;
    static char *kwlist[] = {"func", "inline", "delayed", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pp:coroutine", kwlist, &func, &inline_,
                                     &delayed))
        return NULL;
    if (delayed && DCALL_TYPE == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "coroutine(..., delayed=True): call make_delayed_type(Delayed) first");
        return NULL;
    }
    if (!PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError, "@coroutine expects a function, got %R", func);
        return NULL;
    }
    CFunctionObject *self = (CFunctionObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->func = Py_NewRef(func);
    self->inline_ = inline_ ? Py_NewRef(func) : NULL;
    self->dict = PyDict_New();
    self->vectorcall = cfunction_vectorcall;
    self->call_type = delayed ? DCALL_TYPE : &CCall_Type;
    if (self->dict == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    /* functools.update_wrapper's fields that a traceback or repr reads */
    const char *names[] = {"__name__", "__qualname__", "__module__", "__doc__", NULL};
    for (int i = 0; names[i]; i++) {
        PyObject *v = PyObject_GetAttrString(func, names[i]);
        if (v == NULL) {
            PyErr_Clear();
            continue;
        }
        int rc = PyDict_SetItemString(self->dict, names[i], v);
        Py_DECREF(v);
        if (rc < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    if (PyDict_SetItemString(self->dict, "__wrapped__", func) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
cfunction_traverse(CFunctionObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->func);
    Py_VISIT(self->inline_);
    Py_VISIT(self->dict);
    return 0;
}

static int
cfunction_clear(CFunctionObject *self)
{
    Py_CLEAR(self->func);
    Py_CLEAR(self->inline_);
    Py_CLEAR(self->dict);
    return 0;
}

static void
cfunction_dealloc(CFunctionObject *self)
{
    PyObject_GC_UnTrack(self);
    cfunction_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
cfunction_repr(CFunctionObject *self)
{
    return PyUnicode_FromFormat("<ccall.coroutine %R>", self->func);
}

static PyObject *
cfunction_get_inline(CFunctionObject *self, void *c)
{
    return PyBool_FromLong(self->inline_ != NULL);
}

static int
cfunction_set_inline(CFunctionObject *self, PyObject *v, void *c)
{
    if (v == NULL || !PyBool_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "inline must be True or False");
        return -1;
    }
    Py_XSETREF(self->inline_, v == Py_True ? Py_NewRef(self->func) : NULL);
    return 0;
}

static PyGetSetDef cfunction_getset[] = {
    {"inline", (getter)cfunction_get_inline, (setter)cfunction_set_inline, NULL, NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyMemberDef cfunction_members[] = {
    {"func", T_OBJECT, offsetof(CFunctionObject, func), READONLY, NULL},
    {NULL},
};

static PyTypeObject CFunction_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_ccall.coroutine",
    .tp_basicsize = sizeof(CFunctionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = cfunction_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CFunctionObject, vectorcall),
    .tp_dictoffset = offsetof(CFunctionObject, dict),
    .tp_traverse = (traverseproc)cfunction_traverse,
    .tp_clear = (inquiry)cfunction_clear,
    .tp_dealloc = (destructor)cfunction_dealloc,
    .tp_repr = (reprfunc)cfunction_repr,
    .tp_getset = cfunction_getset,
    .tp_members = cfunction_members,
};

/* -- CCall methods ------------------------------------------------------- */

static int
ccall_traverse(CCallObject *self, visitproc visit, void *arg)
{
    if (Py_TYPE(self) != &CCall_Type)
        Py_VISIT(Py_TYPE(self)); /* a heap type */
    for (int i = 0; i < 4; i++)
        Py_VISIT(self->dslots[i]);
    Py_VISIT(self->fn);
    Py_VISIT(self->args);
    Py_VISIT(self->kwargs);
    Py_VISIT(self->inline_);
    Py_VISIT(self->value);
    Py_VISIT(self->error);
    Py_VISIT(self->name);
    return 0;
}

static int
ccall_clear(CCallObject *self)
{
    for (int i = 0; i < 4; i++)
        Py_CLEAR(self->dslots[i]);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->args);
    Py_CLEAR(self->kwargs);
    Py_CLEAR(self->inline_);
    Py_CLEAR(self->value);
    Py_CLEAR(self->error);
    Py_CLEAR(self->name);
    return 0;
}

static void
ccall_dealloc(CCallObject *self)
{
    PyObject_GC_UnTrack(self);
    ccall_clear(self);
    PyObject_GC_Del(self);
}

static void
dcall_dealloc(CCallObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakref != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    ccall_clear(self);
    PyObject_GC_Del(self);
    Py_DECREF(tp);
}

static PyObject *
ccall_repr(CCallObject *self)
{
    return PyUnicode_FromFormat("<ccall %R%R>", self->fn->func, self->args);
}

static PyObject *
ccall_get_done(CCallObject *self, void *c)
{
    /* (value,) once computed inline, else None (also after an error) */
    if (self->value == NOT_DONE || self->error != NULL)
        Py_RETURN_NONE;
    return PyTuple_Pack(1, self->value);
}

static PyObject *
ccall_get_inline(CCallObject *self, void *c)
{
    return PyBool_FromLong(self->inline_ != NULL);
}

static PyGetSetDef ccall_getset[] = {
    {"done", (getter)ccall_get_done, NULL, NULL, NULL},
    {"inline", (getter)ccall_get_inline, NULL, NULL, NULL},
    {NULL},
};

static PyMemberDef ccall_members[] = {
    {"fn", T_OBJECT, offsetof(CCallObject, fn), READONLY, NULL},
    {"args", T_OBJECT, offsetof(CCallObject, args), READONLY, NULL},
    {"kwargs", T_OBJECT, offsetof(CCallObject, kwargs), READONLY, NULL},
    {"value", T_OBJECT, offsetof(CCallObject, value), READONLY, NULL},
    {"error", T_OBJECT, offsetof(CCallObject, error), READONLY, NULL},
    {"key_name", T_OBJECT, offsetof(CCallObject, name), READONLY, NULL},
    {NULL},
};

static PyTypeObject CCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_ccall.CCall",
    .tp_basicsize = sizeof(CCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)ccall_traverse,
    .tp_clear = (inquiry)ccall_clear,
    .tp_dealloc = (destructor)ccall_dealloc,
    .tp_repr = (reprfunc)ccall_repr,
    .tp_getset = ccall_getset,
    .tp_members = ccall_members,
};

/* -- Trampoline ---------------------------------------------------------- */

typedef struct {
    PyObject *gen;          /* the body, suspended at a yield */
    PyObject *leaves;       /* its yield: a list or tuple of CCall */
    PyObject *results;      /* list, filled as the leaves end */
    Py_ssize_t next, n;     /* the next leaf to run, how many */
    Py_ssize_t at;          /* its call's position in the parent's yield */
    CCallObject *call;      /* its call (NULL for the root): value or error kept there */
} Frame;

typedef struct {
    PyObject_HEAD
    int stop;
    int check_every;
    PyObject *cancelled;    /* callable or NULL */
    PyObject *idle;         /* an object whose .n is read before each call, or NULL */
    PyObject *calls;        /* {CFunction: [started, failed]} */
} TrampolineObject;

static int
tramp_init(TrampolineObject *self, PyObject *args, PyObject *kw)
{
    PyObject *cancelled = Py_None, *idle = Py_None;
    int check_every = 256;
    static char *kwlist[] = {"cancelled", "check_every", "idle", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OiO:Trampoline", kwlist, &cancelled,
                                     &check_every, &idle))
        return -1;
    if (check_every < 1) {
        PyErr_SetString(PyExc_ValueError, "check_every must be at least 1");
        return -1;
    }
    if (cancelled != Py_None && !PyCallable_Check(cancelled)) {
        PyErr_Format(PyExc_TypeError, "cancelled must be callable or None, got %R", cancelled);
        return -1;
    }
    self->stop = 0;
    self->check_every = check_every;
    Py_XSETREF(self->cancelled, cancelled == Py_None ? NULL : Py_NewRef(cancelled));
    Py_XSETREF(self->idle, idle == Py_None ? NULL : Py_NewRef(idle));
    if (self->calls == NULL && (self->calls = PyDict_New()) == NULL)
        return -1;
    return 0;
}

static int
tramp_traverse(TrampolineObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cancelled);
    Py_VISIT(self->idle);
    Py_VISIT(self->calls);
    return 0;
}

static int
tramp_clear(TrampolineObject *self)
{
    Py_CLEAR(self->cancelled);
    Py_CLEAR(self->idle);
    Py_CLEAR(self->calls);
    return 0;
}

static void
tramp_dealloc(TrampolineObject *self)
{
    PyObject_GC_UnTrack(self);
    tramp_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* calls[fn][slot] += k */
static int
count(TrampolineObject *self, CFunctionObject *fn, int slot, Py_ssize_t k)
{
    PyObject *c = PyDict_GetItemWithError(self->calls, (PyObject *)fn);
    if (c == NULL) {
        if (PyErr_Occurred())
            return -1;
        c = Py_BuildValue("[nn]", (Py_ssize_t)0, (Py_ssize_t)0);
        if (c == NULL)
            return -1;
        int rc = PyDict_SetItem(self->calls, (PyObject *)fn, c);
        Py_DECREF(c);
        if (rc < 0)
            return -1;
    }
    PyObject *old = PyList_GET_ITEM(c, slot);
    Py_ssize_t v = PyLong_AsSsize_t(old);
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromSsize_t(v + k);
    if (nv == NULL)
        return -1;
    PyList_SET_ITEM(c, slot, nv);
    Py_DECREF(old);
    return 0;
}

/* The pending exception, normalized, with its traceback on it. */
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
    Py_DECREF(t);
    return v;
}

/* A yield the prototype can run: a list or tuple of inline-able CCalls (or
 * calls done before). Anything else: an error to throw in at the yield (the
 * pure engine computes it remotely, or raises BadYieldError there). */
static PyObject *
check_yield(PyObject *y)
{
    if (!PyList_CheckExact(y) && !PyTuple_CheckExact(y))
        return PyObject_CallFunction(
            PyExc_TypeError, "s", "the prototype runs a yielded list or tuple of calls only");
    Py_ssize_t n = PySequence_Fast_GET_SIZE(y);
    PyObject **items = PySequence_Fast_ITEMS(y);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!IS_CALL(items[i]))
            return PyObject_CallFunction(
                PyExc_TypeError, "s", "the prototype runs a yielded list or tuple of calls only");
        CCallObject *c = (CCallObject *)items[i];
        if (c->inline_ == NULL && c->value == NOT_DONE && c->error == NULL)
            return PyObject_CallFunction(
                PyExc_TypeError, "s",
                "a call that cannot run inline (a key, annotations, lazy arguments) needs a "
                "cluster: not in the prototype");
    }
    return NULL;
}

static int
set_yield(Frame *f, PyObject *y)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(y);
    PyObject *results = PyList_New(n);
    if (results == NULL)
        return -1;
    Py_XSETREF(f->leaves, y); /* steals y */
    Py_XSETREF(f->results, results);
    f->n = n;
    f->next = 0;
    return 0;
}

static void
abandon(Frame *f)
{
    Py_CLEAR(f->leaves);
    Py_CLEAR(f->results);
    f->n = f->next = 0;
}

static void
deliver(CCallObject *leaf, PyObject *value)
{
    Py_INCREF(value);
    Py_SETREF(leaf->value, value);
    Py_CLEAR(leaf->inline_);
}

static void
fail(CCallObject *leaf, PyObject *error)
{
    Py_INCREF(error);
    Py_XSETREF(leaf->error, error);
    Py_CLEAR(leaf->inline_);
}

/* gen.throw(error): like PyIter_Send's result. */
static PySendResult
throw_into(PyObject *gen, PyObject *error, PyObject **out)
{
    PyObject *r = PyObject_CallMethodOneArg(gen, STR_THROW, error);
    if (r != NULL) {
        *out = r;
        return PYGEN_NEXT;
    }
    if (PyErr_ExceptionMatches(PyExc_StopIteration)) {
        PyObject *stop = fetch_error();
        PyObject *v = PyObject_GetAttrString(stop, "value");
        Py_DECREF(stop);
        if (v == NULL) {
            *out = NULL;
            return PYGEN_ERROR;
        }
        *out = v;
        return PYGEN_RETURN;
    }
    *out = NULL;
    return PYGEN_ERROR;
}

typedef struct {
    Frame *f;
    Py_ssize_t depth, cap;
} Stack;

static int
push(Stack *s, PyObject *gen, Py_ssize_t at, CCallObject *call)
{
    if (s->depth == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : 64;
        Frame *f = PyMem_Realloc(s->f, cap * sizeof(Frame));
        if (f == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->f = f;
        s->cap = cap;
    }
    Frame *f = &s->f[s->depth++];
    f->gen = gen; /* steals */
    f->leaves = f->results = NULL;
    f->n = f->next = 0;
    f->at = at;
    Py_XINCREF(call);
    f->call = call;
    return 0;
}

static void
pop(Stack *s)
{
    Frame *f = &s->f[--s->depth];
    Py_CLEAR(f->gen);
    Py_CLEAR(f->leaves);
    Py_CLEAR(f->results);
    Py_CLEAR(f->call);
}

/* Cancelled: close every open body, innermost first (Trampoline.close). */
static void
close_all(Stack *s)
{
    while (s->depth) {
        PyObject *r = PyObject_CallMethodNoArgs(s->f[s->depth - 1].gen, STR_CLOSE);
        if (r == NULL)
            PyErr_WriteUnraisable(s->f[s->depth - 1].gen);
        Py_XDECREF(r);
        pop(s);
    }
}

static PyObject *
tramp_run(TrampolineObject *self, PyObject *root_)
{
    if (self->calls == NULL || self->check_every < 1) {
        PyErr_SetString(PyExc_TypeError, "Trampoline.__init__ was not called");
        return NULL;
    }
    if (!IS_CALL(root_)) {
        PyErr_Format(PyExc_TypeError, "run() takes a call of a ccall.coroutine, got %R", root_);
        return NULL;
    }
    CCallObject *root = (CCallObject *)root_;
    if (root->value != NOT_DONE || root->error != NULL) {
        PyErr_SetString(PyExc_TypeError, "the root call ran before");
        return NULL;
    }
    /* The root is the task itself: it runs here whether or not it could
     * have run inline as a child. */
    PyObject *func = root->fn->func;
    PyObject *body = root->kwargs
        ? PyObject_Call(func, root->args, root->kwargs)
        : PyObject_Vectorcall(func, &PyTuple_GET_ITEM(root->args, 0),
                              PyTuple_GET_SIZE(root->args), NULL);
    if (body == NULL)
        return NULL;
    if (!PyGen_CheckExact(body))
        return body; /* a plain function's value */

    /* The annotations in effect where the run starts are its own
     * (Trampoline.own_annotations): a yield under others is annotated. */
    PyObject *own = NULL, *outer_own = CURRENT_OWN;
    if (ANN_VAR != NULL && PyContextVar_Get(ANN_VAR, NULL, &own) < 0) {
        Py_DECREF(body);
        return NULL;
    }
    CURRENT_OWN = own;
    Stack s = {NULL, 0, 0};
    PyObject *result = NULL;
    PyObject *y = NULL;
    PyObject *pending = NULL;  /* an error to throw into the top body */
    CFunctionObject *run_fn = NULL;  /* counting in runs of one function */
    CCallObject *held = NULL;  /* the call about to run, or running */
    Py_ssize_t run_n = 0;
    int countdown = self->check_every;
    PySendResult rc = PyIter_Send(body, Py_None, &y);
    if (rc == PYGEN_RETURN) {
        Py_DECREF(body);
        result = y;
        goto done;
    }
    if (rc == PYGEN_ERROR) {
        Py_DECREF(body);
        goto done;
    }
    if (push(&s, body, -1, NULL) < 0) {
        Py_DECREF(body);
        Py_DECREF(y);
        goto done;
    }
    goto yielded;

    for (;;) {
        Frame *top = &s.f[s.depth - 1];
        if (pending != NULL) {
            /* a child's error, or a bad yield: thrown in at the yield */
            PyObject *e = pending;
            pending = NULL;
            rc = throw_into(top->gen, e, &y);
            Py_DECREF(e);
            goto stepped;
        }
        if (top->next < top->n) {
            Py_ssize_t pos = top->next++;
            if (pos >= PySequence_Fast_GET_SIZE(top->leaves) ||
                !IS_CALL(PySequence_Fast_GET_ITEM(top->leaves, pos))) {
                /* a body changed a yielded list while its calls ran */
                pending = PyObject_CallFunction(
                    PyExc_RuntimeError, "s", "a yielded list changed while its calls ran");
                if (pending == NULL)
                    goto error;
                abandon(top);
                continue;
            }
            CCallObject *leaf = (CCallObject *)PySequence_Fast_GET_ITEM(top->leaves, pos);
            if (leaf->inline_ == NULL) {
                if (leaf->error != NULL) { /* it raised before: raised again here */
                    pending = Py_NewRef(leaf->error);
                    abandon(top);
                    continue;
                }
                /* computed before (check_yield let nothing else through) */
                PyList_SET_ITEM(top->results, pos, Py_NewRef(leaf->value));
                continue;
            }
            /* held from here on: Python code that runs (a callback, its body)
             * may drop it from the list */
            held = (CCallObject *)Py_NewRef(leaf);
            if (self->idle != NULL) {
                /* as the pure loop reads Idle.n before each call */
                PyObject *nobj = PyObject_GetAttr(self->idle, STR_N);
                if (nobj == NULL)
                    goto error;
                Py_ssize_t n = PyLong_AsSsize_t(nobj);
                Py_DECREF(nobj);
                if (n == -1 && PyErr_Occurred())
                    goto error;
                if (n > 0) {
                    PyErr_SetString(PyExc_NotImplementedError,
                                    "idle threads elsewhere: handing calls out (stealing) is "
                                    "not in the prototype");
                    goto error;
                }
            }
            if (self->stop)
                goto stopped;
            if (--countdown == 0) {
                countdown = self->check_every;
                if (run_n) {
                    if (count(self, run_fn, 0, run_n) < 0)
                        goto error;
                    run_n = 0;
                }
                if (self->cancelled != NULL) {
                    PyObject *c = PyObject_CallNoArgs(self->cancelled);
                    if (c == NULL)
                        goto error;
                    int truth = PyObject_IsTrue(c);
                    Py_DECREF(c);
                    if (truth < 0)
                        goto error;
                    if (truth)
                        goto stopped;
                }
            }
            CFunctionObject *fn = leaf->fn;
            if (fn == run_fn) {
                run_n++;
            } else {
                if (run_n && count(self, run_fn, 0, run_n) < 0)
                    goto error;
                Py_XINCREF(fn);
                Py_XSETREF(run_fn, fn);
                run_n = 1;
            }
            PyObject *out = leaf->kwargs
                ? PyObject_Call(leaf->inline_, leaf->args, leaf->kwargs)
                : PyObject_Vectorcall(leaf->inline_, &PyTuple_GET_ITEM(leaf->args, 0),
                                      PyTuple_GET_SIZE(leaf->args), NULL);
            if (out == NULL) {
                pending = fetch_error();
                fail(leaf, pending);
                int c = count(self, fn, 1, 1);
                Py_CLEAR(held);
                if (c < 0)
                    goto error;
                abandon(top);
                continue;
            }
            if (!PyGen_CheckExact(out)) {
                deliver(leaf, out);
                Py_CLEAR(held);
                PyList_SET_ITEM(top->results, pos, out);
                continue;
            }
            /* its first step, here */
            rc = PyIter_Send(out, Py_None, &y);
            if (rc == PYGEN_RETURN) {
                Py_DECREF(out);
                deliver(leaf, y);
                Py_CLEAR(held);
                PyList_SET_ITEM(top->results, pos, y);
                continue;
            }
            if (rc == PYGEN_ERROR) {
                Py_DECREF(out);
                pending = fetch_error();
                fail(leaf, pending);
                int c = count(self, fn, 1, 1);
                Py_CLEAR(held);
                if (c < 0)
                    goto error;
                abandon(top);
                continue;
            }
            int pushed = push(&s, out, pos, leaf);
            Py_CLEAR(held);
            if (pushed < 0) {
                Py_DECREF(out);
                Py_DECREF(y);
                goto error;
            }
            goto yielded;
        }
        /* top's yield is done: resume it with the values */
        {
            PyObject *value = top->results;
            if (PyTuple_CheckExact(top->leaves)) {
                value = PyList_AsTuple(top->results);
                if (value == NULL)
                    goto error;
            } else {
                Py_INCREF(value);
            }
            abandon(top);
            rc = PyIter_Send(top->gen, value, &y);
            Py_DECREF(value);
        }
    stepped:
        top = &s.f[s.depth - 1];
        if (rc == PYGEN_NEXT)
            goto yielded;
        if (rc == PYGEN_RETURN) {
            Py_ssize_t at = top->at;
            if (s.depth > 1)
                deliver(top->call, y);
            pop(&s);
            if (!s.depth) {
                result = y;
                goto done;
            }
            top = &s.f[s.depth - 1];
            PyList_SET_ITEM(top->results, at, y);
            continue;
        }
        /* the body raised */
        {
            pending = fetch_error();
            if (s.depth == 1) {
                pop(&s);
                PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(pending)), pending,
                              PyException_GetTraceback(pending));
                pending = NULL;
                goto done;
            }
            fail(top->call, pending);
            int c = count(self, top->call->fn, 1, 1);
            pop(&s);
            if (c < 0)
                goto error;
            top = &s.f[s.depth - 1];
            abandon(top);
            continue;
        }
    yielded:
        /* top yielded y */
        top = &s.f[s.depth - 1];
        pending = check_yield(y);
        if (pending != NULL) {
            Py_DECREF(y);
            continue;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(y);
            goto error;
        }
        if (ANN_VAR != NULL) {
            /* a yield under dask.annotate other than the run's own: every
             * leaf a task (Trampoline.annotated) */
            PyObject *now;
            if (PyContextVar_Get(ANN_VAR, NULL, &now) < 0) {
                Py_DECREF(y);
                goto error;
            }
            if (now != NULL && now != own) {
                int annotated = PyObject_IsTrue(now);
                if (annotated > 0 && own != NULL)
                    annotated = !PyObject_RichCompareBool(now, own, Py_EQ);
                Py_DECREF(now);
                if (annotated < 0) {
                    Py_DECREF(y);
                    goto error;
                }
                if (annotated) {
                    Py_DECREF(y);
                    pending = PyObject_CallFunction(
                        PyExc_TypeError, "s",
                        "a yield under dask.annotate makes every leaf a task: needs a "
                        "cluster, not in the prototype");
                    if (pending == NULL)
                        goto error;
                    continue;
                }
            } else {
                Py_XDECREF(now);
            }
        }
        if (set_yield(top, y) < 0)
            goto error;
    }

stopped:
    Py_CLEAR(held);
    close_all(&s);
    result = Py_NewRef(STOPPED);
    goto done;
error:
    Py_CLEAR(held);
    Py_CLEAR(pending);
    {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        close_all(&s);
        PyErr_Restore(t, v, tb);
    }
    result = NULL;
done:
    if (run_n) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        if (count(self, run_fn, 0, run_n) < 0)
            PyErr_WriteUnraisable((PyObject *)self);
        PyErr_Restore(t, v, tb);
    }
    Py_XDECREF(run_fn);
    CURRENT_OWN = outer_own;
    Py_XDECREF(own);
    while (s.depth)
        pop(&s);
    PyMem_Free(s.f);
    return result;
}

static PyMethodDef tramp_methods[] = {
    {"run", (PyCFunction)tramp_run, METH_O, "run(call): the call's value, run inline"},
    {NULL},
};

static PyMemberDef tramp_members[] = {
    {"stop", T_BOOL, offsetof(TrampolineObject, stop), 0, NULL},
    {"check_every", T_INT, offsetof(TrampolineObject, check_every), READONLY, NULL},
    {"calls", T_OBJECT, offsetof(TrampolineObject, calls), READONLY, NULL},
    {"idle", T_OBJECT, offsetof(TrampolineObject, idle), READONLY, NULL},
    {NULL},
};

static PyTypeObject Trampoline_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_ccall.Trampoline",
    .tp_basicsize = sizeof(TrampolineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tramp_init,
    .tp_traverse = (traverseproc)tramp_traverse,
    .tp_clear = (inquiry)tramp_clear,
    .tp_dealloc = (destructor)tramp_dealloc,
    .tp_methods = tramp_methods,
    .tp_members = tramp_members,
};

/* -- module -------------------------------------------------------------- */

static PyObject *
set_annotations_var(PyObject *m, PyObject *var)
{
    if (var != Py_None && !PyContextVar_CheckExact(var)) {
        PyErr_Format(PyExc_TypeError, "expected a ContextVar or None, got %R", var);
        return NULL;
    }
    Py_XSETREF(ANN_VAR, var == Py_None ? NULL : Py_NewRef(var));
    Py_RETURN_NONE;
}

static PyMemberDef dcall_members[] = {
    {"fn", T_OBJECT, offsetof(CCallObject, fn), READONLY, NULL},
    {"args", T_OBJECT, offsetof(CCallObject, args), READONLY, NULL},
    {"kwargs", T_OBJECT, offsetof(CCallObject, kwargs), READONLY, NULL},
    {"value", T_OBJECT, offsetof(CCallObject, value), READONLY, NULL},
    {"error", T_OBJECT, offsetof(CCallObject, error), READONLY, NULL},
    {"key_name", T_OBJECT, offsetof(CCallObject, name), READONLY, NULL},
    {NULL},
};

/* make_delayed_type(Delayed): DelayedCCall, the call type as a subclass of
 * dask.delayed.Delayed, so isinstance(call, Delayed) holds and an unknown
 * attribute goes to Delayed.__getattr__ (tp_getattro inherited), while the
 * loop reads the C fields directly. The prototype builds no key or graph:
 * what the pure CoroutineCall._build does when asked is left out. */
static PyObject *
make_delayed_type(PyObject *m, PyObject *base)
{
    if (!PyType_Check(base)) {
        PyErr_Format(PyExc_TypeError, "expected dask.delayed.Delayed, got %R", base);
        return NULL;
    }
    PyTypeObject *b = (PyTypeObject *)base;
    if (b->tp_basicsize != (Py_ssize_t)offsetof(CCallObject, fn) ||
        b->tp_weaklistoffset != (Py_ssize_t)offsetof(CCallObject, weakref) ||
        b->tp_dictoffset != 0) {
        PyErr_Format(PyExc_TypeError,
                     "%R's layout is not the one this prototype was written for "
                     "(basicsize %zd, weaklistoffset %zd)",
                     base, b->tp_basicsize, b->tp_weaklistoffset);
        return NULL;
    }
    if (DCALL_TYPE != NULL)
        return Py_NewRef((PyObject *)DCALL_TYPE);
    PyType_Slot slots[] = {
        {Py_tp_traverse, ccall_traverse},
        {Py_tp_clear, ccall_clear},
        {Py_tp_dealloc, dcall_dealloc},
        {Py_tp_repr, ccall_repr},
        {Py_tp_getset, ccall_getset},
        {Py_tp_members, dcall_members},
        {0, NULL},
    };
    PyType_Spec spec = {
        "_ccall.DelayedCCall", sizeof(CCallObject), 0,
        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots,
    };
    PyObject *t = PyType_FromSpecWithBases(&spec, base);
    if (t == NULL)
        return NULL;
    DCALL_TYPE = (PyTypeObject *)t;  /* kept for the module's life */
    return Py_NewRef(t);
}

static PyMethodDef module_methods[] = {
    {"make_delayed_type", make_delayed_type, METH_O,
     "make_delayed_type(Delayed): the call type as a Delayed subclass, for delayed=True"},
    {"set_annotations_var", set_annotations_var, METH_O,
     "set_annotations_var(var): a call made while var holds a non-empty value is not inline"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ccall", NULL, -1, module_methods,
};

PyMODINIT_FUNC
PyInit__ccall(void)
{
    if (PyType_Ready(&CFunction_Type) < 0 || PyType_Ready(&CCall_Type) < 0 ||
        PyType_Ready(&Trampoline_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    NOT_DONE = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    STOPPED = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    STR_THROW = PyUnicode_InternFromString("throw");
    STR_CLOSE = PyUnicode_InternFromString("close");
    STR_KEYNAME = PyUnicode_InternFromString("dask_key_name");
    STR_N = PyUnicode_InternFromString("n");
    if (!NOT_DONE || !STOPPED || !STR_THROW || !STR_CLOSE || !STR_KEYNAME || !STR_N)
        return NULL;
    if (PyModule_AddObjectRef(m, "coroutine", (PyObject *)&CFunction_Type) < 0 ||
        PyModule_AddObjectRef(m, "CCall", (PyObject *)&CCall_Type) < 0 ||
        PyModule_AddObjectRef(m, "Trampoline", (PyObject *)&Trampoline_Type) < 0 ||
        PyModule_AddObjectRef(m, "NOT_DONE", NOT_DONE) < 0 ||
        PyModule_AddObjectRef(m, "STOPPED", STOPPED) < 0)
        return NULL;
    return m;
}
