/* The common case of tar scanning, in C: walk the header chain, checking every header.
 *
 * walk(buffer, fd=-1) -> (status, end, offsets, starts, sizes, types, names, extensions)
 *
 * status 0: the chain ended cleanly at a zero block at offset `end`. Every header has a
 *           valid checksum and octal numeric fields, and is a plain ustar/GNU/v7 header
 *           or a PAX header (local 'x' or global 'g') whose records change nothing the
 *           scan records (see pax_harmless). For each member: `offsets` (int64) its own
 *           header, `starts` (int64) where it starts, at its first PAX header if it has
 *           any (None when the shard has no PAX header: the offsets), `sizes` (int64, 0
 *           for entries without data) and `types` (uint8); `names` are their names as
 *           str (ustar prefix joined), or None if one is not valid UTF-8; `extensions`
 *           counts the PAX headers. With `fd`, a descriptor of the file whose bytes
 *           `buffer` maps, headers are read with pread instead.
 * status 2: reading with `fd`, the file ended before byte `end` + 512: it shrank.
 * status 1: something this fast path does not handle: a GNU long name, a PAX record
 *           that names or sizes a member (or any keyword not known harmless, or any
 *           record not exactly well formed), a base-256 or unusual numeric field, a bad
 *           checksum, a sparse or multi-volume member, truncation. The caller then uses
 *           the Python scanner, which is the reference and reports errors precisely.
 *
 * The GIL is released during the walk. Only headers and PAX headers' data are read,
 * never member data.
 *
 * group(names, rows) -> (first, keys, ext_codes, exts) | None: the naming rules' common
 * case (see below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

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
    int64_t *offsets; /* each member's own header */
    int64_t *starts;  /* where each member starts: its first PAX header, or its own */
    int64_t *sizes;
    unsigned char *types;
    int64_t *name_ends; /* end of each name in `names`; a name starts where the last ended */
    char *names;
    Py_ssize_t count, capacity;
    int64_t names_len, names_capacity;
    Py_ssize_t extensions; /* PAX headers folded into the members after them */
} Chain;

static int chain_push(Chain *c, int64_t offset, int64_t start, int64_t size, unsigned char type)
{
    if (c->count == c->capacity) {
        Py_ssize_t cap = c->capacity ? c->capacity * 2 : 1024;
        int64_t *o = realloc(c->offsets, cap * sizeof(int64_t));
        if (!o)
            return -1;
        c->offsets = o;
        int64_t *st = realloc(c->starts, cap * sizeof(int64_t));
        if (!st)
            return -1;
        c->starts = st;
        int64_t *s = realloc(c->sizes, cap * sizeof(int64_t));
        if (!s)
            return -1;
        c->sizes = s;
        unsigned char *t = realloc(c->types, cap);
        if (!t)
            return -1;
        c->types = t;
        int64_t *e = realloc(c->name_ends, cap * sizeof(int64_t));
        if (!e)
            return -1;
        c->name_ends = e;
        c->capacity = cap;
    }
    c->offsets[c->count] = offset;
    c->starts[c->count] = start;
    c->sizes[c->count] = size;
    c->types[c->count] = type;
    c->count++;
    return 0;
}

/* Append a header's name: the name field up to its first NUL, after the ustar prefix
   field and a '/' where a POSIX header has one. */
static int chain_name(Chain *c, const unsigned char *h)
{
    static const char posix_magic[8] = {'u', 's', 't', 'a', 'r', 0, '0', '0'};
    int64_t len = (int64_t)strnlen((const char *)h, 100);
    int64_t prefix = 0;
    if (h[345] != 0 && memcmp(h + 257, posix_magic, 8) == 0)
        prefix = (int64_t)strnlen((const char *)h + 345, 155);
    if (c->names_len + len + prefix + 1 > c->names_capacity) {
        int64_t cap = c->names_capacity ? c->names_capacity * 2 : 65536;
        char *n = realloc(c->names, cap);
        if (!n)
            return -1;
        c->names = n;
        c->names_capacity = cap;
    }
    if (prefix) {
        memcpy(c->names + c->names_len, h + 345, prefix);
        c->names[c->names_len + prefix] = '/';
        c->names_len += prefix + 1;
    }
    memcpy(c->names + c->names_len, h, len);
    c->names_len += len;
    c->name_ends[c->count - 1] = c->names_len;
    return 0;
}

static void chain_free(Chain *c)
{
    free(c->offsets);
    free(c->starts);
    free(c->sizes);
    free(c->types);
    free(c->name_ends);
    free(c->names);
}

