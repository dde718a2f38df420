# cython: language_level=3, boundscheck=False, wraparound=False
"""The call object and the stepping loop typed in Cython, with the semantics
of the C prototype (../ccall): a decorated function
makes a call object (inline only if its arguments are plain values and it has
no ``dask_key_name``); one loop runs a yielded list or tuple of calls inline,
depth first, and resumes the parent with their values; a value is kept on its
call (yielded again, it does not run again); a child's error is kept on its
call and thrown into the parent at its yield (yielded again, it raises
again), the rest of that yield not started; the stop flag is read before
every call and a ``cancelled()`` callback asked every ``check_every`` calls,
after which every open body is closed, innermost first; ``Idle.n`` is read
before every call; the annotations contextvar (``set_annotations_var``) is
read at every call and every yield; calls started and failed are counted per
function.
"""

from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF

cdef extern from "Python.h":
    ctypedef enum PySendResult:
        PYGEN_RETURN
        PYGEN_ERROR
        PYGEN_NEXT
    PySendResult PyIter_Send(object it, object arg, PyObject **presult)
    bint PyGen_CheckExact(object o)
    int PyContextVar_Get(object var, PyObject *default_value, PyObject **value) except -1


cdef inline object _ann():
    """The annotations in effect (the contextvar's value), or None."""
    cdef PyObject *v = NULL
    if ANN_VAR is None:
        return None
    PyContextVar_Get(ANN_VAR, NULL, &v)
    if v == NULL:
        return None
    o = <object>v
    Py_XDECREF(v)
    return o


cdef int _raise() except -1:
    return -1  # the error set by the C API call before propagates


cdef object NOT_DONE = object()
STOPPED = object()
cdef object ANN_VAR = None  # a contextvar, or None: the annotations in effect
cdef object OWN_SEEN = None  # annotations a call found to be its run's own
cdef object CURRENT_OWN = None  # the running run's own annotations


def set_annotations_var(var):
    global ANN_VAR
    ANN_VAR = var

cdef inline bint _plain(object a):
    t = type(a)
    return t is int or t is float or t is str or a is None or t is bool or t is bytes or t is complex


cdef class Call:
    cdef public CoroutineFunction fn
    cdef public tuple args
    cdef public dict kwargs
    cdef public object key_name
    cdef object inline_  # what to call here, or None: not inline, or done
    cdef public object value
    cdef public object error

    @property
    def done(self):
        """``(value,)`` once computed inline, else None (also after an error),
        as the C prototype's."""
        if self.value is NOT_DONE or self.error is not None:
            return None
        return (self.value,)

    @property
    def inline(self):
        """Whether it may run inline here (plain arguments, no key, no
        annotations but the run's own), until it ran."""
        return self.inline_ is not None


cdef class CoroutineFunction:
    cdef public object func
    cdef object inline_
    cdef dict __dict__

    def __init__(self, func, inline=True):
        self.func = func
        self.inline_ = func if inline else None

    @property
    def __name__(self):
        return self.func.__name__

    @property
    def __wrapped__(self):
        return self.func

    # Calls go through _fn_call (set as the type's tp_call below): a def
    # __call__ with **kwargs would make an empty dict on every call.


cdef object _make(CoroutineFunction self, tuple args, object kwargs):
    """A call of ``self``: inline only if its arguments are plain values, it
    has no ``dask_key_name`` and no annotations but the run's own are in effect."""
    cdef Call call = Call.__new__(Call)
    cdef bint plain = self.inline_ is not None
    cdef object a
    if plain:
        for a in args:
            if not _plain(a):
                plain = False
                break
    call.fn = self
    call.args = args
    call.key_name = None
    if kwargs:
        name = kwargs.pop("dask_key_name", None)
        if name is not None:
            call.key_name = name
            plain = False
        if plain:
            for a in kwargs.values():
                if not _plain(a):
                    plain = False
                    break
        call.kwargs = kwargs if kwargs else None
    else:
        call.kwargs = None
    global OWN_SEEN
    if plain and ANN_VAR is not None:
        # as CoroutineFunction.__call__: annotations other than the run's
        # own make the call a task (the run's own looked up once)
        ann = _ann()
        if ann is not None and ann is not OWN_SEEN and ann:
            if CURRENT_OWN is not None and (ann is CURRENT_OWN or ann == CURRENT_OWN):
                OWN_SEEN = ann
            else:
                plain = False
    call.inline_ = self.inline_ if plain else None
    call.value = NOT_DONE
    call.error = None
    return call


