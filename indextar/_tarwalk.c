/* The common case of tar scanning, in C: walk the header chain, checking every header.
 *
 * walk(buffer) -> (status, end, offsets, sizes, types)
 *
 * status 0: the chain ended cleanly at a zero block at offset `end`; `offsets` (int64),
 *           `sizes` (int64, 0 for entries without data) and `types` (uint8) describe
 *           every header, all of them plain ustar/GNU/v7 headers with valid checksums
 *           and octal numeric fields.
 * status 1: something this fast path does not handle: an extension header (PAX, GNU
 *           long name), a base-256 or unusual numeric field, a bad checksum, a sparse
 *           or multi-volume member, truncation. The caller then uses the Python
 *           scanner, which is the reference and reports errors precisely.
 *
 * The GIL is released during the walk. Only headers are read, never member data.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 512

/* An octal field as strict readers take it: cut at the first NUL, spaces around,
   digits only; empty is 0. Returns 0 on success. */
static int parse_octal(const unsigned char *field, int width, int64_t *out)
{
    int end = 0, a, b, i;
    int64_t value = 0;
    while (end < width && field[end] != 0)
        end++;
    a = 0;
    while (a < end && field[a] == ' ')
        a++;
    b = end;
    while (b > a && field[b - 1] == ' ')
        b--;
    for (i = a; i < b; i++) {
        unsigned c = field[i];
        if (c < '0' || c > '7')
            return -1;
        if (value > (INT64_MAX >> 3))
            return -1;
        value = value * 8 + (int64_t)(c - '0');
    }
    *out = value;
    return 0;
}

static int is_zero_block(const unsigned char *h)
{
    static const unsigned char zeros[BLOCK];
    return h[0] == 0 && memcmp(h, zeros, BLOCK) == 0;
}

/* Sum of a header's 512 bytes, eight at a time: 16-bit lanes cannot overflow
   (64 words x 2 x 255 < 65536). */
static int64_t byte_sum(const unsigned char *h)
{
    const uint64_t mask = 0x00FF00FF00FF00FFULL;
    uint64_t lanes = 0, word;
    int i;
    for (i = 0; i < BLOCK; i += 8) {
        memcpy(&word, h + i, 8);
        lanes += (word & mask) + ((word >> 8) & mask);
    }
    return (int64_t)((lanes & 0xFFFF) + ((lanes >> 16) & 0xFFFF) + ((lanes >> 32) & 0xFFFF) +
                     (lanes >> 48));
}

static int64_t byte_sum_range(const unsigned char *p, int n)
{
    int64_t sum = 0;
    int i;
    for (i = 0; i < n; i++)
        sum += p[i];
    return sum;
}

static int64_t high_bytes(const unsigned char *p, int n)
{
    int64_t count = 0;
    int i;
    for (i = 0; i < n; i++)
        count += p[i] >= 128;
    return count;
}

static const int FIELD_START[] = {100, 108, 116, 124, 136};
static const int FIELD_WIDTH[] = {8, 8, 8, 12, 12};

typedef struct {
    int64_t *offsets;
    int64_t *sizes;
    unsigned char *types;
    Py_ssize_t count, capacity;
} Chain;

static int chain_push(Chain *c, int64_t offset, int64_t size, unsigned char type)
{
    if (c->count == c->capacity) {
        Py_ssize_t cap = c->capacity ? c->capacity * 2 : 1024;
        int64_t *o = realloc(c->offsets, cap * sizeof(int64_t));
        if (!o)
            return -1;
        c->offsets = o;
        int64_t *s = realloc(c->sizes, cap * sizeof(int64_t));
        if (!s)
            return -1;
        c->sizes = s;
        unsigned char *t = realloc(c->types, cap);
        if (!t)
            return -1;
        c->types = t;
        c->capacity = cap;
    }
    c->offsets[c->count] = offset;
    c->sizes[c->count] = size;
    c->types[c->count] = type;
    c->count++;
    return 0;
}

