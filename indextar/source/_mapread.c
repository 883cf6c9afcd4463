/* Samples copied out of a memory-mapped shard, surviving the shard being truncated.
 *
 * members(map, base, member_ints, first, count, ext_names[, key[, fd, ino, size, mtime_ns]])
 *     -> list[(str, bytes)] | None | int
 *
 *   map          the shard's mmap (any buffer)
 *   base         the sample's start offset in the shard
 *   member_ints  the shard's member rows, flat int64: (span_offset, size, ext_code) each
 *   first, count the sample's rows
 *   ext_names    tuple of str, indexed by ext_code
 *   key          the sample's key as raw bytes, or None: the span's headers (the bytes
 *                before the first member's data) are checked as spancheck.py checks
 *                them, valid checksums and a member name that is ``key`` + ``.``
 *   fd, ino, size, mtime_ns
 *                an open descriptor of the mapped file and what it was when mapped:
 *                fstat() must still say so (fd -1: not checked)
 *
 *   Returns each member's (extension, bytes); an int if a check failed (1: the file's
 *   fstat changed, 2: a header's checksum is wrong, 3: the name is not the key's),
 *   which the caller turns into an error that says what changed; or None if a page of
 *   the map could not be read because the file shrank under the map. Reading such a page raises SIGBUS,
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
#include <sys/stat.h>

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
/* Headers before a sample's first data: one block, a few with a long name or PAX
   records. Longer runs are checked as far as this reaches. */
#define MAX_HEADERS 8192
/* The largest member size a header may claim: tar/blocks.py MAX_MEMBER_SIZE, which the
   scan and the stream read by (a test checks the two are equal). */
#define MAX_MEMBER_SIZE (1LL << 62)

static int checksum_ok(const unsigned char *block)
{
    long long stored = 0, unsigned_sum = 0, signed_sum = 0;
    int i;
    for (i = 148; i < 156 && block[i] == ' '; i++)
        ;
    for (; i < 156 && block[i] >= '0' && block[i] <= '7'; i++)
        stored = stored * 8 + (block[i] - '0');
    for (; i < 156 && block[i] != 0; i++) /* after the first NUL anything goes */
        if (block[i] != ' ')
            return 0;
    /* The field counts as eight spaces. A plain loop the compiler vectorises. */
    for (i = 0; i < 512; i++)
        unsigned_sum += block[i];
    for (i = 148; i < 156; i++)
        unsigned_sum -= block[i];
    unsigned_sum += 8 * ' ';
    if (stored == unsigned_sum)
        return 1;
    for (i = 0; i < 512; i++) /* old tars summed signed bytes */
        signed_sum += (i >= 148 && i < 156) ? ' ' : (signed char)block[i];
    return stored == signed_sum;
}

/* A header's size field: octal, or base-256 (first byte 0x80); -1 if neither or if it
   is more than MAX_MEMBER_SIZE. */
static long long field_size(const unsigned char *field)
{
    long long value = 0;
    int i = 0;
    if (field[0] == 0x80) {
        for (i = 1; i < 12; i++) {
            if (value > (MAX_MEMBER_SIZE - field[i]) / 256)
                return -1;
            value = value * 256 + field[i];
        }
        return value;
    }
    for (; i < 12 && field[i] == ' '; i++)
        ;
    for (; i < 12 && field[i] >= '0' && field[i] <= '7'; i++)
        value = value * 8 + (field[i] - '0');
    for (; i < 12 && field[i] != 0; i++)
        if (field[i] != ' ')
            return -1;
    return value;
}

/* The value of the PAX record "path=" in records[0..len), the first or the last one;
   NULL if none. */
static const unsigned char *pax_path(const unsigned char *records, Py_ssize_t len, int first,
                                     Py_ssize_t *path_len)
{
    const unsigned char *found = NULL;
    Py_ssize_t at = 0;
    while (at < len && records[at] != 0) {
        Py_ssize_t length = 0, digits = at;
        while (digits < len && records[digits] >= '0' && records[digits] <= '9' &&
               length < (1 << 30))
            length = length * 10 + (records[digits++] - '0');
        if (digits == at || digits >= len || records[digits] != ' ' ||
            length <= digits - at + 1 || at + length > len)
            return found;
        if (length - (digits + 1 - at) >= 6 && memcmp(records + digits + 1, "path=", 5) == 0) {
            *path_len = at + length - 1 - (digits + 6); /* less the trailing newline */
            found = records + digits + 6;
            if (first)
                return found;
        }
        at += length;
    }
    return found;
}

