/* A gzip file decompressed and checked in one pass, its seek points placed on the way.
 *
 * gunzip(data, spacing[, level]) -> (bytearray, members, points, error, windows)
 *
 *   data      the whole compressed file (any buffer: an mmap, bytes)
 *   spacing   uncompressed bytes between seek points (at least 64 KiB)
 *   level     with a zlib level (0-9), the windows are made too, sparse and compressed,
 *             on a second thread as the pass goes (see "Sparse windows" below)
 *
 *   bytearray the decompressed bytes of every gzip member, one after the other
 *   members   [(compressed_offset, compressed_size, uncompressed_offset, uncompressed_size)]
 *             per gzip member
 *   points    [(compressed_offset, bits, uncompressed_offset, has_window)]: one at the
 *             start of each member's deflate data (after its header; no window needed),
 *             and one at the first deflate block boundary at least ``spacing`` bytes after
 *             the last point (its window is the 32 KiB of output before it). This is
 *             zran's rule (indexed_gzip's _zran_expand_index), so the points are those
 *             indexed_gzip would place, and it reads from them.
 *   error     None, or (kind, member_start, chunk_start, chunk_end, message) where kind is
 *             "truncated" (the data ends inside a member) or "corrupt" (zlib refused the
 *             bytes in [chunk_start, chunk_end): a bad header, a bad deflate block, a
 *             CRC32 or ISIZE that does not match; trailing garbage is a member whose
 *             header is bad)
 *   windows   without a level, None; else the window of every point with has_window
 *             (in order), sparse and zlib-compressed ([] after an error)
 *
 * zlib checks every member's CRC32 and ISIZE itself (windowBits 31: gzip only). Input is
 * fed in chunks that grow from 4 KiB to 1 MiB, as the Python reference feeds it, so an
 * error names the same byte range. The GIL is released while zlib inflates.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define MIN_OUT_SPACE (256 * 1024)
#define MAX_CHUNK (1 << 20)
#define WINDOW 32768
#define SEEN_BYTES (256 * 256 / 8) /* a bit per (low byte, value) pair */
/* make_window's scratch: the sparse window, the probe's output, the seen pairs */
#define SCRATCH (2 * WINDOW + SEEN_BYTES)

/* Sparse windows.
 *
 * A point's 32 KiB window with every byte that decompression from the point cannot
 * reference set to zero: what is left compresses to little, and zlib reads from the
 * point exactly as with the whole window.
 *
 * Only the first 32 KiB of output after a point can reach back into its window (a
 * deflate distance is at most 32 KiB), and the parse of the compressed bits (literals,
 * lengths, distances) does not depend on the window's bytes. So those 32 KiB are
 * inflated once more with a probe window whose byte i is i & 0xFF. An output byte at p
 * copied from window position s is probe[s] = s & 0xFF in the probe run and window[s]
 * in the real output; a literal is the same in both. Kept are:
 *   - every s whose real byte equals s & 0xFF (a copy from there looks like a literal);
 *   - for each p where the runs differ, every s with s & 0xFF == probe output[p] and
 *     window[s] == real output[p] (a superset of the true source; a 256 x 256 bit table
 *     of the (low byte, value) pairs seen makes this one pass over the window).
 * A point whose probe inflate fails (it cannot: the build just decompressed the file)
 * keeps its whole window.
 */
static unsigned char probe[WINDOW]; /* byte i is i & 0xFF: filled when the module loads */

