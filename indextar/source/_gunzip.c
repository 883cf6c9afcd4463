/* A gzip file decompressed and checked in one pass, its seek points placed on the way.
 *
 * gunzip(data, spacing) -> (bytearray, members, points, error)
 *
 *   data      the whole compressed file (any buffer: an mmap, bytes)
 *   spacing   uncompressed bytes between seek points (at least 64 KiB)
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
 *
 * zlib checks every member's CRC32 and ISIZE itself (windowBits 31: gzip only). Input is
 * fed in chunks that grow from 4 KiB to 1 MiB, as the Python reference feeds it, so an
 * error names the same byte range. The GIL is released while zlib inflates.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define MIN_OUT_SPACE (256 * 1024)
#define MAX_CHUNK (1 << 20)

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
    if (!PyArg_ParseTuple(args, "y*K", &view, &spacing))
        return NULL;
    const unsigned char *base = view.buf;
    const Py_ssize_t size = view.len;
    PyObject *out = NULL, *members = NULL, *points = NULL, *error = NULL, *result = NULL;
    z_stream strm;
    memset(&strm, 0, sizeof(strm));
    int z_ready = 0;

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
                if (PyByteArray_Resize(out, capacity) != 0)
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
                }
            }
        }
        const Py_ssize_t member_end = strm.next_in - base;
        if (append_tuple(members, "(nnnn)", member_start, member_end - member_start, u_start,
                         out_len - u_start) != 0)
            goto done;
    }
finish:
    if (PyByteArray_Resize(out, out_len) != 0)
        goto done;
    if (error == NULL) {
        error = Py_None;
        Py_INCREF(error);
    }
    result = PyTuple_Pack(4, out, members, points, error);
done:
    if (z_ready)
        inflateEnd(&strm);
    Py_XDECREF(out);
    Py_XDECREF(members);
    Py_XDECREF(points);
    Py_XDECREF(error);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"gunzip", gunzip, METH_VARARGS,
     "gunzip(data, spacing) -> (bytearray, members, points, error): every gzip member "
     "decompressed and checked, and the seek points every spacing bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gunzip",
    "A gzip file decompressed and checked in one pass, its seek points placed on the way.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__gunzip(void)
{
    return PyModule_Create(&module);
}