/* 0 if the headers hold valid checksums and end with a member named key + "." (an empty
   key: the checksums only), 2 on a bad checksum or size field, 3 on another name. The
   name is taken as GNU tar takes it, as spancheck.py says. */
static int check_headers(const unsigned char *headers, Py_ssize_t len, const char *key,
                         Py_ssize_t key_len)
{
    const unsigned char *local = NULL, *global = NULL, *long_name = NULL, *name;
    Py_ssize_t local_len = 0, global_len = 0, long_len = 0, name_len, at = 0;
    char joined[256];
    while (at + 512 <= len) {
        const unsigned char *block = headers + at;
        long long size = field_size(block + 124);
        Py_ssize_t data = at + 512, available;
        unsigned char type = block[156];
        if (!checksum_ok(block) || size < 0)
            return 2;
        available = len - data < size ? len - data : (Py_ssize_t)size;
        if (available < 0)
            available = 0;
        if (type == 'x') {
            local = pax_path(headers + data, available, 0, &local_len);
        } else if (type == 'g') {
            global = pax_path(headers + data, available, 1, &global_len);
        } else if (type == 'L') {
            long_name = headers + data;
            long_len = (Py_ssize_t)strnlen((const char *)long_name, (size_t)available);
        } else if (type != 'K') { /* the member's own header */
            if (key_len == 0)
                return 0;
            if (local != NULL) {
                name = local;
                name_len = local_len;
            } else if (global != NULL) {
                name = global;
                name_len = global_len;
            } else if (long_name != NULL) {
                name = long_name;
                name_len = long_len;
            } else {
                Py_ssize_t prefix_len = 0;
                name_len = (Py_ssize_t)strnlen((const char *)block, 100);
                if (block[345] && memcmp(block + 257, "ustar\0" "00", 8) == 0)
                    prefix_len = (Py_ssize_t)strnlen((const char *)block + 345, 155);
                if (prefix_len) {
                    memcpy(joined, block + 345, (size_t)prefix_len);
                    joined[prefix_len] = '/';
                    memcpy(joined + prefix_len + 1, block, (size_t)name_len);
                    name = (const unsigned char *)joined;
                    name_len += prefix_len + 1;
                } else {
                    name = block;
                }
            }
            return name_len > key_len && memcmp(name, key, (size_t)key_len) == 0 &&
                           name[key_len] == '.'
                       ? 0
                       : 3;
        }
        at = data + (Py_ssize_t)((size + 511) / 512 * 512);
    }
    return 0; /* ran past MAX_HEADERS before the member's header: the checksums held */
}

/* Arguments parsed by hand (METH_FASTCALL): this runs once per sample read, and a
   format string over a tuple of 11 cost about 0.15 us of a 3 us ds[i]. */