static void sparse_window(const unsigned char *compressed, Py_ssize_t compressed_size,
                          Py_ssize_t c_offset, int bits, const unsigned char *window,
                          const unsigned char *real, Py_ssize_t real_size, unsigned char *sparse,
                          unsigned char *probe_out, unsigned char *seen)
{
    const Py_ssize_t want = real_size < WINDOW ? real_size : WINDOW;
    int ok = 0;
    z_stream strm;
    memset(&strm, 0, sizeof(strm));
    if (want >= 0 && c_offset <= compressed_size && (bits == 0 || c_offset >= 1) &&
        inflateInit2(&strm, -15) == Z_OK) {
        if ((bits == 0 ||
             inflatePrime(&strm, bits, compressed[c_offset - 1] >> (8 - bits)) == Z_OK) &&
            inflateSetDictionary(&strm, probe, WINDOW) == Z_OK) {
            strm.next_in = (unsigned char *)compressed + c_offset;
            strm.avail_in = (uInt)(compressed_size - c_offset > (1 << 30)
                                       ? (1 << 30)
                                       : compressed_size - c_offset);
            strm.next_out = probe_out;
            strm.avail_out = (uInt)want;
            int ret = Z_OK;
            while (strm.avail_out > 0 && ret == Z_OK)
                ret = inflate(&strm, Z_NO_FLUSH);
            ok = strm.avail_out == 0 || ret == Z_STREAM_END;
        }
        inflateEnd(&strm);
    }
    if (!ok) {
        memcpy(sparse, window, WINDOW);
        return;
    }
    const Py_ssize_t produced = want - strm.avail_out;
    memset(seen, 0, SEEN_BYTES);
    Py_ssize_t p = 0;
    for (; p + 8 <= produced; p += 8) { /* literals agree: most words are skipped whole */
        uint64_t a, b;
        memcpy(&a, probe_out + p, 8);
        memcpy(&b, real + p, 8);
        if (a == b)
            continue;
        for (Py_ssize_t q = p; q < p + 8; q++) {
            const unsigned pair = ((unsigned)probe_out[q] << 8) | real[q];
            seen[pair >> 3] |= (unsigned char)((probe_out[q] != real[q]) << (pair & 7));
        }
    }
    for (; p < produced; p++) {
        const unsigned pair = ((unsigned)probe_out[p] << 8) | real[p];
        seen[pair >> 3] |= (unsigned char)((probe_out[p] != real[p]) << (pair & 7));
    }
    for (unsigned low = 0; low < 256; low++) { /* a copy from s where window[s] == s & 0xFF */
        const unsigned pair = (low << 8) | low;
        seen[pair >> 3] |= (unsigned char)(1u << (pair & 7));
    }
    for (int s = 0; s < WINDOW; s++) {
        const unsigned char value = window[s];
        const unsigned pair = ((unsigned)(s & 0xFF) << 8) | value;
        sparse[s] = value & (unsigned char)-((seen[pair >> 3] >> (pair & 7)) & 1);
    }
}

/* The window of the point at uncompressed offset u of data: the WINDOW bytes before it,
   zero-filled before the start, as zran's. */
static void whole_window(const unsigned char *data, Py_ssize_t u, unsigned char *window)
{
    if (u >= WINDOW) {
        memcpy(window, data + u - WINDOW, WINDOW);
    } else {
        memset(window, 0, WINDOW - u);
        memcpy(window + WINDOW - u, data, u);
    }
}

/* One window made sparse and compressed: into out (compressBound(WINDOW) bytes), its
   size returned, or -1. scratch: SCRATCH bytes. */
static Py_ssize_t make_window(z_stream *deflater, const unsigned char *compressed,
                              Py_ssize_t compressed_size, Py_ssize_t c_offset, int bits,
                              const unsigned char *window, const unsigned char *real,
                              Py_ssize_t real_size, unsigned char *scratch, unsigned char *out,
                              uLong bound)
{
    sparse_window(compressed, compressed_size, c_offset, bits, window, real, real_size, scratch,
                  scratch + WINDOW, scratch + 2 * WINDOW);
    deflater->next_in = scratch;
    deflater->avail_in = WINDOW;
    deflater->next_out = out;
    deflater->avail_out = (uInt)bound;
    const int ended = deflate(deflater, Z_FINISH) == Z_STREAM_END;
    const Py_ssize_t made = (Py_ssize_t)(bound - deflater->avail_out);
    return ended && deflateReset(deflater) == Z_OK ? made : -1;
}

/* The windows made beside gunzip's pass, on a thread of their own: gunzip hands it each
 * point as it places it and how much output there is; the thread takes a point once
 * the 32 KiB of output after it exist (or the pass is over), copying what it needs out
 * of the growing output under the lock (gunzip moves the buffer when it grows it, under
 * the same lock). The thread touches no Python object. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    const unsigned char *compressed;
    Py_ssize_t compressed_size;
    const unsigned char *out; /* gunzip's output and its length, under lock */
    Py_ssize_t out_len;
    Py_ssize_t *points; /* (compressed_offset, bits, uncompressed_offset) triples */
    unsigned char **windows; /* the compressed sparse windows, malloc'd */
    Py_ssize_t *sizes;
    Py_ssize_t count, capacity;
    int level, done, failed;
} window_job;

