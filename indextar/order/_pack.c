/* Bin packing of document lengths for indextar/order/packing.py, in one pass over them.
 *
 * fit_decreasing(lengths, order, sorted, packed, max_length, best) -> bytes
 *
 *   lengths     int32[n], each >= 1; a longer one than max_length counts as max_length
 *               (truncated), without the caller making a clipped copy
 *   order       int32[n], a permutation of range(n): among equal lengths, documents are
 *               placed in this order (the plan's seed); overwritten (scratch)
 *   sorted      int32[n], scratch
 *   packed      int32[n], written: the documents pack by pack
 *   max_length  the packs' capacity, in [1, 2**30)
 *   best        1: best fit (the open pack with the least room that fits);
 *               0: first fit (the first opened pack that fits)
 *
 *   Returns the packs' offsets into ``packed``, int64[packs + 1], as bytes.
 *
 * Documents are visited longest first (a counting sort by length, stable in ``order``),
 * each one's length known from its place in that order (no gather of lengths).
 * Best fit keeps the open packs in one stack per remaining room and a two-level bitset
 * of the rooms that have any, so finding the least room >= a length is a few word
 * scans; first fit keeps a max segment tree over the packs' rooms. Both are what
 * packing.py's Python references compute, pack for pack (the tests compare them).
 * The GIL is released while the loops run. Memory: 16 bytes a document with the
 * caller's four arrays, plus 8 to 16 bytes a pack.
 *
 * concat_split(lengths, pieces, piece_lengths, piece_starts, offsets, max_length) -> int
 *
 *   lengths        int32[n], each document's tokens (>= 0; 0: it yields no piece)
 *   pieces         int32[m + packs], m documents in their seeded order at [packs:]
 *                  (read) and, written from the front, each piece's document
 *   piece_lengths  int32[m + packs], written: each piece's tokens
 *   piece_starts   int32[m + packs], written: each piece's first token in its document
 *   offsets        int64[packs + 1], written: pack p is pieces offsets[p]:offsets[p + 1]
 *   max_length     the packs' capacity
 *
 *   Returns the number of pieces. The documents end to end, cut every ``max_length``
 *   tokens, in one pass: the pieces are written into the buffer the order is read from,
 *   never overtaking it (a piece more than documents read comes only from a cut, and
 *   there are fewer cuts than packs), so planning holds 12 bytes a piece and 8 a pack.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CLIP(length, max_length) ((length) < (max_length) ? (length) : (int32_t)(max_length))

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int get_buffer(PyObject *obj, Buf *buf, int writable, Py_ssize_t n, const char *name)
{
    buf->held = 0;
    if (PyObject_GetBuffer(obj, &buf->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    buf->held = 1;
    if (buf->view.len != n * 4) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd int32 values", name, n);
        return -1;
    }
    return 0;
}

static void release(Buf *buf)
{
    if (buf->held)
        PyBuffer_Release(&buf->view);
    buf->held = 0;
}

/* Rooms with an open pack: bit r of low[] is set when stack[r] is not empty; bit w of
 * high[] when low[w] is not zero. */
typedef struct {
    uint64_t *low, *high;
    int64_t nlow, nhigh;
} Rooms;

static inline void rooms_set(Rooms *r, int64_t room)
{
    r->low[room >> 6] |= 1ULL << (room & 63);
    r->high[room >> 12] |= 1ULL << ((room >> 6) & 63);
}

static inline void rooms_clear(Rooms *r, int64_t room)
{
    r->low[room >> 6] &= ~(1ULL << (room & 63));
    if (!r->low[room >> 6])
        r->high[room >> 12] &= ~(1ULL << ((room >> 6) & 63));
}

