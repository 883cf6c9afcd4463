/* The keyed Feistel permutation of indextar/order/permutation.py, element by element.
 *
 * permute(values, size, keys) -> None
 *
 *   values  a writable, contiguous buffer of uint64 positions in [0, size); each is
 *           replaced, in place, by its element under the permutation
 *   size    the permutation's size, in [1, 2**62)
 *   keys    a buffer of ROUNDS (6) uint64 round keys
 *
 * permute_grouped(values, group, sizes, keys) -> None
 *
 *   values  as above, values[i] in [0, sizes[group[i]])
 *   group   int64, the group of each value, indexing sizes
 *   sizes   int64, each group's size, in [1, 2**62)
 *   keys    uint64, ROUNDS round keys per group, group-major
 *
 * mixture_window(values, owners, start, width, window_keys, composition, shift,
 *                sizes, keys, starts) -> None
 *
 *   One window of a mixture's epoch (order/mixture.py, MixtureOrder), in one call:
 *   values  int64 positions in [start, start + width), replaced in place by the
 *           dataset index drawn at each
 *   owners  int64, written: the part of each position
 *   window_keys  ROUNDS keys of the window's interleaving permutation of its width
 *           slots, or empty for none (slot = position - start)
 *   composition  int64, parts + 1: part s owns slots [composition[s], composition[s+1])
 *   shift   int64 per part: a slot's offset in its part's current pass is slot + shift
 *   sizes   int64 per part, each pass's size; keys: uint64 ROUNDS per part, the keys of
 *           each part's current pass; starts: int64 per part, its first dataset index
 *   A part whose shift is INT64_MIN (its draws in the window cross passes) is left to
 *   the caller: its positions get owner s and value -1.
 *
 * All compute exactly what permutation.py's numpy code does (KeyedPermutation._encrypt
 * and _encrypt_grouped, with cycle walking); the tests compare them on random inputs.
 * numpy needs about thirty array passes over temporaries per element; here the
 * element stays in registers. A value out of range raises ValueError rather than
 * walking forever. The GIL is released while the loop runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define ROUNDS 6
#define MULT_1 0x9E3779B97F4A7C15ULL
#define MULT_2 0xD6E8FEB86659FD93ULL

static inline unsigned domain_bits(uint64_t size)
{
    /* max(2, (size - 1).bit_length()) */
    unsigned bits = 0;
    uint64_t top = size - 1;
    while (top) {
        bits++;
        top >>= 1;
    }
    return bits < 2 ? 2 : bits;
}

/* One pass of the network over range(2**bits); see permutation.py's docstring. */
static inline uint64_t encrypt(uint64_t value, unsigned bits, const uint64_t *keys)
{
    unsigned right_width = bits >> 1, left_width = bits - right_width;
    uint64_t left = value >> right_width;
    uint64_t right = value & ((1ULL << right_width) - 1);
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t z = (right ^ keys[round]) * MULT_1;
        z ^= z >> 32;
        z *= MULT_2;
        uint64_t mixed = left ^ (z >> (64 - left_width));
        unsigned width = left_width;
        left = right;
        right = mixed;
        left_width = right_width;
        right_width = width;
    }
    return (left << right_width) | right;
}

/* Every value through its group's network (group NULL: group 0 for all), cycle walking
 * those that land at or past their group's size. Rather than a loop per element, whose
 * exit branch is mispredicted for the quarter or so that walk, each pass runs without
 * branches over the values still walking, and notes the ones that must go again in
 * `walking` (room for `count` indices): the multiplications of neighbouring elements
 * then overlap. Returns the first value out of range before the call, or -1. */
static Py_ssize_t permute_all(uint64_t *values, Py_ssize_t count, const int64_t *group,
                              const uint64_t *sizes, const unsigned char *bits,
                              const uint64_t *keys, Py_ssize_t *walking)
{
    Py_ssize_t again = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t g = group ? group[i] : 0;
        if (values[i] >= sizes[g])
            return i;
        uint64_t value = encrypt(values[i], bits[g], keys + g * ROUNDS);
        values[i] = value;
        walking[again] = i;
        again += value >= sizes[g];
    }
    while (again) {
        Py_ssize_t still = 0;
        for (Py_ssize_t k = 0; k < again; k++) {
            Py_ssize_t i = walking[k];
            int64_t g = group ? group[i] : 0;
            uint64_t value = encrypt(values[i], bits[g], keys + g * ROUNDS);
            values[i] = value;
            walking[still] = i;
            still += value >= sizes[g];
        }
        again = still;
    }
    return -1;
}

static int check_words(Py_buffer *buffer, const char *name)
{
    if (buffer->len % 8 != 0) {
        PyErr_Format(PyExc_ValueError, "%s must hold 8-byte integers; got %zd bytes",
                     name, buffer->len);
        return -1;
    }
    return 0;
}