static void *window_job_run(void *arg)
{
    window_job *job = arg;
    const uLong bound = compressBound(WINDOW);
    unsigned char *scratch = malloc(SCRATCH + 2 * WINDOW + bound);
    z_stream deflater;
    memset(&deflater, 0, sizeof(deflater));
    const int deflating =
        scratch != NULL && deflateInit2(&deflater, job->level, Z_DEFLATED, 15, 8,
                                        Z_DEFAULT_STRATEGY) == Z_OK;
    unsigned char *around = scratch + SCRATCH; /* window, then output */
    unsigned char *packed = scratch + SCRATCH + 2 * WINDOW;
    pthread_mutex_lock(&job->lock);
    if (!deflating)
        job->failed = 1;
    for (Py_ssize_t k = 0; !job->failed; k++) {
        while (!job->done && (k >= job->count || job->out_len < job->points[3 * k + 2] + WINDOW))
            pthread_cond_wait(&job->wake, &job->lock);
        if (k >= job->count)
            break; /* the pass is over and every point has its window */
        const Py_ssize_t c = job->points[3 * k], u = job->points[3 * k + 2];
        const int bits = (int)job->points[3 * k + 1];
        Py_ssize_t after = job->out_len - u;
        after = after < 0 ? 0 : (after > WINDOW ? WINDOW : after);
        whole_window(job->out, u, around);
        memcpy(around + WINDOW, job->out + u, after);
        pthread_mutex_unlock(&job->lock);
        const Py_ssize_t made = make_window(&deflater, job->compressed, job->compressed_size, c,
                                            bits, around, around + WINDOW, after, scratch, packed,
                                            bound);
        unsigned char *window = made >= 0 ? malloc(made > 0 ? made : 1) : NULL;
        if (window != NULL)
            memcpy(window, packed, made);
        pthread_mutex_lock(&job->lock);
        if (window == NULL) {
            job->failed = 1;
            break;
        }
        job->windows[k] = window;
        job->sizes[k] = made;
    }
    pthread_mutex_unlock(&job->lock);
    if (deflating)
        deflateEnd(&deflater);
    free(scratch);
    return NULL;
}

/* gunzip placed a point that needs a window: 0, or -1 with a MemoryError set. */
static int window_job_add(window_job *job, Py_ssize_t c, int bits, Py_ssize_t u)
{
    pthread_mutex_lock(&job->lock);
    if (job->count == job->capacity) {
        const Py_ssize_t capacity = job->capacity ? 2 * job->capacity : 256;
        Py_ssize_t *points = realloc(job->points, sizeof(Py_ssize_t) * 3 * capacity);
        if (points != NULL)
            job->points = points;
        unsigned char **windows = realloc(job->windows, sizeof(unsigned char *) * capacity);
        if (windows != NULL)
            job->windows = windows;
        Py_ssize_t *sizes = realloc(job->sizes, sizeof(Py_ssize_t) * capacity);
        if (sizes != NULL)
            job->sizes = sizes;
        if (points == NULL || windows == NULL || sizes == NULL) {
            pthread_mutex_unlock(&job->lock);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t k = job->capacity; k < capacity; k++)
            job->windows[k] = NULL;
        job->capacity = capacity;
    }
    job->points[3 * job->count] = c;
    job->points[3 * job->count + 1] = bits;
    job->points[3 * job->count + 2] = u;
    job->count++;
    pthread_cond_signal(&job->wake);
    pthread_mutex_unlock(&job->lock);
    return 0;
}

static void window_job_progress(window_job *job, const unsigned char *out, Py_ssize_t out_len)
{
    pthread_mutex_lock(&job->lock);
    job->out = out;
    job->out_len = out_len;
    pthread_cond_signal(&job->wake);
    pthread_mutex_unlock(&job->lock);
}

/* The pass is over: the thread makes the windows left (finish) or none, and ends. */
static void window_job_stop(window_job *job, pthread_t thread, int finish)
{
    pthread_mutex_lock(&job->lock);
    job->done = 1;
    if (!finish)
        job->count = 0;
    pthread_cond_signal(&job->wake);
    pthread_mutex_unlock(&job->lock);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(thread, NULL);
    Py_END_ALLOW_THREADS
}

