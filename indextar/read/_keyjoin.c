/* Hash join of two datasets' keys for indextar/read/keyjoin.py.
 *
 * KeyTable(blob, starts, ends): the right keys in a hash table
 *   blob        bytes: every key of the right side, one after another
 *   starts      int64[n]: where each key starts in the blob
 *   ends        int64[n]: where each ends
 *   .duplicate  -1, or the position of a right key that an earlier right key already
 *               has (the caller raises, naming it; the table is then not probed)
 *
 * KeyTable.probe(blob, starts, ends, found) -> None
 *   found       int64[n_left], written: the right position of each left key, or -1
 *
 * A table is built once and probed with the left keys in any number of pieces (a
 * shard's keys each, as they are read), from any threads at once: probing only reads
 * it, and the GIL is released while the loops run. The table holds the right keys'
 * buffers until it is freed.
 *
 * The right keys go into an open-addressing table of a power of two slots, at most
 * two thirds full: each slot one uint64, the high 32 bits of the key's hash and the
 * key's position plus one (0: empty). Every left key is then probed; a slot whose hash
 * bits match is compared byte for byte (memcmp), so the result is exact. Keys go
 * through a pipeline, each step's memory prefetched 16 keys before it is read (their
 * slots, then their right keys' offsets, then those keys' bytes): the table and the
 * right keys are read in random order, and a miss at a time would cost most of it. The hash
 * takes 8 bytes at a time (multiply, xor-shift), as keyjoin.hash_keys does. Memory: 8
 * bytes a slot, 12 to 24 bytes a right key.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MULTIPLY 0x9E3779B97F4A7C15ULL

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int get(PyObject *obj, Buf *buf, int writable)
{
    buf->held = 0;
    if (PyObject_GetBuffer(obj, &buf->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    buf->held = 1;
    return 0;
}

static void release(Buf *buf)
{
    if (buf->held)
        PyBuffer_Release(&buf->view);
    buf->held = 0;
}

static inline uint64_t hash_key(const unsigned char *key, int64_t length)
{
    uint64_t h = (uint64_t)length * MULTIPLY;
    int64_t at = 0;
    for (; at + 8 <= length; at += 8) {
        uint64_t word;
        memcpy(&word, key + at, 8);
        h ^= word;
        h *= MULTIPLY;
        h ^= h >> 29;
    }
    if (at < length) {
        uint64_t word = 0;
        memcpy(&word, key + at, (size_t)(length - at));
        h ^= word;
        h *= MULTIPLY;
        h ^= h >> 29;
    }
    /* a final mix, so that the low bits (the slot) depend on every byte */
    h ^= h >> 32;
    h *= MULTIPLY;
    h ^= h >> 29;
    return h;
}

#define AHEAD 16 /* keys between a prefetch and its read */
#define RING 64  /* a power of two above 3 AHEAD: the keys in flight */

/* Put right key ``r`` in the table; 1 if an equal key is there already. */
static inline int insert(uint64_t *table, uint64_t mask, uint64_t h, int64_t r,
                         const unsigned char *blob, const int64_t *starts, const int64_t *ends)
{
    uint64_t tag = h >> 32;
    int64_t length = ends[r] - starts[r];
    for (uint64_t slot = h & mask;; slot = (slot + 1) & mask) {
        uint64_t entry = table[slot];
        if (entry == 0) {
            table[slot] = (tag << 32) | (uint64_t)(r + 1);
            return 0;
        }
        if ((entry >> 32) == tag) {
            int64_t other = (int64_t)(entry & 0xFFFFFFFFULL) - 1;
            if (ends[other] - starts[other] == length &&
                memcmp(blob + starts[other], blob + starts[r], (size_t)length) == 0)
                return 1;
        }
    }
}

/* The right key of the first slot with ``h``'s hash bits, or -1 (none: no match). */
static inline int64_t first_tagged(const uint64_t *table, uint64_t mask, uint64_t h)
{
    uint64_t tag = h >> 32;
    for (uint64_t slot = h & mask;; slot = (slot + 1) & mask) {
        uint64_t entry = table[slot];
        if (entry == 0)
            return -1;
        if ((entry >> 32) == tag)
            return (int64_t)(entry & 0xFFFFFFFFULL) - 1;
    }
}