/* The least room >= want with an open pack, or -1. */
static inline int64_t rooms_next(const Rooms *r, int64_t want)
{
    int64_t w = want >> 6;
    if (w >= r->nlow)
        return -1;
    uint64_t bits = r->low[w] & (~0ULL << (want & 63));
    if (bits)
        return (w << 6) | __builtin_ctzll(bits);
    int64_t start = w + 1; /* next low word to look at */
    int64_t h = start >> 6;
    if (h >= r->nhigh)
        return -1;
    uint64_t hb = (start & 63) ? r->high[h] & (~0ULL << (start & 63)) : r->high[h];
    while (!hb) {
        if (++h >= r->nhigh)
            return -1;
        hb = r->high[h];
    }
    w = (h << 6) | __builtin_ctzll(hb);
    return (w << 6) | __builtin_ctzll(r->low[w]);
}

/* Grow an int32 array to hold at least `need` values; 0 on failure. */
static int grow(int32_t **array, int64_t *capacity, int64_t need)
{
    if (need <= *capacity)
        return 1;
    int64_t cap = *capacity ? *capacity : 1024;
    while (cap < need)
        cap *= 2;
    int32_t *bigger = realloc(*array, (size_t)cap * sizeof(int32_t));
    if (!bigger)
        return 0;
    *array = bigger;
    *capacity = cap;
    return 1;
}

/* Best fit: returns the number of packs, or -1 when out of memory. bin[k] is the pack
 * of sorted[k]. */
static int64_t best_fit(const int64_t *ends, int32_t *bin, int64_t n, int64_t max_length)
{
    Rooms rooms;
    rooms.nlow = (max_length >> 6) + 1;
    rooms.nhigh = (rooms.nlow >> 6) + 1;
    rooms.low = calloc((size_t)rooms.nlow, sizeof(uint64_t));
    rooms.high = calloc((size_t)rooms.nhigh, sizeof(uint64_t));
    int32_t *top = malloc((size_t)(max_length + 1) * sizeof(int32_t)); /* stack heads */
    int32_t *below = NULL; /* the next pack down each pack's stack */
    int64_t below_cap = 0, packs = 0;
    if (!rooms.low || !rooms.high || !top)
        goto fail;
    for (int64_t r = 0; r <= max_length; r++)
        top[r] = -1;
    int64_t shorter = 0; /* max_length - the length of sorted[k] */
    for (int64_t k = 0; k < n; k++) {
        while (k >= ends[shorter])
            shorter++;
        int64_t length = max_length - shorter;
        int64_t room = rooms_next(&rooms, length);
        int32_t pack;
        if (room < 0) {
            if (!grow(&below, &below_cap, packs + 1))
                goto fail;
            pack = (int32_t)packs++;
            room = max_length;
        } else {
            pack = top[room];
            top[room] = below[pack];
            if (top[room] < 0)
                rooms_clear(&rooms, room);
        }
        bin[k] = pack;
        room -= length;
        if (room > 0) {
            below[pack] = top[room];
            if (top[room] < 0)
                rooms_set(&rooms, room);
            top[room] = pack;
        }
    }
    free(rooms.low), free(rooms.high), free(top), free(below);
    return packs;
fail:
    free(rooms.low), free(rooms.high), free(top), free(below);
    return -1;
}

/* First fit over a max segment tree of the packs' rooms (leaves at [cap, 2 cap)). */
static int64_t first_fit(const int64_t *ends, int32_t *bin, int64_t n, int64_t max_length)
{
    int64_t cap = 1024, packs = 0;
    int32_t *tree = calloc((size_t)(2 * cap), sizeof(int32_t));
    if (!tree)
        return -1;
    int64_t shorter = 0;
    for (int64_t k = 0; k < n; k++) {
        while (k >= ends[shorter])
            shorter++;
        int32_t length = (int32_t)(max_length - shorter);
        int64_t node;
        if (tree[1] >= length) {
            node = 1;
            while (node < cap)
                node = tree[2 * node] >= length ? 2 * node : 2 * node + 1;
        } else {
            if (packs == cap) { /* double: copy the leaves, rebuild the inner nodes */
                int32_t *bigger = calloc((size_t)(4 * cap), sizeof(int32_t));
                if (!bigger) {
                    free(tree);
                    return -1;
                }
                memcpy(bigger + 2 * cap, tree + cap, (size_t)cap * sizeof(int32_t));
                free(tree);
                tree = bigger;
                cap *= 2;
                for (int64_t i = cap - 1; i >= 1; i--)
                    tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
            }
            node = cap + packs++;
            tree[node] = (int32_t)max_length;
        }
        bin[k] = (int32_t)(node - cap);
        tree[node] -= length;
        for (node >>= 1; node >= 1; node >>= 1) {
            int32_t m = tree[2 * node] > tree[2 * node + 1] ? tree[2 * node] : tree[2 * node + 1];
            if (tree[node] == m)
                break;
            tree[node] = m;
        }
    }
    free(tree);
    return packs;
}