cdef extern from "Python.h":
    ctypedef PyObject *(*ternaryfunc)(PyObject *, PyObject *, PyObject *)
    ctypedef struct PyTypeObject:
        ternaryfunc tp_call
    void PyType_Modified(PyTypeObject *t)


cdef PyObject *_fn_call(PyObject *self, PyObject *args, PyObject *kwds) except NULL:
    cdef object r = _make(<CoroutineFunction>self, <tuple>args, None if kwds == NULL else dict(<object>kwds))
    Py_INCREF(r)
    return <PyObject *>r


(<PyTypeObject *>CoroutineFunction).tp_call = <ternaryfunc>_fn_call
PyType_Modified(<PyTypeObject *>CoroutineFunction)


def coroutine(func=None, *, inline=True):
    if func is None:
        return lambda f: CoroutineFunction(f, inline)
    return CoroutineFunction(func, inline)


cdef class Frame:
    cdef object gen
    cdef object leaves  # the yielded list or tuple
    cdef list results
    cdef Py_ssize_t n, next
    cdef bint is_tuple  # resumed with a tuple of the values


cdef inline Frame _frame(object gen):
    cdef Frame f = Frame.__new__(Frame)
    f.gen = gen
    f.leaves = None
    f.results = None
    f.n = f.next = 0
    return f


cdef object _check(object y):
    """None if ``y`` is a list or tuple of calls each of which can run here
    (inline or computed before), else the error to throw in at the yield."""
    cdef Call c
    if type(y) is not list and type(y) is not tuple:
        return TypeError("the prototype runs a yielded list or tuple of calls only")
    for o in y:
        if type(o) is not Call:
            return TypeError("the prototype runs a yielded list or tuple of calls only")
        c = <Call>o
        if c.inline_ is None and c.value is NOT_DONE and c.error is None:
            return TypeError("a call that cannot run inline needs a cluster: not in the prototype")
    return None


cdef inline void _set_yield(Frame f, object y):
    f.leaves = y
    f.is_tuple = type(y) is tuple
    f.n = len(y)
    f.results = [None] * f.n
    f.next = 0


