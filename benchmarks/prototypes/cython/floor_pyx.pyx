# cython: language_level=3, boundscheck=False, wraparound=False
"""The least generator trampoline (profile_fib's ``_floor_run``: calls as
``(func, args)`` tuples, no call objects, no counting, no cancellation)
typed in Cython: a stack of cdef ``Frame`` objects, bodies resumed with
``PyIter_Send`` (no ``StopIteration`` made), the bodies plain Python
generators as a user writes them. The best case for a ``.pyx`` engine."""
from cpython.ref cimport PyObject, Py_XDECREF

cdef extern from "Python.h":
    ctypedef enum PySendResult:
        PYGEN_RETURN
        PYGEN_ERROR
        PYGEN_NEXT
    PySendResult PyIter_Send(object it, object arg, PyObject **presult)
    bint PyGen_CheckExact(object o)

cdef int _raise() except -1:
    return -1  # the error PyIter_Send set propagates

cdef class Frame:
    cdef object gen
    cdef list leaves
    cdef list results
    cdef Py_ssize_t i

cdef inline Frame _frame(object gen, object leaves):
    cdef Frame f = Frame.__new__(Frame)
    f.gen = gen
    f.leaves = <list>leaves
    f.results = []
    f.i = 0
    return f

def floor_run(func, tuple args):
    """The floor loop typed: PyIter_Send, a stack of cdef Frames."""
    cdef PyObject *res = NULL
    cdef PySendResult rc
    cdef object out = func(*args)
    cdef object y, o, v
    cdef tuple leaf
    cdef Frame top
    cdef list stack
    if not PyGen_CheckExact(out):
        return out
    rc = PyIter_Send(out, None, &res)
    if rc == PYGEN_ERROR:
        _raise()
    y = <object>res
    Py_XDECREF(res)
    if rc == PYGEN_RETURN:
        return y
    top = _frame(out, y)
    stack = [top]
    while True:
        if top.i < len(top.leaves):
            leaf = <tuple>top.leaves[top.i]
            top.i += 1
            o = (<object>leaf[0])(*<tuple>leaf[1])
            if PyGen_CheckExact(o):
                rc = PyIter_Send(o, None, &res)
                if rc == PYGEN_ERROR:
                    _raise()
                y = <object>res
                Py_XDECREF(res)
                if rc == PYGEN_RETURN:
                    top.results.append(y)
                    continue
                top = _frame(o, y)
                stack.append(top)
                continue
            top.results.append(o)
            continue
        rc = PyIter_Send(top.gen, top.results, &res)
        if rc == PYGEN_ERROR:
            _raise()
        y = <object>res
        Py_XDECREF(res)
        if rc == PYGEN_RETURN:
            stack.pop()
            if not stack:
                return y
            top = <Frame>stack[len(stack) - 1]
            top.results.append(y)
            continue
        top.leaves = <list>y
        top.results = []
        top.i = 0
