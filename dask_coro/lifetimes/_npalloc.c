/*
 * A NumPy data allocator (NEP 49) that places an array of a stream item's
 * size in a shared-memory segment its producer was given back, so that the
 * item's emit hands the segment over instead of copying the array into one
 * (lifetimes/shm.py, "Arrays made in a segment").
 *
 * Optional: without it (no compiler, or a NumPy without NEP 49) every item
 * is copied, as before. It is installed in a stream producer body's context
 * only (NumPy keeps the current handler in a context variable), and serves
 * only sizes equal to a slot it was given ("armed"); everything else goes
 * to NumPy's default handler. An array remembers its handler, so its free
 * comes here from any thread or context.
 *
 * A slot: FREE (armed, nothing in it), USED (an array of the producer's
 * lives in it), HANDED (that array was emitted and nothing but the item
 * held it: the segment is the item's now, and the array's free empties the
 * slot, never making it FREE for another array). Python owns every mapping;
 * this file never maps nor unmaps one.
 *
 * The NumPy structures below are NEP 49's, version 1 (numpy/ndarraytypes.h):
 * declared here so the build needs no NumPy headers. In NumPy's API table
 * (numpy/__multiarray_api.h, NumPy 1.22 on) PyDataMem_SetHandler is entry
 * 304 and PyDataMem_DefaultHandler 306; Python checks the handler's name
 * after installing it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} DataAllocator;

typedef struct {
    char name[127];
    uint8_t version;
    DataAllocator allocator;
} DataHandler;

enum { EMPTY = 0, FREE = 1, USED = 2, HANDED = 3 };

#define SLOTS 128

typedef struct {
    char *addr;
    size_t size;
    int state;
} Slot;

static Slot slots[SLOTS];
static int active; /* slots not EMPTY */
static unsigned long long served;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* NumPy's default handler: what serves every array no slot does (NumPy's
 * own cache of small blocks, and huge pages for large ones, stay as they
 * are). Set by the first install. */
static DataAllocator base;

static int find(const void *ptr) {
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].state != EMPTY && slots[i].addr == ptr) return i;
    }
    return -1;
}

static void *s_malloc(void *ctx, size_t size) {
    (void)ctx;
    if (active) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < SLOTS; i++) {
            if (slots[i].state == FREE && slots[i].size == size) {
                slots[i].state = USED;
                served++;
                pthread_mutex_unlock(&lock);
                return slots[i].addr;
            }
        }
        pthread_mutex_unlock(&lock);
    }
    return base.malloc(base.ctx, size);
}

static void *s_calloc(void *ctx, size_t nelem, size_t elsize) {
    (void)ctx;
    return base.calloc(base.ctx, nelem, elsize);
}

/* True if ``ptr`` was a slot's (now FREE, or emptied if it was HANDED). */
static int s_release(void *ptr) {
    int found = 0;
    if (active) {
        pthread_mutex_lock(&lock);
        int i = find(ptr);
        if (i >= 0) {
            found = 1;
            if (slots[i].state == USED) {
                slots[i].state = FREE;
            } else if (slots[i].state == HANDED) {
                slots[i].state = EMPTY;
                active--;
            }
        }
        pthread_mutex_unlock(&lock);
    }
    return found;
}

static void s_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (ptr != NULL && s_release(ptr)) return;
    base.free(base.ctx, ptr, size);
}

static void *s_realloc(void *ctx, void *ptr, size_t new_size) {
    (void)ctx;
    size_t old = 0;
    if (ptr != NULL && active) {
        pthread_mutex_lock(&lock);
        int i = find(ptr);
        if (i >= 0) old = slots[i].size;
        pthread_mutex_unlock(&lock);
    }
    if (old == 0) return base.realloc(base.ctx, ptr, new_size);
    void *out = base.malloc(base.ctx, new_size);
    if (out == NULL) return NULL;
    memcpy(out, ptr, old < new_size ? old : new_size);
    s_release(ptr);
    return out;
}

static DataHandler handler = {
    "dask_coro_shm",
    1,
    {NULL, s_malloc, s_calloc, s_realloc, s_free},
};

static PyObject *capsule; /* the handler, for PyDataMem_SetHandler */
static PyObject *(*set_handler)(PyObject *);

/* install(array_api): NumPy's ``_ARRAY_API`` capsule; makes this handler
 * the current context's, and returns the one it replaces. */