static void window_job_free(window_job *job)
{
    for (Py_ssize_t k = 0; k < job->capacity; k++)
        free(job->windows[k]);
    free(job->windows);
    free(job->points);
    free(job->sizes);
    pthread_mutex_destroy(&job->lock);
    pthread_cond_destroy(&job->wake);
}


static int append_tuple(PyObject *list, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    PyObject *row = Py_VaBuildValue(format, args);
    va_end(args);
    if (row == NULL)
        return -1;
    int status = PyList_Append(list, row);
    Py_DECREF(row);
    return status;
}

static PyObject *gunzip(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned long long spacing;
    int level = -1;
    if (!PyArg_ParseTuple(args, "y*K|i", &view, &spacing, &level))
        return NULL;
    if (level < -1 || level > 9) { /* else the windows' thread would fail, after the pass */
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "gunzip: level %d is not a zlib level (0-9) or -1", level);
        return NULL;
    }
    const unsigned char *base = view.buf;
    const Py_ssize_t size = view.len;
    PyObject *out = NULL, *members = NULL, *points = NULL, *error = NULL, *result = NULL;
    PyObject *windows = NULL;
    z_stream strm;
    memset(&strm, 0, sizeof(strm));
    int z_ready = 0;
    window_job job;
    memset(&job, 0, sizeof(job));
    window_job *jobs = NULL; /* &job while its thread runs */
    int job_ready = 0;
    pthread_t thread;

    Py_ssize_t capacity = size < (1 << 16) ? (1 << 17) : 2 * size;
    out = PyByteArray_FromStringAndSize(NULL, capacity);
    members = PyList_New(0);
    points = PyList_New(0);
    if (out == NULL || members == NULL || points == NULL)
        goto done;
    if (inflateInit2(&strm, 31) != Z_OK) {
        PyErr_SetString(PyExc_MemoryError, "zlib could not start an inflate stream");
        goto done;
    }
    z_ready = 1;
    if (level >= 0) {
        pthread_mutex_init(&job.lock, NULL);
        pthread_cond_init(&job.wake, NULL);
        job.compressed = base;
        job.compressed_size = size;
        job.out = (const unsigned char *)PyByteArray_AS_STRING(out);
        job.level = level;
        if (pthread_create(&thread, NULL, window_job_run, &job) != 0) {
            window_job_free(&job);
            PyErr_SetString(PyExc_RuntimeError, "could not start the windows' thread");
            goto done;
        }
        jobs = &job;
        job_ready = 1;
    }

    Py_ssize_t out_len = 0; /* bytes written to out */
    Py_ssize_t fed = 0;     /* input bytes handed to zlib so far */
    Py_ssize_t chunk_start = 0, chunk_end = 0;
    /* Input is fed in contiguous slices of data, so next_in - base is always the
       absolute offset of the next byte zlib has not consumed. */
    while ((strm.next_in == NULL ? 0 : strm.next_in - base) < size) {
        const Py_ssize_t member_start = strm.next_in == NULL ? 0 : strm.next_in - base;
        const Py_ssize_t u_start = out_len;
        Py_ssize_t last_point = out_len;
        int in_header = 1, ret = Z_OK;
        Py_ssize_t chunk = 4096;
        if (inflateReset(&strm) != Z_OK) {
            PyErr_SetString(PyExc_RuntimeError, "zlib could not reset its inflate stream");
            goto done;
        }
        for (;;) {
            if (strm.avail_in == 0) {
                if (fed >= size) {
                    error = Py_BuildValue("(snnns)", "truncated", member_start, chunk_start,
                                          chunk_end, "the data ends inside the member");
                    goto finish;
                }
                const Py_ssize_t n = size - fed < chunk ? size - fed : chunk;
                strm.next_in = (unsigned char *)base + fed;
                strm.avail_in = (uInt)n;
                chunk_start = fed;
                chunk_end = fed + n;
                fed += n;
                chunk = chunk * 2 > MAX_CHUNK ? MAX_CHUNK : chunk * 2;
            }
            if (capacity - out_len < MIN_OUT_SPACE) {
                capacity = capacity * 2;
                if (jobs != NULL)
                    pthread_mutex_lock(&job.lock); /* the buffer moves: not while read */
                const int failed = PyByteArray_Resize(out, capacity) != 0;
                if (jobs != NULL) {
                    job.out = (const unsigned char *)PyByteArray_AS_STRING(out);
                    pthread_mutex_unlock(&job.lock);
                }
                if (failed)
                    goto done;
            }
            unsigned char *dest = (unsigned char *)PyByteArray_AS_STRING(out) + out_len;
            const uInt space = (uInt)((capacity - out_len) > (1 << 30) ? (1 << 30)
                                                                        : (capacity - out_len));
            strm.next_out = dest;
            strm.avail_out = space;
            Py_BEGIN_ALLOW_THREADS
            ret = inflate(&strm, Z_BLOCK);
            Py_END_ALLOW_THREADS
            out_len += space - strm.avail_out;
            if (jobs != NULL)
                window_job_progress(&job, (unsigned char *)PyByteArray_AS_STRING(out), out_len);
            if (ret == Z_STREAM_END)
                break;
            if (ret == Z_BUF_ERROR && (strm.avail_in == 0 || strm.avail_out == 0))
                continue; /* needs more input or more room: the loop gives it */
            if (ret != Z_OK) {
                error = Py_BuildValue("(snnns)", "corrupt", member_start, chunk_start, chunk_end,
                                      strm.msg != NULL ? strm.msg : "zlib error");
                goto finish;
            }
            if (strm.data_type & 128) {
                const Py_ssize_t at = strm.next_in - base;
                if (in_header) {
                    in_header = 0;
                    last_point = out_len;
                    if (append_tuple(points, "(nini)", at, 0, out_len, 0) != 0)
                        goto done;
                } else if (!(strm.data_type & 64) &&
                           (unsigned long long)(out_len - last_point) >= spacing) {
                    last_point = out_len;
                    if (append_tuple(points, "(nini)", at, strm.data_type & 7, out_len, 1) != 0)
                        goto done;
                    if (jobs != NULL && window_job_add(&job, at, strm.data_type & 7, out_len) != 0)
                        goto done;
                }
            }
        }
        const Py_ssize_t member_end = strm.next_in - base;
        if (append_tuple(members, "(nnnn)", member_start, member_end - member_start, u_start,
                         out_len - u_start) != 0)
            goto done;
    }