/* Where headers come from: a buffer (bytes, mmap), or a file read with pread.
 *
 * Reading headers with pread instead of touching a memory map avoids a page fault per
 * header, which on large members is most of the cost (several times a pread on some
 * virtual machines). Where headers are dense (small members) they are read in large
 * windows; where they are far apart, one page at each header, which also holds the
 * next header when a small member follows a large one (a .cls after a .jpg). Either
 * way the reads stay within a page or so of each header: the data is not read. */
#define WINDOW (256 * 1024)
#define PAGE 4096
#define DENSE_STRIDE (16 * 1024) /* mean distance between headers below which: windows */

typedef struct {
    const unsigned char *buf; /* the whole archive, or NULL to read from fd */
    int fd;
    int64_t size;
    unsigned char *window;
    int64_t window_start, window_len;
    int64_t mean_stride; /* running mean of the distance between headers */
} Source;

/* The `len` bytes at pos (len <= WINDOW), or NULL on a read error (errno set; 0 if the
   file ended early, which means it shrank after it was mapped). */
static const unsigned char *source_read(Source *src, int64_t pos, int64_t len)
{
    int64_t want, got = 0;
    if (src->buf)
        return src->buf + pos;
    if (pos >= src->window_start && pos + len <= src->window_start + src->window_len)
        return src->window + (pos - src->window_start);
    want = src->mean_stride < DENSE_STRIDE ? WINDOW : PAGE;
    if (want < len)
        want = len;
    if (want > src->size - pos)
        want = src->size - pos;
    while (got < want) {
        ssize_t n = pread(src->fd, src->window + got, (size_t)(want - got), (off_t)(pos + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += n;
    }
    if (got < len)
        return NULL;
    src->window_start = pos;
    src->window_len = got;
    return src->window;
}

/* The header block at pos, `stride` bytes after the one before. */
static const unsigned char *source_block(Source *src, int64_t pos, int64_t stride)
{
    if (!src->buf)
        src->mean_stride += (stride - src->mean_stride) / 8;
    return source_read(src, pos, BLOCK);
}

/* PAX headers
 *
 * Python's tarfile (so webdataset's writer) gives every member a PAX header holding its
 * fractional mtime; GNU tar --format=posix one with atime, ctime and mtime. The
 * reference (ext.py: parse_pax, PendingExtensions) reads every record, checks that it
 * is well formed and valid UTF-8, and acts on only a few keywords: path, size and GNU
 * sparse ones. A PAX header whose records all have one of the keywords below, with
 * ASCII values, is read by the reference and then changes nothing but where its member
 * starts: here it is folded the same way. Anything else (a path, a size, linkpath,
 * hdrcharset, a vendor keyword, a non-ASCII value, a record not exactly as parse_pax
 * accepts it) goes to the reference, which decides and reports. */
#define MAX_PAX_DATA (64 * 1024) /* larger PAX headers go to the reference */

static int harmless_keyword(const unsigned char *key, int64_t len)
{
    static const char *const keywords[] = {"atime", "comment", "ctime", "gid",
                                           "gname", "mtime",   "uid",   "uname"};
    size_t i;
    for (i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if ((int64_t)strlen(keywords[i]) == len && memcmp(keywords[i], key, (size_t)len) == 0)
            return 1;
    return 0;
}

/* 1 if the n bytes at p are PAX records "%d %s=%s\n" that parse_pax accepts, all with a
   harmless keyword and an ASCII value; 0 otherwise. Stricter than parse_pax where that
   is simpler: the length must be at most 9 plain decimal digits, and NUL padding after
   the last record is left to the reference. */
static int pax_harmless(const unsigned char *p, int64_t n)
{
    int64_t pos = 0;
    while (pos < n) {
        int64_t space = pos, length = 0, newline, eq, i;
        while (space < n && space - pos < 9 && p[space] >= '0' && p[space] <= '9')
            length = length * 10 + (p[space++] - '0');
        if (space == pos || space == n || p[space] != ' ')
            return 0;
        if (length <= space - pos || length > n - pos)
            return 0;
        newline = pos + length - 1;
        if (p[newline] != '\n')
            return 0;
        eq = space + 1;
        while (eq < newline && p[eq] != '=')
            eq++;
        if (eq == newline || !harmless_keyword(p + space + 1, eq - space - 1))
            return 0;
        for (i = eq + 1; i < newline; i++)
            if (p[i] >= 0x80)
                return 0;
        pos += length;
    }
    return 1;
}

/* 0: chain ended at a zero block (*end set); 1: hand over to Python; 2: the file ends
   before byte *end + BLOCK (it shrank); -1: out of memory; -2: a read error (errno). */
static int walk_chain(Source *src, Chain *chain, int64_t *end)
{
    int64_t pos = 0, size = src->size, member_size = 0, stride = 0;
    int64_t first_pax = -1; /* the first PAX header since the last member, if any */
    for (;;) {
        const unsigned char *h;
        int64_t stored, field_value;
        int64_t unsigned_sum = 0, signed_sum = 0;
        unsigned char type;
        int i;
        if (pos + BLOCK > size)
            return 1;
        errno = 0;
        h = source_block(src, pos, stride);
        if (!h) {
            *end = pos;
            return errno ? -2 : 2;
        }
        if (is_zero_block(h)) {
            *end = pos;
            return first_pax < 0 ? 0 : 1; /* a PAX header with no member after it */
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
        if (type == 'x' || type == 'g') {
            /* Its records come next; `h` is not used again (a read may replace it). */
            const unsigned char *records = NULL;
            if (member_size > MAX_PAX_DATA || pos + BLOCK + member_size > size)
                return 1;
            if (member_size) {
                errno = 0;
                records = source_read(src, pos + BLOCK, member_size);
                if (!records) {
                    *end = pos + member_size; /* the file ends before byte *end + BLOCK */
                    return errno ? -2 : 2;
                }
            }
            if (!pax_harmless(records, member_size))
                return 1;
            if (first_pax < 0)
                first_pax = pos;
            chain->extensions++;
        } else {
            if (type == 'L' || type == 'K' || type == 'S' || type == 'M')
                return 1;
            if (type >= '1' && type <= '6')
                member_size = 0;
            if (chain_push(chain, pos, first_pax < 0 ? pos : first_pax, member_size, type) != 0 ||
                chain_name(chain, h) != 0)
                return -1;
            first_pax = -1;
        }
        stride = BLOCK + (member_size + BLOCK - 1) / BLOCK * BLOCK;
        pos += stride;
        if (pos > size)
            return 1;
    }
}

/* The names as str, or None if one is not valid UTF-8 (the Python scanner then says
   which). */
static PyObject *chain_names(const Chain *c)
{
    PyObject *list = PyList_New(c->count);
    int64_t start = 0;
    Py_ssize_t i;
    for (i = 0; list && i < c->count; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(c->names + start, c->name_ends[i] - start, "strict");
        if (!s) {
            Py_DECREF(list);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return NULL;
            PyErr_Clear();
            return Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(list, i, s);
        start = c->name_ends[i];
    }
    return list;
}

static PyObject *walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Chain chain = {0};
    Source src = {0};
    int64_t end = 0;
    int status, fd = -1;
    PyObject *result = NULL, *names = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*|i", &view, &fd))
        return NULL;
    src.size = (int64_t)view.len;
    src.fd = fd;
    if (fd >= 0) {
        src.window = malloc(WINDOW);
        if (!src.window) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
    } else {
        src.buf = (const unsigned char *)view.buf;
    }
    Py_BEGIN_ALLOW_THREADS
    status = walk_chain(&src, &chain, &end);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    free(src.window);
    if (status == -1) {
        PyErr_NoMemory();
    } else if (status == -2) {
        PyErr_SetFromErrno(PyExc_OSError);
    } else if (status == 1 || status == 2) {
        result = Py_BuildValue("(iLOOOOOi)", status, (long long)end, Py_None, Py_None, Py_None,
                               Py_None, Py_None, 0);
    } else if ((names = chain_names(&chain)) != NULL) {
        static const char empty[1] = {0};
        Py_ssize_t bytes = chain.count * (Py_ssize_t)sizeof(int64_t);
        PyObject *starts = chain.extensions
                               ? PyBytes_FromStringAndSize((const char *)chain.starts, bytes)
                               : Py_NewRef(Py_None);
        if (!starts) {
            Py_DECREF(names);
        } else {
            result = Py_BuildValue(
                "(iLy#Ny#y#Nn)", 0, (long long)end,
                chain.count ? (const char *)chain.offsets : empty, bytes, starts,
                chain.count ? (const char *)chain.sizes : empty, bytes,
                chain.count ? (const char *)chain.types : empty, chain.count, names,
                chain.extensions);
        }
    }
    chain_free(&chain);
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
    {"walk", walk, METH_VARARGS,
     "walk(buffer, fd=-1) -> (status, end, offsets, starts, sizes, types, names, extensions)"},
    {"group", group, METH_VARARGS, "group(names, rows) -> (first, keys, ext_codes, exts) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "indextar.tar._tarwalk", "The common case of tar scanning, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__tarwalk(void) { return PyModule_Create(&module); }
