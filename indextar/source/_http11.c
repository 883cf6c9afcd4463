/* The direct S3 client's per-answer work in C (indextar/source/http11.py).
 *
 * parse_head(buffer, end): an HTTP/1.x response head, bytes 0 .. end of buffer (the
 * status line and its header lines, without the blank line), as
 * (version, status, reason, headers): what http11.parse_head_py gives, built without
 * the dozens of str objects its split, partition, strip and lower make. Only the
 * common case: an ASCII head whose status code is 1-9 digits. Anything else (a byte
 * of 0x80 or more, whose latin-1 strip and lower are Unicode's; a code with signs,
 * spaces or underscores; a status line that is not HTTP/1.x) returns None, and the
 * Python reference parses it, or raises the error it raises.
 *
 * unfilled(n): a bytearray of n bytes that are not zeroed first, for a body that is
 * received into it whole (recv_into) before anyone reads it: bytearray(n) writes n
 * zeros that the answer overwrites at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* str.strip()'s whitespace among ASCII characters */
static int is_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

static PyObject *stripped(const char *start, const char *end, int lower) {
    while (start < end && is_space((unsigned char)*start)) start++;
    while (end > start && is_space((unsigned char)end[-1])) end--;
    Py_ssize_t n = end - start;
    PyObject *s = PyUnicode_New(n, 127);
    if (s == NULL) return NULL;
    char *out = (char *)PyUnicode_DATA(s);
    if (lower) {
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)start[i];
            out[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        }
    } else {
        memcpy(out, start, (size_t)n);
    }
    return s;
}

/* The next "\r\n" in at .. end, or end. */
static const char *line_end(const char *at, const char *end) {
    while (at + 1 < end) {
        const char *cr = memchr(at, '\r', (size_t)(end - at - 1));
        if (cr == NULL) return end;
        if (cr[1] == '\n') return cr;
        at = cr + 1;
    }
    return end;
}

static PyObject *parse_head(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*n", &view, &size)) return NULL;
    PyObject *result = NULL, *version = NULL, *reason = NULL, *headers = NULL;
    const char *head = (const char *)view.buf;
    if (size < 0 || size > view.len) {
        PyErr_SetString(PyExc_ValueError, "end outside the buffer");
        goto done;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        if ((unsigned char)head[i] >= 0x80) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    const char *end = head + size, *first_end = line_end(head, end);
    /* the status line: version SP code SP reason (each split at the first space) */
    const char *space = memchr(head, ' ', (size_t)(first_end - head));
    const char *code = space ? space + 1 : first_end;
    const char *code_end = space ? memchr(code, ' ', (size_t)(first_end - code)) : NULL;
    const char *reason_at = code_end ? code_end + 1 : first_end;
    if (code_end == NULL) code_end = first_end;
    const char *version_end = space ? space : first_end;
    if (version_end - head < 7 || memcmp(head, "HTTP/1.", 7) != 0 || code_end == code ||
        code_end - code > 9) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    long status = 0;
    for (const char *c = code; c < code_end; c++) {
        if (*c < '0' || *c > '9') {
            result = Py_NewRef(Py_None);
            goto done;
        }
        status = status * 10 + (*c - '0');
    }
    version = PyUnicode_FromStringAndSize(head, version_end - head);
    reason = PyUnicode_FromStringAndSize(reason_at, first_end - reason_at);
    headers = PyDict_New();
    if (version == NULL || reason == NULL || headers == NULL) goto done;
    const char *at = first_end;
    while (at < end) {
        at += 2; /* past the CRLF */
        if (at > end) break;
        const char *stop = line_end(at, end);
        const char *colon = memchr(at, ':', (size_t)(stop - at));
        PyObject *name = stripped(at, colon ? colon : stop, 1);
        PyObject *value = colon ? stripped(colon + 1, stop, 0) : PyUnicode_New(0, 127);
        if (name == NULL || value == NULL) {
            Py_XDECREF(name);
            Py_XDECREF(value);
            goto done;
        }
        PyObject *before = PyDict_GetItemWithError(headers, name);
        if (before != NULL) {
            PyObject *joined = PyUnicode_FromFormat("%U, %U", before, value);
            Py_DECREF(value);
            value = joined;
        } else if (PyErr_Occurred()) {
            Py_DECREF(value);
            value = NULL;
        }
        int failed = value == NULL || PyDict_SetItem(headers, name, value) < 0;
        Py_DECREF(name);
        Py_XDECREF(value);
        if (failed) goto done;
        at = stop;
    }
    PyObject *code_obj = PyLong_FromLong(status);
    if (code_obj == NULL) goto done;
    result = PyTuple_Pack(4, version, code_obj, reason, headers);
    Py_DECREF(code_obj);
done:
    Py_XDECREF(version);
    Py_XDECREF(reason);
    Py_XDECREF(headers);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *unfilled(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative size");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}

static PyMethodDef methods[] = {
    {"parse_head", parse_head, METH_VARARGS,
     "parse_head(buffer, end) -> (version, status, reason, headers) or None"},
    {"unfilled", unfilled, METH_O, "unfilled(n) -> a bytearray of n bytes, not zeroed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_http11", "The direct S3 client's answer parsing in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__http11(void) { return PyModule_Create(&module); }