/* The right key equal to ``key``, or -1. */
static inline int64_t lookup(const uint64_t *table, uint64_t mask, uint64_t h,
                             const unsigned char *key, int64_t length, const unsigned char *blob,
                             const int64_t *starts, const int64_t *ends)
{
    uint64_t tag = h >> 32;
    for (uint64_t slot = h & mask;; slot = (slot + 1) & mask) {
        uint64_t entry = table[slot];
        if (entry == 0)
            return -1;
        if ((entry >> 32) == tag) {
            int64_t r = (int64_t)(entry & 0xFFFFFFFFULL) - 1;
            if (ends[r] - starts[r] == length && memcmp(blob + starts[r], key, (size_t)length) == 0)
                return r;
        }
    }
}

/* Whether every key of ``n`` lies inside the blob; else a ValueError naming one. */
static int check_keys(const char *side, const Buf *blob, const int64_t *starts, const int64_t *ends,
                      Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (starts[i] < 0 || ends[i] < starts[i] || ends[i] > blob->view.len) {
            PyErr_Format(PyExc_ValueError, "%s key %zd is outside its blob", side, i);
            return -1;
        }
    return 0;
}

typedef struct {
    PyObject_HEAD
    Buf bufs[3]; /* the right keys: blob, starts, ends */
    uint64_t *table;
    size_t table_bytes;
    uint64_t mask;
    int64_t duplicate;
} KeyTable;