finish:
    if (jobs != NULL) { /* every window made from the whole output, or none on an error */
        window_job_stop(&job, thread, error == NULL);
        jobs = NULL;
        if (job.failed) {
            PyErr_SetString(PyExc_MemoryError, "could not make the seek points' windows");
            goto done;
        }
        windows = PyList_New(error == NULL ? job.count : 0);
        if (windows == NULL)
            goto done;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(windows); k++) {
            PyObject *window = PyBytes_FromStringAndSize((char *)job.windows[k], job.sizes[k]);
            if (window == NULL)
                goto done;
            PyList_SET_ITEM(windows, k, window);
        }
    } else {
        windows = Py_None;
        Py_INCREF(windows);
    }
    if (PyByteArray_Resize(out, out_len) != 0)
        goto done;
    if (error == NULL) {
        error = Py_None;
        Py_INCREF(error);
    }
    result = PyTuple_Pack(5, out, members, points, error, windows);
done:
    if (jobs != NULL) /* an error before the end: stop the thread */
        window_job_stop(&job, thread, 0);
    if (job_ready)
        window_job_free(&job);
    Py_XDECREF(windows);
    if (z_ready)
        inflateEnd(&strm);
    Py_XDECREF(out);
    Py_XDECREF(members);
    Py_XDECREF(points);
    Py_XDECREF(error);
    PyBuffer_Release(&view);
    return result;
}

/* sparse_windows(compressed, data, points, level) -> list of bytes
 *
 *   compressed  the whole gzip file
 *   data        its decompressed bytes
 *   points      [(compressed_offset, bits, uncompressed_offset)], each needing a window
 *
 * Each point's sparse window, zlib-compressed at ``level`` (what gunzip makes when given
 * a level, for points placed elsewhere). The GIL is released while they are made.
 */