/* Each group's domain_bits, after checking its size is in [1, 2**62); NULL with an
 * exception set otherwise. The caller frees it. */
static unsigned char *group_bits(const int64_t *sizes, Py_ssize_t groups)
{
    unsigned char *bits = PyMem_Malloc(groups ? groups : 1);
    if (bits == NULL)
        return (unsigned char *)PyErr_NoMemory();
    for (Py_ssize_t g = 0; g < groups; g++) {
        if (sizes[g] < 1 || sizes[g] >= (INT64_C(1) << 62)) {
            PyErr_Format(PyExc_ValueError, "sizes must be in [1, 2**62); got %lld at [%zd]",
                         (long long)sizes[g], g);
            PyMem_Free(bits);
            return NULL;
        }
        bits[g] = (unsigned char)domain_bits((uint64_t)sizes[g]);
    }
    return bits;
}

static PyObject *permute(PyObject *self, PyObject *args)
{
    Py_buffer values, keys;
    unsigned long long size;
    if (!PyArg_ParseTuple(args, "w*Ky*:permute", &values, &size, &keys))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t *walking = NULL;
    if (check_words(&values, "values") < 0)
        goto done;
    if (keys.len != ROUNDS * 8) {
        PyErr_Format(PyExc_ValueError, "need %d round keys; got %zd bytes", ROUNDS, keys.len);
        goto done;
    }
    if (size < 1 || size >= (1ULL << 62)) {
        PyErr_Format(PyExc_ValueError, "size must be in [1, 2**62); got %llu", size);
        goto done;
    }
    uint64_t *data = values.buf, limit = size;
    Py_ssize_t count = values.len / 8, bad = -1;
    unsigned char bits = (unsigned char)domain_bits(size);
    walking = PyMem_Malloc(count ? count * sizeof(Py_ssize_t) : 1);
    if (walking == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    bad = permute_all(data, count, NULL, &limit, &bits, keys.buf, walking);
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "position %llu at [%zd] is not in [0, %llu)",
                     (unsigned long long)data[bad], bad, size);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(walking);
    PyBuffer_Release(&values);
    PyBuffer_Release(&keys);
    return result;
}

static PyObject *permute_grouped(PyObject *self, PyObject *args)
{
    Py_buffer values, group, sizes, keys;
    if (!PyArg_ParseTuple(args, "w*y*y*y*:permute_grouped", &values, &group, &sizes, &keys))
        return NULL;
    PyObject *result = NULL;
    unsigned char *bits = NULL;
    Py_ssize_t *walking = NULL;
    if (check_words(&values, "values") < 0 || check_words(&group, "group") < 0 ||
        check_words(&sizes, "sizes") < 0)
        goto done;
    Py_ssize_t count = values.len / 8, groups = sizes.len / 8;
    if (group.len != values.len) {
        PyErr_Format(PyExc_ValueError, "need one group per value; got %zd and %zd",
                     group.len / 8, count);
        goto done;
    }
    if (keys.len != groups * ROUNDS * 8) {
        PyErr_Format(PyExc_ValueError, "need %d round keys for each of %zd groups; got %zd bytes",
                     ROUNDS, groups, keys.len);
        goto done;
    }
    const int64_t *size_of = sizes.buf;
    bits = group_bits(size_of, groups);
    if (bits == NULL)
        goto done;
    uint64_t *data = values.buf;
    const int64_t *group_of = group.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (group_of[i] < 0 || group_of[i] >= groups) {
            PyErr_Format(PyExc_ValueError, "group %lld at [%zd] is not in [0, %zd)",
                         (long long)group_of[i], i, groups);
            goto done;
        }
    }
    walking = PyMem_Malloc(count ? count * sizeof(Py_ssize_t) : 1);
    if (walking == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    bad = permute_all(data, count, group_of, (const uint64_t *)size_of, bits, keys.buf, walking);
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "value %llu of group %lld at [%zd] is out of range",
                     (unsigned long long)data[bad], (long long)group_of[bad], bad);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(walking);
    PyMem_Free(bits);
    PyBuffer_Release(&values);
    PyBuffer_Release(&group);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&keys);
    return result;
}

static int check_parts(Py_buffer *buffer, const char *name, Py_ssize_t want)
{
    if (buffer->len != want * 8) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd 8-byte integers; got %zd bytes",
                     name, want, buffer->len);
        return -1;
    }
    return 0;
}

#define BUCKET_BITS 6