static PyObject *fit_decreasing(PyObject *self, PyObject *args)
{
    PyObject *lengths_obj, *order_obj, *sorted_obj, *packed_obj;
    long long max_length;
    int best;
    if (!PyArg_ParseTuple(args, "OOOOLp", &lengths_obj, &order_obj, &sorted_obj, &packed_obj,
                          &max_length, &best))
        return NULL;
    if (max_length < 1 || max_length >= (1LL << 30)) {
        PyErr_SetString(PyExc_ValueError, "max_length must be in [1, 2**30)");
        return NULL;
    }
    Buf lb = {0}, ob = {0}, sb = {0}, pb = {0};
    PyObject *result = NULL;
    int64_t *count = NULL;
    int64_t *offsets = NULL;
    if (PyObject_GetBuffer(lengths_obj, &lb.view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    lb.held = 1;
    Py_ssize_t n = lb.view.len / 4;
    if (get_buffer(order_obj, &ob, 1, n, "order") < 0 ||
        get_buffer(sorted_obj, &sb, 1, n, "sorted") < 0 ||
        get_buffer(packed_obj, &pb, 1, n, "packed") < 0)
        goto done;
    const int32_t *lengths = lb.view.buf;
    int32_t *order = ob.view.buf, *sorted = sb.view.buf, *packed = pb.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lengths[i] < 1) {
            PyErr_Format(PyExc_ValueError, "length %d of document %zd is not >= 1",
                         lengths[i], i);
            goto done;
        }
        if (order[i] < 0 || order[i] >= n) {
            PyErr_Format(PyExc_ValueError, "order[%zd] = %d is not a document", i, order[i]);
            goto done;
        }
    }
    count = calloc((size_t)(max_length + 2), sizeof(int64_t));
    if (!count) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t packs;
    Py_BEGIN_ALLOW_THREADS
    /* Longest first, stable in `order`: slot of length l starts after all longer ones. */
    for (Py_ssize_t i = 0; i < n; i++)
        count[max_length - CLIP(lengths[i], max_length)]++;
    int64_t at = 0;
    for (int64_t l = 0; l <= max_length; l++) {
        int64_t c = count[l];
        count[l] = at;
        at += c;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        sorted[count[max_length - CLIP(lengths[order[i]], max_length)]++] = order[i];
    /* count[j] is now where the documents of length max_length - j end in sorted, so
     * the fits read lengths from there, not at random; order is free now: it holds
     * each sorted document's pack */
    packs = best ? best_fit(count, order, n, max_length) : first_fit(count, order, n, max_length);
    Py_END_ALLOW_THREADS
    if (packs < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((packs + 1) * sizeof(int64_t)));
    if (!result)
        goto done;
    offsets = (int64_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    memset(offsets, 0, (size_t)(packs + 1) * sizeof(int64_t));
    for (Py_ssize_t k = 0; k < n; k++)
        offsets[order[k] + 1]++;
    for (int64_t p = 0; p < packs; p++)
        offsets[p + 1] += offsets[p];
    /* each pack's documents in the order they were placed (longest first) */
    for (Py_ssize_t k = 0; k < n; k++)
        packed[offsets[order[k]]++] = sorted[k];
    for (int64_t p = packs; p > 0; p--)
        offsets[p] = offsets[p - 1];
    offsets[0] = 0;
    Py_END_ALLOW_THREADS
done:
    free(count);
    release(&lb), release(&ob), release(&sb), release(&pb);
    return result;
}


static int get_sized(PyObject *obj, Buf *buf, Py_ssize_t n, Py_ssize_t itemsize, const char *name)
{
    buf->held = 0;
    if (PyObject_GetBuffer(obj, &buf->view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    buf->held = 1;
    if (buf->view.len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd values of %zd bytes", name, n, itemsize);
        return -1;
    }
    return 0;
}

static PyObject *concat_split(PyObject *self, PyObject *args)
{
    PyObject *lengths_obj, *pieces_obj, *plen_obj, *pstart_obj, *offsets_obj;
    long long max_length;
    if (!PyArg_ParseTuple(args, "OOOOOL", &lengths_obj, &pieces_obj, &plen_obj, &pstart_obj,
                          &offsets_obj, &max_length))
        return NULL;
    if (max_length < 1 || max_length >= (1LL << 30)) {
        PyErr_SetString(PyExc_ValueError, "max_length must be in [1, 2**30)");
        return NULL;
    }
    Buf lb = {0}, pb = {0}, ob = {0};
    Buf plb = {0}, psb = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(lengths_obj, &lb.view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    lb.held = 1;
    Py_ssize_t n = lb.view.len / 4;
    if (PyObject_GetBuffer(offsets_obj, &ob.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    ob.held = 1;
    Py_ssize_t packs = ob.view.len / 8 - 1;
    if (PyObject_GetBuffer(pieces_obj, &pb.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    pb.held = 1;
    Py_ssize_t total = pb.view.len / 4;
    if (packs < 0 || total < packs ||
        get_sized(plen_obj, &plb, total, 4, "piece_lengths") < 0 ||
        get_sized(pstart_obj, &psb, total, 4, "piece_starts") < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "offsets and pieces disagree on the packs");
        goto done;
    }
    const int32_t *lengths = lb.view.buf;
    int32_t *pieces = pb.view.buf, *plen = plb.view.buf, *pstart = psb.view.buf;
    int64_t *offsets = ob.view.buf;
    Py_ssize_t m = total - packs;
    for (Py_ssize_t i = 0; i < m; i++) {
        int32_t d = pieces[packs + i];
        if (d < 0 || d >= n || lengths[d] < 0) {
            PyErr_Format(PyExc_ValueError, "order[%zd] = %d is not a document of length >= 0", i, d);
            goto done;
        }
    }
    Py_ssize_t w = 0;
    int64_t pack = 0, room = max_length;
    int overflow = 0;
    Py_BEGIN_ALLOW_THREADS
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i < m && !overflow; i++) {
        int32_t d = pieces[packs + i];
        int64_t left = lengths[d], start = 0;
        while (left > 0) {
            if (room == 0) {
                if (++pack > packs - 1) {
                    overflow = 1;
                    break;
                }
                offsets[pack] = w;
                room = max_length;
            }
            int64_t take = left < room ? left : room;
            pieces[w] = d;  /* w <= packs + i: never past what is still to be read */
            plen[w] = (int32_t)take;
            pstart[w] = (int32_t)start;
            w++;
            start += take, left -= take, room -= take;
        }
    }
    for (int64_t p = pack + 1; p <= packs; p++)
        offsets[p] = w;
    Py_END_ALLOW_THREADS
    if (overflow) {
        PyErr_SetString(PyExc_ValueError, "the documents hold more tokens than packs * max_length");
        goto done;
    }
    result = PyLong_FromSsize_t(w);
done:
    release(&lb), release(&pb), release(&ob), release(&plb), release(&psb);
    return result;
}

static PyMethodDef methods[] = {
    {"fit_decreasing", fit_decreasing, METH_VARARGS,
     "Pack documents longest first by best or first fit; see _pack.c."},
    {"concat_split", concat_split, METH_VARARGS,
     "Documents end to end, cut every max_length tokens; see _pack.c."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pack", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pack(void) { return PyModule_Create(&module); }