static PyObject *sparse_windows(PyObject *self, PyObject *args)
{
    Py_buffer compressed, data;
    PyObject *points;
    int level;
    if (!PyArg_ParseTuple(args, "y*y*Oi", &compressed, &data, &points, &level))
        return NULL;
    PyObject *result = NULL, *rows = PySequence_Fast(points, "points must be a sequence");
    PyObject **objects = NULL;
    Py_ssize_t *where = NULL, *sizes = NULL, count = 0;
    unsigned char *scratch = NULL;
    const uLong bound = compressBound(WINDOW);
    int failed = 0, deflating = 0;
    z_stream deflater;
    memset(&deflater, 0, sizeof(deflater));
    if (rows == NULL)
        goto done;
    count = PySequence_Fast_GET_SIZE(rows);
    where = PyMem_Malloc(sizeof(Py_ssize_t) * 3 * (count ? count : 1));
    objects = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    sizes = PyMem_Malloc(sizeof(Py_ssize_t) * (count ? count : 1));
    scratch = PyMem_Malloc(SCRATCH + WINDOW);
    if (where == NULL || objects == NULL || sizes == NULL || scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t n = 0; n < count; n++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, n);
        if (!PyArg_ParseTuple(row, "nnn", &where[3 * n], &where[3 * n + 1], &where[3 * n + 2]))
            goto done;
        if (where[3 * n] < 0 || where[3 * n] > compressed.len || where[3 * n + 1] < 0 ||
            where[3 * n + 1] > 7 || where[3 * n + 2] < 0 || where[3 * n + 2] > data.len) {
            PyErr_Format(PyExc_ValueError, "seek point %zd is outside the file", n);
            goto done;
        }
        objects[n] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound);
        if (objects[n] == NULL)
            goto done;
    }
    if (deflateInit2(&deflater, level, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        PyErr_SetString(PyExc_ValueError, "zlib could not start a deflate stream at that level");
        goto done;
    }
    deflating = 1;
    Py_BEGIN_ALLOW_THREADS
    unsigned char *window = scratch + SCRATCH;
    for (Py_ssize_t n = 0; n < count && !failed; n++) {
        const Py_ssize_t u = where[3 * n + 2];
        whole_window(data.buf, u, window);
        sizes[n] = make_window(&deflater, compressed.buf, compressed.len, where[3 * n],
                               (int)where[3 * n + 1], window, (const unsigned char *)data.buf + u,
                               data.len - u, scratch,
                               (unsigned char *)PyBytes_AS_STRING(objects[n]), bound);
        failed = sizes[n] < 0;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_MemoryError, "zlib could not compress a window");
        goto done;
    }
    result = PyList_New(count);
    if (result == NULL)
        goto done;
    for (Py_ssize_t n = 0; n < count; n++) {
        if (_PyBytes_Resize(&objects[n], sizes[n]) != 0) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, n, objects[n]);
        objects[n] = NULL;
    }
done:
    if (deflating)
        deflateEnd(&deflater);
    if (objects != NULL)
        for (Py_ssize_t n = 0; n < count; n++)
            Py_XDECREF(objects[n]);
    PyMem_Free(objects);
    PyMem_Free(where);
    PyMem_Free(sizes);
    PyMem_Free(scratch);
    Py_XDECREF(rows);
    PyBuffer_Release(&compressed);
    PyBuffer_Release(&data);
    return result;
}

/* inflate_from(compressed, bits, window, length) -> bytes
 *
 *   compressed  the file's bytes from the seek point on: when ``bits`` is not 0, the
 *               first byte is the one whose top ``bits`` bits start the point's data
 *   window      the point's 32 KiB window (empty for a point at a member's start)
 *   length      uncompressed bytes wanted from the point
 *
 * The first ``length`` bytes decompressed from the point, fewer where ``compressed``
 * ends first (the caller gives enough, so fewer means a truncated file). Decompression
 * goes on across gzip members: each later member's header is parsed and its CRC32 and
 * length checked by zlib. A corrupt block raises ValueError("offset: message"), the
 * offset being into ``compressed`` of the input zlib had consumed. The GIL is released
 * while zlib inflates.
 */