static void table_dealloc(KeyTable *self)
{
    if (self->table != NULL)
        munmap(self->table, self->table_bytes);
    for (int i = 0; i < 3; i++)
        release(&self->bufs[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int table_init(KeyTable *self, PyObject *args, PyObject *kwargs)
{
    PyObject *objs[3];
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2]))
        return -1;
    if (self->table != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a KeyTable is built once");
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (get(objs[i], &self->bufs[i], 0) < 0)
            return -1;
    const unsigned char *right_blob = self->bufs[0].view.buf;
    const int64_t *right_starts = self->bufs[1].view.buf, *right_ends = self->bufs[2].view.buf;
    Py_ssize_t n_right = self->bufs[1].view.len / 8;
    if (self->bufs[2].view.len != self->bufs[1].view.len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        return -1;
    }
    if (n_right >= ((Py_ssize_t)1 << 31) - 1) {
        PyErr_SetString(PyExc_ValueError, "too many right keys for the C join");
        return -1;
    }
    if (check_keys("right", &self->bufs[0], right_starts, right_ends, n_right) < 0)
        return -1;
    uint64_t capacity = 16;
    while (capacity < (uint64_t)n_right + (uint64_t)n_right / 2 + 1)
        capacity <<= 1;
    /* zeroed pages of its own, in huge pages where the kernel gives them: a probe is a
     * random access, and with 4 KiB pages most would miss the TLB as well */
    size_t table_bytes = (size_t)capacity * sizeof(uint64_t);
    uint64_t *table = mmap(NULL, table_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED) {
        PyErr_NoMemory();
        return -1;
    }
#ifdef MADV_HUGEPAGE
    madvise(table, table_bytes, MADV_HUGEPAGE);
#endif
    uint64_t mask = capacity - 1;
    int64_t duplicate = -1;
    Py_BEGIN_ALLOW_THREADS
    uint64_t hashes[RING];
    /* key r is hashed (its slot prefetched) AHEAD keys before it is inserted */
    for (int64_t i = 0; i < n_right + AHEAD && duplicate < 0; i++) {
        if (i < n_right) {
            uint64_t h = hash_key(right_blob + right_starts[i], right_ends[i] - right_starts[i]);
            hashes[i & (RING - 1)] = h;
            __builtin_prefetch(&table[h & mask], 1);
        }
        int64_t r = i - AHEAD;
        if (r >= 0 && insert(table, mask, hashes[r & (RING - 1)], r, right_blob, right_starts, right_ends))
            duplicate = r;
    }
    Py_END_ALLOW_THREADS
    self->table = table;
    self->table_bytes = table_bytes;
    self->mask = mask;
    self->duplicate = duplicate;
    return 0;
}

static PyObject *table_probe(KeyTable *self, PyObject *args)
{
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]))
        return NULL;
    if (self->table == NULL || self->duplicate >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "probe of a KeyTable not built, or with a duplicate key");
        return NULL;
    }
    Buf bufs[4];
    for (int i = 0; i < 4; i++)
        bufs[i].held = 0;
    PyObject *result = NULL;
    for (int i = 0; i < 4; i++)
        if (get(objs[i], &bufs[i], i == 3) < 0)
            goto done;
    const unsigned char *left_blob = bufs[0].view.buf;
    const int64_t *left_starts = bufs[1].view.buf, *left_ends = bufs[2].view.buf;
    int64_t *found = bufs[3].view.buf;
    Py_ssize_t n_left = bufs[1].view.len / 8;
    if (bufs[2].view.len != bufs[1].view.len || bufs[3].view.len != bufs[1].view.len) {
        PyErr_SetString(PyExc_ValueError, "starts, ends and found must be int64 arrays of one length");
        goto done;
    }
    if (check_keys("left", &bufs[0], left_starts, left_ends, n_left) < 0)
        goto done;
    const unsigned char *right_blob = self->bufs[0].view.buf;
    const int64_t *right_starts = self->bufs[1].view.buf, *right_ends = self->bufs[2].view.buf;
    const uint64_t *table = self->table;
    uint64_t mask = self->mask;
    Py_BEGIN_ALLOW_THREADS
    uint64_t hashes[RING];
    int64_t candidates[RING];
    /* A pipeline: key l is hashed (its slot prefetched) at step l, its slot read (its
     * right key's offsets prefetched) at step l + AHEAD, those offsets read (the key's
     * bytes prefetched) at l + 2 AHEAD, and compared at l + 3 AHEAD: each read comes
     * AHEAD keys' work after its prefetch. */
    for (int64_t i = 0; i < n_left + 3 * AHEAD; i++) {
        if (i < n_left) {
            uint64_t h = hash_key(left_blob + left_starts[i], left_ends[i] - left_starts[i]);
            hashes[i & (RING - 1)] = h;
            __builtin_prefetch(&table[h & mask], 0);
        }
        int64_t l = i - AHEAD;
        if (l >= 0 && l < n_left) {
            int64_t r = first_tagged(table, mask, hashes[l & (RING - 1)]);
            candidates[l & (RING - 1)] = r;
            if (r >= 0) {
                __builtin_prefetch(&right_starts[r], 0);
                __builtin_prefetch(&right_ends[r], 0);
            }
        }
        l = i - 2 * AHEAD;
        if (l >= 0 && l < n_left && candidates[l & (RING - 1)] >= 0)
            __builtin_prefetch(right_blob + right_starts[candidates[l & (RING - 1)]], 0);
        l = i - 3 * AHEAD;
        if (l >= 0) {
            int64_t r = candidates[l & (RING - 1)];
            const unsigned char *key = left_blob + left_starts[l];
            int64_t length = left_ends[l] - left_starts[l];
            if (r >= 0 && !(right_ends[r] - right_starts[r] == length &&
                            memcmp(right_blob + right_starts[r], key, (size_t)length) == 0))
                r = lookup(table, mask, hashes[l & (RING - 1)], key, length, right_blob,
                           right_starts, right_ends); /* another key with the same hash bits */
            found[l] = r;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 4; i++)
        release(&bufs[i]);
    return result;
}

static PyObject *table_duplicate(KeyTable *self, void *closure)
{
    return PyLong_FromLongLong(self->duplicate);
}

static PyMethodDef table_methods[] = {
    {"probe", (PyCFunction)table_probe, METH_VARARGS,
     "probe(blob, starts, ends, found): each left key's right position (-1: none) into found."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef table_getset[] = {
    {"duplicate", (getter)table_duplicate, NULL, "-1, or a right key that an earlier one has.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "indextar.read._keyjoin.KeyTable",
    .tp_doc = "KeyTable(blob, starts, ends): the right keys of a join, in a hash table.",
    .tp_basicsize = sizeof(KeyTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)table_init,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
    .tp_getset = table_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keyjoin", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__keyjoin(void)
{
    if (PyType_Ready(&KeyTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&KeyTableType);
    if (PyModule_AddObject(m, "KeyTable", (PyObject *)&KeyTableType) < 0) {
        Py_DECREF(&KeyTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
