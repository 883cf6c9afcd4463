/* Samples copied out of a memory-mapped shard, surviving the shard being truncated.
 *
 * members(map, base, member_ints, first, count, ext_names) -> list[(str, bytes)] | None
 *
 *   map          the shard's mmap (any buffer)
 *   base         the sample's start offset in the shard
 *   member_ints  the shard's member rows, flat int64: (span_offset, size, ext_code) each
 *   first, count the sample's rows
 *   ext_names    tuple of str, indexed by ext_code
 *
 *   Returns each member's (extension, bytes), or None if a page of the map could not be
 *   read because the file shrank under the map. Reading such a page raises SIGBUS,
 *   which would kill the process; a handler installed by install() turns it into a
 *   jump out of the copy. Bounds are checked against the map's length, so any other
 *   SIGBUS is not ours: it goes to the handler that was there before (Python's
 *   faulthandler, say), or to the default action.
 *
 * install() -> None: (re)installs the handler if another one replaced it; called
 * whenever a shard is mapped.
 *
 * The caller still compares the file's size with the sample's end first (an fstat):
 * a truncation inside a page shows zeros past the new end, not a SIGBUS. The guard
 * closes the race between that check and the copy. Copying each member straight out
 * of the map also saves the copy of the whole span and the slices of it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

/* volatile: the compiler must not drop or move the stores around the copies, which
   do not read it themselves. */
static _Thread_local sigjmp_buf *volatile guard = NULL;
static struct sigaction previous;
static int installed = 0;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    if (guard != NULL)
        siglongjmp(*guard, 1); /* SA_NODEFER: the signal is not blocked after the jump */
    /* Not a guarded copy: what would have happened without us. */
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction != NULL) {
        previous.sa_sigaction(sig, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        signal(SIGBUS, SIG_DFL); /* the faulting access runs again and is fatal */
    }
}

static int ensure_handler(void)
{
    struct sigaction current, ours;
    if (sigaction(SIGBUS, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)
        return 0;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGBUS, &ours, &previous) != 0)
        return -1;
    installed = 1;
    return 0;
}

static PyObject *install(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    if (ensure_handler() != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* Copy the pieces; 0 on success, 1 if SIGBUS interrupted it. Kept apart, and not
   inlined, so that nothing the caller holds lives across the jump. */
static __attribute__((noinline)) int guarded_copy(char **targets, const char **sources,
                                                  const Py_ssize_t *sizes, Py_ssize_t n)
{
    sigjmp_buf jump;
    Py_ssize_t i;
    if (sigsetjmp(jump, 0) != 0) {
        guard = NULL;
        return 1;
    }
    guard = &jump;
    __asm__ __volatile__("" ::: "memory");
    for (i = 0; i < n; i++)
        memcpy(targets[i], sources[i], (size_t)sizes[i]);
    __asm__ __volatile__("" ::: "memory");
    guard = NULL;
    return 0;
}

#define MAX_MEMBERS 64

static PyObject *members(PyObject *self, PyObject *args)
{
    Py_buffer map, rows;
    long long base;
    Py_ssize_t first, count, n_rows, i;
    PyObject *ext_names, *result = NULL;
    char *targets[MAX_MEMBERS];
    const char *sources[MAX_MEMBERS];
    Py_ssize_t sizes[MAX_MEMBERS];
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ly*nnO!:members", &map, &base, &rows, &first, &count,
                          &PyTuple_Type, &ext_names))
        return NULL;
    n_rows = rows.len / (Py_ssize_t)(3 * sizeof(int64_t));
    if (count > MAX_MEMBERS) { /* the caller's Python path handles such samples */
        PyErr_Format(PyExc_ValueError, "a sample of %zd members is more than %d", count,
                     MAX_MEMBERS);
        goto done;
    }
    if (first < 0 || count < 0 || first + count > n_rows) {
        PyErr_SetString(PyExc_IndexError, "member rows out of range");
        goto done;
    }
    if (!installed && ensure_handler() != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyList_New(count);
    if (!result)
        goto done;
    for (i = 0; i < count; i++) {
        int64_t row[3];
        PyObject *ext, *data, *pair;
        memcpy(row, (const char *)rows.buf + (first + i) * 3 * sizeof(int64_t), sizeof row);
        if (row[1] < 0 || row[2] < 0 || row[2] >= PyTuple_GET_SIZE(ext_names) ||
            base + row[0] < 0 || base + row[0] + row[1] > (int64_t)map.len) {
            PyErr_SetString(PyExc_IndexError, "a member lies outside the mapped shard");
            Py_CLEAR(result);
            goto done;
        }
        data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)row[1]);
        if (!data) {
            Py_CLEAR(result);
            goto done;
        }
        ext = PyTuple_GET_ITEM(ext_names, row[2]);
        pair = PyTuple_Pack(2, ext, data);
        Py_DECREF(data);
        if (!pair) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, pair);
        targets[i] = PyBytes_AS_STRING(data);
        sources[i] = (const char *)map.buf + base + row[0];
        sizes[i] = (Py_ssize_t)row[1];
    }
    if (guarded_copy(targets, sources, sizes, count) != 0) {
        Py_CLEAR(result);
        result = Py_NewRef(Py_None);
    }
done:
    PyBuffer_Release(&map);
    PyBuffer_Release(&rows);
    return result;
}

static PyMethodDef methods[] = {
    {"members", members, METH_VARARGS,
     "members(map, base, member_ints, first, count, ext_names) -> list | None"},
    {"install", install, METH_NOARGS, "install() -> None: (re)install the SIGBUS handler"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mapread",
    "Samples copied out of a memory-mapped shard, surviving its truncation.", -1, methods,
};

PyMODINIT_FUNC PyInit__mapread(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_MEMBERS", MAX_MEMBERS) < 0)
        Py_CLEAR(m);
    return m;
}