static PyObject *inflate_from(PyObject *self, PyObject *args)
{
    Py_buffer compressed, window;
    int bits;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "y*iy*n", &compressed, &bits, &window, &length))
        return NULL;
    PyObject *out = NULL;
    z_stream strm;
    memset(&strm, 0, sizeof(strm));
    int z_ready = 0;
    if (bits < 0 || bits > 7 || length < 0 || (bits > 0 && compressed.len < 1) ||
        (window.len != 0 && window.len != WINDOW)) {
        PyErr_SetString(PyExc_ValueError, "inflate_from: bad bits, length or window size");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, length);
    if (out == NULL)
        goto done;
    if (inflateInit2(&strm, -15) != Z_OK) {
        PyErr_SetString(PyExc_MemoryError, "zlib could not start an inflate stream");
        goto done;
    }
    z_ready = 1;
    const unsigned char *in = compressed.buf;
    Py_ssize_t start = 0;
    if (bits > 0) {
        inflatePrime(&strm, bits, in[0] >> (8 - bits));
        start = 1;
    }
    if (window.len != 0)
        inflateSetDictionary(&strm, window.buf, WINDOW);
    strm.next_in = (unsigned char *)in + start;
    strm.avail_in = (uInt)(compressed.len - start > (1 << 30) ? (1 << 30) : compressed.len - start);
    unsigned char *dest = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t produced = 0;
    int ret = Z_OK, raw = 1;
    const char *message = NULL;
    Py_BEGIN_ALLOW_THREADS
    while (produced < length) {
        const Py_ssize_t room = length - produced;
        strm.next_out = dest + produced;
        strm.avail_out = (uInt)(room > (1 << 30) ? (1 << 30) : room);
        const uInt before = strm.avail_out;
        if (strm.avail_in == 0) {
            const Py_ssize_t at = (const unsigned char *)strm.next_in - in;
            if (at >= compressed.len)
                break; /* the input ends: the caller reports the short read */
            const Py_ssize_t left = compressed.len - at;
            strm.avail_in = (uInt)(left > (1 << 30) ? (1 << 30) : left);
        }
        ret = inflate(&strm, Z_NO_FLUSH);
        produced += before - strm.avail_out;
        if (ret == Z_STREAM_END) {
            if (produced >= length)
                break;
            /* The member ends: read on into the next one, header and all. The first
               member's data was read raw, so its 8-byte trailer is skipped here (the
               build checked it); zlib checks every later member's trailer itself. */
            if (raw) { /* what is left of compressed, not of avail_in's 1 GiB slice */
                const Py_ssize_t left = compressed.len - ((const unsigned char *)strm.next_in - in);
                if (left < 8)
                    break; /* truncated: the caller reports the short read */
                strm.next_in += 8;
                strm.avail_in = (uInt)(left - 8 > (1 << 30) ? (1 << 30) : left - 8);
                raw = 0;
            }
            if (strm.avail_in == 0 && (const unsigned char *)strm.next_in - in >= compressed.len)
                break;
            if (inflateReset2(&strm, 31) != Z_OK) {
                message = "zlib could not reset its inflate stream";
                break;
            }
            continue;
        }
        if (ret == Z_BUF_ERROR && strm.avail_in == 0)
            continue; /* more input: the loop gives it, or stops at its end */
        if (ret != Z_OK) {
            message = strm.msg != NULL ? strm.msg : "zlib error";
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (message != NULL) {
        PyErr_Format(PyExc_ValueError, "%zd: %s", (Py_ssize_t)((const unsigned char *)strm.next_in - in),
                     message);
        Py_CLEAR(out);
        goto done;
    }
    if (produced < length)
        _PyBytes_Resize(&out, produced);
done:
    if (z_ready)
        inflateEnd(&strm);
    PyBuffer_Release(&compressed);
    PyBuffer_Release(&window);
    return out;
}

static PyMethodDef methods[] = {
    {"gunzip", gunzip, METH_VARARGS,
     "gunzip(data, spacing[, level]) -> (bytearray, members, points, error, windows): every "
     "gzip member decompressed and checked, the seek points every spacing bytes, and with a "
     "level their sparse windows."},
    {"inflate_from", inflate_from, METH_VARARGS,
     "inflate_from(compressed, bits, window, length) -> bytes: length bytes decompressed "
     "from a seek point (fewer where compressed ends first)."},
    {"sparse_windows", sparse_windows, METH_VARARGS,
     "sparse_windows(compressed, data, points, level) -> [bytes]: each point's 32 KiB "
     "window, the bytes decompression from it cannot reference set to zero, compressed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gunzip",
    "A gzip file decompressed and checked in one pass, its seek points placed on the way.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__gunzip(void)
{
    for (int i = 0; i < WINDOW; i++)
        probe[i] = (unsigned char)i;
    return PyModule_Create(&module);
}