/* 0: chain ended at a zero block (*end set); 1: hand over to Python; -1: out of memory. */
static int walk_chain(const unsigned char *buf, int64_t size, Chain *chain, int64_t *end)
{
    int64_t pos = 0;
    for (;;) {
        const unsigned char *h;
        int64_t stored, field_value, member_size = 0;
        int64_t unsigned_sum = 0, signed_sum = 0;
        unsigned char type;
        int i;
        if (pos + BLOCK > size)
            return 1;
        h = buf + pos;
        if (is_zero_block(h)) {
            *end = pos;
            return 0;
        }
        if (parse_octal(h + 148, 8, &stored) != 0)
            return 1;
        unsigned_sum = byte_sum(h) - byte_sum_range(h + 148, 8) + 8 * ' ';
        if (stored != unsigned_sum) {
            /* Old tars summed signed bytes: each byte >= 128 counts 256 less. */
            signed_sum = unsigned_sum - 256 * (high_bytes(h, BLOCK) - high_bytes(h + 148, 8));
            if (stored != signed_sum)
                return 1;
        }
        for (i = 0; i < 5; i++) {
            if (parse_octal(h + FIELD_START[i], FIELD_WIDTH[i], &field_value) != 0)
                return 1;
            if (i == 3)
                member_size = field_value;
        }
        type = h[156];
        if (type == 'x' || type == 'g' || type == 'L' || type == 'K' || type == 'S' || type == 'M')
            return 1;
        if (type >= '1' && type <= '6')
            member_size = 0;
        if (chain_push(chain, pos, member_size, type) != 0)
            return -1;
        pos += BLOCK + (member_size + BLOCK - 1) / BLOCK * BLOCK;
        if (pos > size)
            return 1;
    }
}

static PyObject *walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Chain chain = {NULL, NULL, NULL, 0, 0};
    int64_t end = 0;
    int status;
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = walk_chain((const unsigned char *)view.buf, (int64_t)view.len, &chain, &end);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status < 0) {
        PyErr_NoMemory();
    } else if (status == 1) {
        result = Py_BuildValue("(iLOOO)", 1, (long long)0, Py_None, Py_None, Py_None);
    } else {
        static const char empty[1] = {0};
        result = Py_BuildValue(
            "(iLy#y#y#)", 0, (long long)end,
            chain.count ? (const char *)chain.offsets : empty,
            chain.count * (Py_ssize_t)sizeof(int64_t),
            chain.count ? (const char *)chain.sizes : empty,
            chain.count * (Py_ssize_t)sizeof(int64_t),
            chain.count ? (const char *)chain.types : empty, chain.count);
    }
    free(chain.offsets);
    free(chain.sizes);
    free(chain.types);
    return result;
}

/* names(buffer, offsets) -> list[str] | None
 *
 * The names of the plain headers at `offsets` (int64): the name field up to its first
 * NUL, after the ustar prefix field and a '/' where a POSIX header has one. None if a
 * name is not valid UTF-8: the Python scanner then reports which one.
 */
static PyObject *names(PyObject *self, PyObject *args)
{
    static const char posix_magic[8] = {'u', 's', 't', 'a', 'r', 0, '0', '0'};
    Py_buffer view, offsets_view;
    PyObject *result = NULL;
    Py_ssize_t n, i;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*", &view, &offsets_view))
        return NULL;
    n = offsets_view.len / (Py_ssize_t)sizeof(int64_t);
    result = PyList_New(n);
    for (i = 0; result && i < n; i++) {
        int64_t offset;
        const unsigned char *h;
        char joined[256 + 100];
        const char *name;
        Py_ssize_t len, prefix_len;
        PyObject *s;
        memcpy(&offset, (const char *)offsets_view.buf + i * sizeof(int64_t), sizeof(int64_t));
        if (offset < 0 || offset + BLOCK > view.len) {
            PyErr_SetString(PyExc_ValueError, "a header offset is outside the buffer");
            Py_CLEAR(result);
            break;
        }
        h = (const unsigned char *)view.buf + offset;
        name = (const char *)h;
        len = (Py_ssize_t)strnlen(name, 100);
        if (h[345] != 0 && memcmp(h + 257, posix_magic, 8) == 0) {
            prefix_len = (Py_ssize_t)strnlen((const char *)h + 345, 155);
            memcpy(joined, h + 345, prefix_len);
            joined[prefix_len] = '/';
            memcpy(joined + prefix_len + 1, name, len);
            name = joined;
            len += prefix_len + 1;
        }
        s = PyUnicode_DecodeUTF8(name, len, "strict");
        if (!s) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                Py_CLEAR(result);
                break;
            }
            PyErr_Clear();
            Py_DECREF(result);
            result = Py_NewRef(Py_None);
            break;
        }
        PyList_SET_ITEM(result, i, s);
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&offsets_view);
    return result;
}

/* group(names, rows) -> (first, keys, ext_codes, exts) | None
 *
 * The naming rules' common case, for the members names[rows] (int64 rows): a member's
 * key is its name up to the first dot after the last '/', the rest its extension
 * (as stored, not lowercased), and consecutive members with equal keys form a sample.
 * Returns each sample's first position in rows (int64 bytes) and key, each member's
 * code into `exts` (int64 bytes; the distinct extensions in first-seen order). None
 * if any name is outside the case where this rule provably equals webdataset's regex
 * (see naming._split_vectorised), or there are over 256 distinct extensions: the
 * numpy and Python paths then decide.
 */