static PyObject *mixture_window(PyObject *self, PyObject *args)
{
    Py_buffer values, owners, window_keys, composition, shift, sizes, keys, starts;
    long long start;
    unsigned long long width;
    if (!PyArg_ParseTuple(args, "w*w*LKy*y*y*y*y*y*:mixture_window", &values, &owners, &start,
                          &width, &window_keys, &composition, &shift, &sizes, &keys, &starts))
        return NULL;
    PyObject *result = NULL;
    unsigned char *bits = NULL;
    Py_ssize_t *walking = NULL, *first_owner = NULL;
    Py_ssize_t count = values.len / 8, parts = shift.len / 8;
    if (check_words(&values, "values") < 0 || check_words(&shift, "shift") < 0 ||
        check_parts(&owners, "owners", count) < 0 ||
        check_parts(&composition, "composition", parts + 1) < 0 ||
        check_parts(&sizes, "sizes", parts) < 0 || check_parts(&starts, "starts", parts) < 0 ||
        check_parts(&keys, "keys", parts * ROUNDS) < 0)
        goto done;
    if (window_keys.len != 0 && window_keys.len != ROUNDS * 8) {
        PyErr_Format(PyExc_ValueError, "need %d window keys or none; got %zd bytes", ROUNDS,
                     window_keys.len);
        goto done;
    }
    const int64_t *bounds = composition.buf, *shift_of = shift.buf, *size_of = sizes.buf;
    const int64_t *start_of = starts.buf;
    if (parts < 1 || width < 1 || width >= (1ULL << 62) || bounds[0] != 0 ||
        (uint64_t)bounds[parts] != width) {
        PyErr_Format(PyExc_ValueError, "composition must run from 0 to the width %llu over "
                     ">= 1 parts", width);
        goto done;
    }
    Py_ssize_t buckets = (Py_ssize_t)((width - 1) >> BUCKET_BITS) + 1;
    for (Py_ssize_t s = 0; s < parts; s++) {
        if (bounds[s + 1] < bounds[s]) {
            PyErr_Format(PyExc_ValueError, "composition decreases at part %zd", s);
            goto done;
        }
    }
    bits = group_bits(size_of, parts);
    if (bits == NULL)
        goto done;
    walking = PyMem_Malloc(count ? count * sizeof(Py_ssize_t) : 1);
    first_owner = PyMem_Malloc(buckets * sizeof(Py_ssize_t));
    if (walking == NULL || first_owner == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *data = values.buf;
    int64_t *owner = owners.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t slot = (uint64_t)((int64_t)data[i] - start);
        if ((int64_t)data[i] < start || slot >= width) {
            PyErr_Format(PyExc_ValueError, "position %lld at [%zd] is not in [%lld, %lld)",
                         (long long)data[i], i, start, start + (long long)width);
            goto done;
        }
        data[i] = slot;
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    if (window_keys.len) {
        uint64_t limit = width;
        unsigned char window_bits = (unsigned char)domain_bits(width);
        permute_all(data, count, NULL, &limit, &window_bits, window_keys.buf, walking);
    }
    /* Each slot's part: the part of the first slot of its run of 64 (a table built
     * once), then forward past the bounds between. A binary search over a hundred
     * parts mispredicts a branch or two per slot; this mostly takes none. */
    for (Py_ssize_t b = 0, s = 0; b < buckets; b++) {
        while (bounds[s + 1] <= (b << BUCKET_BITS))
            s++;
        first_owner[b] = s;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t slot = (int64_t)data[i];
        Py_ssize_t s = first_owner[slot >> BUCKET_BITS];
        while (bounds[s + 1] <= slot)
            s++;
        owner[i] = s;
        data[i] = shift_of[s] == INT64_MIN ? 0 : (uint64_t)(slot + shift_of[s]);
    }
    bad = permute_all(data, count, owner, (const uint64_t *)size_of, bits, keys.buf, walking);
    if (bad < 0)
        for (Py_ssize_t i = 0; i < count; i++)
            data[i] = shift_of[owner[i]] == INT64_MIN ? (uint64_t)-1
                                                     : data[i] + (uint64_t)start_of[owner[i]];
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "offset %llu of part %lld at [%zd] is past its pass",
                     (unsigned long long)data[bad], (long long)owner[bad], bad);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(first_owner);
    PyMem_Free(walking);
    PyMem_Free(bits);
    PyBuffer_Release(&values);
    PyBuffer_Release(&owners);
    PyBuffer_Release(&window_keys);
    PyBuffer_Release(&composition);
    PyBuffer_Release(&shift);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&starts);
    return result;
}

static PyMethodDef methods[] = {
    {"permute", permute, METH_VARARGS, "Permute uint64 positions in place (one key)."},
    {"permute_grouped", permute_grouped, METH_VARARGS,
     "Permute uint64 positions in place, each through its group's key."},
    {"mixture_window", mixture_window, METH_VARARGS,
     "One window of a mixture's epoch: positions to dataset indices, in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_permute", "The keyed Feistel permutation in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__permute(void)
{
    return PyModule_Create(&module);
}