static PyObject *members(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer map = {0}, rows = {0};
    long long base, ino = 0, size = 0, mtime_ns = 0;
    Py_ssize_t first, count, n_rows, i, header_len = 0;
    int fd = -1, check = 0;
    PyObject *ext_names, *key = Py_None, *result = NULL;
    char *targets[MAX_MEMBERS + 1];
    const char *sources[MAX_MEMBERS + 1];
    Py_ssize_t sizes[MAX_MEMBERS + 1];
    unsigned char headers[MAX_HEADERS];
    (void)self;
    if (nargs < 6 || nargs > 11 || nargs == 8 || nargs == 9 || nargs == 10) {
        PyErr_Format(PyExc_TypeError,
                     "members() takes map, base, member_ints, first, count, ext_names[, key[, "
                     "fd, ino, size, mtime_ns]] (%zd given)",
                     nargs);
        return NULL;
    }
    ext_names = args[5];
    if (!PyTuple_Check(ext_names)) {
        PyErr_SetString(PyExc_TypeError, "ext_names must be a tuple");
        return NULL;
    }
    base = PyLong_AsLongLong(args[1]);
    first = PyLong_AsSsize_t(args[3]);
    count = PyLong_AsSsize_t(args[4]);
    if (nargs > 6)
        key = args[6];
    if (nargs > 7) {
        fd = (int)PyLong_AsLong(args[7]);
        ino = PyLong_AsLongLong(args[8]);
        size = PyLong_AsLongLong(args[9]);
        mtime_ns = PyLong_AsLongLong(args[10]);
    }
    if (PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[0], &map, PyBUF_SIMPLE) != 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &rows, PyBUF_SIMPLE) != 0) {
        PyBuffer_Release(&map);
        return NULL;
    }
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
    if (key != Py_None && !PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be bytes or None");
        goto done;
    }
    if (!installed && ensure_handler() != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        if ((long long)st.st_ino != ino || (long long)st.st_size != size ||
            (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != mtime_ns) {
            result = PyLong_FromLong(1);
            goto done;
        }
    }
    if (key != Py_None && count > 0) {
        int64_t row0;
        memcpy(&row0, (const char *)rows.buf + first * 3 * sizeof(int64_t), sizeof row0);
        header_len = row0 < MAX_HEADERS ? (Py_ssize_t)row0 : MAX_HEADERS;
        if (header_len < 0 || base < 0 || base + header_len > (int64_t)map.len) {
            PyErr_SetString(PyExc_IndexError, "a sample's headers lie outside the mapped shard");
            goto done;
        }
        targets[count] = (char *)headers;
        sources[count] = (const char *)map.buf + base;
        sizes[count] = header_len;
        check = 1;
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
    if (guarded_copy(targets, sources, sizes, count + check) != 0) {
        Py_CLEAR(result);
        result = Py_NewRef(Py_None);
    } else if (check) {
        int failed = check_headers(headers, header_len, PyBytes_AS_STRING(key),
                                   PyBytes_GET_SIZE(key));
        if (failed) {
            Py_CLEAR(result);
            result = PyLong_FromLong(failed);
        }
    }
done:
    PyBuffer_Release(&map);
    PyBuffer_Release(&rows);
    return result;
}

/* first_failing(map, starts, header_lens, keys) -> int: the first sample whose headers
   map[starts[i] : starts[i] + header_lens[i]] fail check_headers with keys[i] (a list of
   bytes), or -1. Index builds run it once over every sample. */
static PyObject *first_failing(PyObject *self, PyObject *args)
{
    Py_buffer map, starts, lens;
    PyObject *keys, *result = NULL;
    Py_ssize_t n, i;
    unsigned char headers[MAX_HEADERS];
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*O!:first_failing", &map, &starts, &lens, &PyList_Type,
                          &keys))
        return NULL;
    n = starts.len / (Py_ssize_t)sizeof(int64_t);
    if (lens.len != starts.len || PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "starts, header_lens and keys differ in length");
        goto done;
    }
    if (!installed && ensure_handler() != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    for (i = 0; i < n; i++) {
        int64_t start, length;
        PyObject *key = PyList_GET_ITEM(keys, i);
        char *target = (char *)headers;
        const char *source;
        Py_ssize_t size;
        memcpy(&start, (const char *)starts.buf + i * sizeof(int64_t), sizeof start);
        memcpy(&length, (const char *)lens.buf + i * sizeof(int64_t), sizeof length);
        if (!PyBytes_Check(key) || start < 0 || length < 0 || start + length > (int64_t)map.len) {
            PyErr_Format(PyExc_ValueError, "sample %zd: bad key or span", i);
            goto done;
        }
        size = length < MAX_HEADERS ? (Py_ssize_t)length : MAX_HEADERS;
        source = (const char *)map.buf + start;
        if (guarded_copy(&target, &source, &size, 1) != 0 ||
            check_headers(headers, size, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) != 0) {
            result = PyLong_FromSsize_t(i);
            goto done;
        }
    }
    result = PyLong_FromLong(-1);
done:
    PyBuffer_Release(&map);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lens);
    return result;
}

static PyMethodDef methods[] = {
    {"members", (PyCFunction)(void (*)(void))members, METH_FASTCALL,
     "members(map, base, member_ints, first, count, ext_names[, key[, fd, ino, size, "
     "mtime_ns]]) -> list | None | int"},
    {"first_failing", first_failing, METH_VARARGS,
     "first_failing(map, starts, header_lens, keys) -> int: the first sample failing the "
     "header check, or -1"},
    {"install", install, METH_NOARGS, "install() -> None: (re)install the SIGBUS handler"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "indextar.source._mapread",
    "Samples copied out of a memory-mapped shard, surviving its truncation.", -1, methods,
};

PyMODINIT_FUNC PyInit__mapread(void)
{
    PyObject *m = PyModule_Create(&module), *max_size = PyLong_FromLongLong(MAX_MEMBER_SIZE);
    if (!max_size || (m && PyModule_AddObjectRef(m, "MAX_MEMBER_SIZE", max_size) < 0))
        Py_CLEAR(m);
    Py_XDECREF(max_size);
    if (m && (PyModule_AddIntConstant(m, "MAX_MEMBERS", MAX_MEMBERS) < 0 ||
              PyModule_AddIntConstant(m, "FILE_CHANGED", 1) < 0 ||
              PyModule_AddIntConstant(m, "BAD_CHECKSUM", 2) < 0 ||
              PyModule_AddIntConstant(m, "OTHER_NAME", 3) < 0))
        Py_CLEAR(m);
    return m;
}