#define MAX_EXTS 256

static PyObject *group(PyObject *self, PyObject *args)
{
    PyObject *name_list, *keys = NULL, *exts = NULL, *result = NULL;
    Py_buffer rows_view;
    Py_ssize_t n, n_names, i, n_exts = 0, n_samples = 0;
    int64_t *first = NULL, *codes = NULL;
    const char *ext_ptr[MAX_EXTS];
    Py_ssize_t ext_len[MAX_EXTS];
    const char *prev_key = NULL;
    Py_ssize_t prev_len = -1;
    int fast = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &name_list, &rows_view))
        return NULL;
    n = rows_view.len / (Py_ssize_t)sizeof(int64_t);
    n_names = PyList_GET_SIZE(name_list);
    first = malloc((n ? n : 1) * sizeof(int64_t));
    codes = malloc((n ? n : 1) * sizeof(int64_t));
    keys = PyList_New(0);
    exts = PyList_New(0);
    if (!first || !codes || !keys || !exts) {
        PyErr_NoMemory();
        goto fail;
    }
    for (i = 0; i < n && fast; i++) {
        int64_t row;
        PyObject *item;
        const char *s;
        Py_ssize_t len, base = 0, dot = -1, j, k;
        memcpy(&row, (const char *)rows_view.buf + i * sizeof(int64_t), sizeof(int64_t));
        if (row < 0 || row >= n_names) {
            PyErr_SetString(PyExc_IndexError, "a row is outside names");
            goto fail;
        }
        item = PyList_GET_ITEM(name_list, row);
        if (!PyUnicode_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "names must be str");
            goto fail;
        }
        s = PyUnicode_AsUTF8AndSize(item, &len);
        if (!s)
            goto fail;
        if (len >= 2 && s[0] == '_' && s[1] == '_') {
            fast = 0; /* possibly a meta entry */
            break;
        }
        for (j = 0; j < len; j++) {
            char c = s[j];
            if (c == '/') {
                base = j + 1;
                dot = -1;
            } else if (c == '.' && dot < 0) {
                dot = j;
            } else if (c == '\n' || c == 0) {
                fast = 0;
                break;
            }
        }
        if (!fast || dot <= base) { /* no dot in the base name, or a leading one */
            fast = 0;
            break;
        }
        if (dot != prev_len || memcmp(s, prev_key, (size_t)dot) != 0) {
            PyObject *key = PyUnicode_DecodeUTF8(s, dot, "strict");
            if (!key || PyList_Append(keys, key) < 0) {
                Py_XDECREF(key);
                goto fail;
            }
            Py_DECREF(key);
            first[n_samples++] = (int64_t)i;
            prev_key = s;
            prev_len = dot;
        }
        for (k = 0; k < n_exts; k++)
            if (ext_len[k] == len - dot - 1 && memcmp(ext_ptr[k], s + dot + 1, len - dot - 1) == 0)
                break;
        if (k == n_exts) {
            PyObject *ext;
            if (n_exts == MAX_EXTS) {
                fast = 0;
                break;
            }
            ext = PyUnicode_DecodeUTF8(s + dot + 1, len - dot - 1, "strict");
            if (!ext || PyList_Append(exts, ext) < 0) {
                Py_XDECREF(ext);
                goto fail;
            }
            Py_DECREF(ext);
            ext_ptr[n_exts] = s + dot + 1;
            ext_len[n_exts] = len - dot - 1;
            n_exts++;
        }
        codes[i] = k;
    }
    if (!fast) {
        result = Py_NewRef(Py_None);
    } else {
        result = Py_BuildValue("(y#Oy#O)", (const char *)first,
                               n_samples * (Py_ssize_t)sizeof(int64_t), keys,
                               (const char *)codes, n * (Py_ssize_t)sizeof(int64_t), exts);
    }
fail:
    free(first);
    free(codes);
    Py_XDECREF(keys);
    Py_XDECREF(exts);
    PyBuffer_Release(&rows_view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "walk(buffer) -> (status, end, offsets, sizes, types)"},
    {"names", names, METH_VARARGS, "names(buffer, offsets) -> list[str] | None"},
    {"group", group, METH_VARARGS, "group(names, rows) -> (first, keys, ext_codes, exts) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tarwalk", "The common case of tar scanning, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__tarwalk(void) { return PyModule_Create(&module); }