static PyObject *install(PyObject *self, PyObject *api) {
    (void)self;
    if (set_handler == NULL) {
        void **table = PyCapsule_GetPointer(api, NULL);
        if (table == NULL) return NULL;
        PyObject *numpy_default = *(PyObject **)table[306]; /* PyDataMem_DefaultHandler */
        DataHandler *h = PyCapsule_GetPointer(numpy_default, "mem_handler");
        if (h == NULL) return NULL;
        if (h->version != 1) {
            PyErr_Format(PyExc_RuntimeError, "NumPy's memory handler is of version %d, not 1", (int)h->version);
            return NULL;
        }
        base = h->allocator;
        set_handler = (PyObject * (*)(PyObject *)) table[304];
    }
    return set_handler(capsule);
}

static PyObject *arm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long addr;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "Kn", &addr, &size)) return NULL;
    pthread_mutex_lock(&lock);
    int i = find((void *)(uintptr_t)addr);
    if (i < 0) {
        for (i = 0; i < SLOTS && slots[i].state != EMPTY; i++) {
        }
    } else if (slots[i].state != FREE) {
        i = -2;
    }
    if (i >= 0 && i < SLOTS) {
        if (slots[i].state == EMPTY) active++;
        slots[i].addr = (char *)(uintptr_t)addr;
        slots[i].size = (size_t)size;
        slots[i].state = FREE;
    }
    pthread_mutex_unlock(&lock);
    return PyBool_FromLong(i >= 0 && i < SLOTS);
}

/* The slot of ``arg``'s address moved to ``to[state]`` (-1: stays), as one
 * step under the lock; its state before (EMPTY: no such slot). */
static PyObject *move(PyObject *arg, const int to[4]) {
    unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&lock);
    int i = find((void *)(uintptr_t)addr);
    int s = i < 0 ? EMPTY : slots[i].state;
    if (i >= 0 && to[s] >= 0 && to[s] != s) {
        if (to[s] == EMPTY) active--;
        slots[i].state = to[s];
    }
    pthread_mutex_unlock(&lock);
    return PyLong_FromLong(s);
}

/* state(addr): the slot's state. */
static PyObject *state(PyObject *self, PyObject *arg) {
    (void)self;
    static const int to[4] = {-1, -1, -1, -1};
    return move(arg, to);
}

/* disarm(addr): a FREE slot emptied. Its state before. */
static PyObject *disarm(PyObject *self, PyObject *arg) {
    (void)self;
    static const int to[4] = {-1, EMPTY, -1, -1};
    return move(arg, to);
}

/* hand(addr): a USED slot is the item's now: HANDED. Its state before. */
static PyObject *hand(PyObject *self, PyObject *arg) {
    (void)self;
    static const int to[4] = {-1, -1, HANDED, -1};
    return move(arg, to);
}

/* retire(addr): a slot no pool will hand over any more: emptied if FREE,
 * else (USED) marked HANDED, so its array's free empties it, never making
 * it FREE for another array (Python keeps the mapping until then). Its
 * state before. */
static PyObject *retire(PyObject *self, PyObject *arg) {
    (void)self;
    static const int to[4] = {-1, EMPTY, HANDED, -1};
    return move(arg, to);
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    pthread_mutex_lock(&lock);
    unsigned long long n = served;
    int a = active;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("Ki", n, a);
}

static PyMethodDef methods[] = {
    {"install", install, METH_O, "Make this handler the current context's (NumPy's _ARRAY_API capsule); the old one."},
    {"arm", arm, METH_VARARGS, "arm(addr, size): a FREE slot at addr; False if none is left or it is in use."},
    {"state", state, METH_O, "state(addr): the slot's state (0 none, 1 free, 2 used, 3 handed)."},
    {"disarm", disarm, METH_O, "disarm(addr): a FREE slot emptied; its state before."},
    {"hand", hand, METH_O, "hand(addr): a USED slot made HANDED (the item's); its state before."},
    {"retire", retire, METH_O, "retire(addr): FREE emptied, USED made HANDED; its state before."},
    {"stats", stats, METH_NOARGS, "(arrays served from slots, slots not empty)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_npalloc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__npalloc(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    capsule = PyCapsule_New(&handler, "mem_handler", NULL);
    if (capsule == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "EMPTY", EMPTY) || PyModule_AddIntConstant(m, "FREE", FREE) ||
        PyModule_AddIntConstant(m, "USED", USED) || PyModule_AddIntConstant(m, "HANDED", HANDED) ||
        PyModule_AddObjectRef(m, "handler", capsule)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