cdef class Trampoline:
    cdef public bint stop
    cdef public dict calls  # function -> [started, failed]
    cdef object cancelled
    cdef public int check_every
    cdef public object idle

    def __init__(self, cancelled=None, check_every=256, idle=None):
        if cancelled is not None and not callable(cancelled):
            raise TypeError("cancelled must be callable")
        if check_every < 1:
            raise ValueError("check_every must be >= 1")
        self.stop = False
        self.calls = {}
        self.cancelled = cancelled
        self.check_every = check_every
        self.idle = idle

    cdef void _count(self, CoroutineFunction fn, Py_ssize_t started, Py_ssize_t failed):
        counts = self.calls.get(fn)
        if counts is None:
            self.calls[fn] = [started, failed]
        else:
            counts[0] += started
            counts[1] += failed

    cdef void _close(self, list stack, Py_ssize_t depth, CoroutineFunction run_fn, Py_ssize_t run_n):
        cdef Frame f
        while depth:
            depth -= 1
            f = <Frame>stack[depth]
            f.gen.close()
            f.gen = f.leaves = f.results = None
        if run_fn is not None:
            self._count(run_fn, run_n, 0)

    def run(self, root):
        global CURRENT_OWN
        own, outer = (ANN_VAR.get(None) if ANN_VAR is not None else None), CURRENT_OWN
        CURRENT_OWN = own
        try:
            return self._run(root, own)
        finally:
            CURRENT_OWN = outer

    def _run(self, root, own):
        if type(root) is not Call:
            raise TypeError(f"run() takes a call of a cycall.coroutine, got {root!r}")
        cdef Call r = <Call>root
        if r.value is not NOT_DONE or r.error is not None:
            raise TypeError("the root call ran before")
        body = r.fn.func(*r.args, **r.kwargs) if r.kwargs else r.fn.func(*r.args)
        if not PyGen_CheckExact(body):
            return body
        cdef PyObject *res = NULL
        cdef PySendResult rc
        cdef object y = None, pending = None, err = None
        cdef list stack = []
        cdef Frame top
        cdef Call leaf
        cdef CoroutineFunction run_fn = None
        cdef Py_ssize_t run_n = 0, pos, depth = 0
        cdef bint fresh = True
        cdef int countdown = self.check_every
        rc = PyIter_Send(body, None, &res)
        if rc == PYGEN_ERROR:
            _raise()
        y = <object>res
        Py_XDECREF(res)
        if rc == PYGEN_RETURN:
            return y
        # frames are reused by depth: a frame is made once per depth reached
        top = _frame(body)
        stack.append(top)
        depth = 1
        while True:
            if fresh:
                # the top body yielded y: its calls run, or it is thrown an error
                pending = _check(y)
                if pending is None and ANN_VAR is not None:
                    # a yield under dask.annotate other than the run's own: every leaf a task
                    now = _ann()
                    if now is not None and now is not own and now and (own is None or now != own):
                        pending = TypeError("a yield under dask.annotate makes every leaf a task: needs a "
                                            "cluster, not in the prototype")
                if pending is None:
                    _set_yield(top, y)
                y = None
                fresh = False
            if pending is None and top.next < top.n:
                pos = top.next
                top.next += 1
                if pos >= len(top.leaves) or type(top.leaves[pos]) is not Call:
                    # a body changed a yielded list while its calls ran
                    pending = RuntimeError("a yielded list changed while its calls ran")
                    top.n = 0
                    continue
                leaf = <Call>top.leaves[pos]
                if leaf.inline_ is None:
                    if leaf.error is not None:  # it raised before: raised again here
                        pending = leaf.error
                        top.n = 0
                    else:
                        top.results[pos] = leaf.value
                    continue
                if self.idle is not None and self.idle.n > 0:
                    self._close(stack, depth, run_fn, run_n)
                    raise NotImplementedError("idle threads elsewhere: handing calls out (stealing) is "
                                              "not in the prototype")
                if self.stop:
                    self._close(stack, depth, run_fn, run_n)
                    return STOPPED
                countdown -= 1
                if countdown == 0:
                    countdown = self.check_every
                    if self.cancelled is not None and self.cancelled():
                        self._close(stack, depth, run_fn, run_n)
                        return STOPPED
                if leaf.fn is not run_fn:
                    if run_fn is not None:
                        self._count(run_fn, run_n, 0)
                    run_fn, run_n = leaf.fn, 0
                run_n += 1
                try:
                    o = leaf.inline_(*leaf.args, **leaf.kwargs) if leaf.kwargs else leaf.inline_(*leaf.args)
                except BaseException as e:
                    leaf.error, leaf.inline_ = e, None
                    self._count(leaf.fn, 0, 1)
                    pending = e
                    top.n = 0
                    continue
                if not PyGen_CheckExact(o):
                    leaf.value, leaf.inline_ = o, None
                    top.results[pos] = o
                    continue
                rc = PyIter_Send(o, None, &res)
                if rc == PYGEN_ERROR:
                    try:
                        _raise()
                    except BaseException as e:
                        leaf.error, leaf.inline_ = e, None
                        self._count(leaf.fn, 0, 1)
                        pending = e
                        top.n = 0
                    fresh = False
                    continue
                y = <object>res
                Py_XDECREF(res)
                if rc == PYGEN_RETURN:
                    leaf.value, leaf.inline_ = y, None
                    top.results[pos] = y
                    y = None
                    fresh = False
                    continue
                if depth == len(stack):
                    top = _frame(o)
                    stack.append(top)
                else:
                    top = <Frame>stack[depth]
                    top.gen = o
                    top.n = top.next = 0
                depth += 1
                fresh = True  # its yield
                continue
            # -- resume the top body: its error thrown in, or its results ----------
            if pending is not None:
                err, pending = pending, None
                try:
                    y = top.gen.throw(err)
                    rc = PYGEN_NEXT
                except StopIteration as stop:
                    y, rc = stop.value, PYGEN_RETURN
                except BaseException as e:
                    err, rc = e, PYGEN_ERROR
            else:
                rc = PyIter_Send(top.gen, tuple(top.results) if top.is_tuple else top.results, &res)
                if rc == PYGEN_ERROR:
                    try:
                        _raise()
                    except BaseException as e:
                        err = e
                else:
                    y = <object>res
                    Py_XDECREF(res)
            if rc == PYGEN_NEXT:
                fresh = True
                continue
            # -- the top body ended: returned y, or raised err -------------------------
            top.gen = top.leaves = top.results = None
            depth -= 1
            if depth == 0:
                if run_fn is not None:
                    self._count(run_fn, run_n, 0)
                if rc == PYGEN_ERROR:
                    raise err
                return y
            top = <Frame>stack[depth - 1]
            leaf = <Call>top.leaves[top.next - 1]
            if rc == PYGEN_ERROR:
                leaf.error, leaf.inline_ = err, None
                self._count(leaf.fn, 0, 1)
                pending, err = err, None
                top.n = 0
            else:
                leaf.value, leaf.inline_ = y, None
                top.results[top.next - 1] = y
                y = None
            fresh = False
