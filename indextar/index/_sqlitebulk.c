/* The bulk rows of a shard index, written through SQLite's C API.
 *
 * insert_rows(path, members, samples) -> None
 * insert_values(path, sql, rows, columns) -> None   (per-sample attributes; see below)
 *
 *   path     the index file; its tables already exist (indextar/schema.sql)
 *   members  (sample_id, names, ext_names, ext_codes, header_offset, data_offset, size)
 *   samples  (keys, first_member, member_count, start_offset, end_offset)
 *
 * Numbers are C-contiguous int64 buffers (numpy arrays); names, keys and ext_names
 * are lists of str, and ext_codes index ext_names. Row ids are the positions. The
 * rows go into `members` and `samples` in one transaction on a connection of this
 * module's own, with the journal off: the file is a temporary one that indextar
 * renames into place only once it is complete.
 *
 * Python's sqlite3 module spends about 1 us per row converting tuples of Python
 * objects; binding straight from the arrays takes a fraction of that, leaving SQLite's
 * own b-tree work. indextar falls back to executemany where this module did not build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sqlite3.h>
#include <stdint.h>

static void raise_sqlite(sqlite3 *db, const char *what)
{
    PyObject *module = PyImport_ImportModule("sqlite3");
    PyObject *type = module ? PyObject_GetAttrString(module, "OperationalError") : NULL;
    const char *message = db ? sqlite3_errmsg(db) : "out of memory";
    PyErr_Clear();
    PyErr_Format(type ? type : PyExc_OSError, "%s: %s", what, message);
    Py_XDECREF(type);
    Py_XDECREF(module);
}

/* An int64 column: a buffer of exactly n items. */
typedef struct {
    Py_buffer view;
    const int64_t *data;
    int held;
} Column;

static int get_column(PyObject *obj, Py_ssize_t n, const char *name, Column *col)
{
    if (PyObject_GetBuffer(obj, &col->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    col->held = 1;
    if (col->view.itemsize != 8 || col->view.len != n * 8
        || (col->view.format && strcmp(col->view.format, "l") != 0
            && strcmp(col->view.format, "q") != 0 && strcmp(col->view.format, "<q") != 0
            && strcmp(col->view.format, "<l") != 0)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd int64 values", name, n);
        return -1;
    }
    col->data = (const int64_t *)col->view.buf;
    return 0;
}

static void release_columns(Column *cols, int n)
{
    for (int i = 0; i < n; i++)
        if (cols[i].held)
            PyBuffer_Release(&cols[i].view);
}

/* Bind a str as UTF-8 text; the pointer lives as long as the str does. */
static int bind_str(sqlite3_stmt *stmt, int column, PyObject *s)
{
    Py_ssize_t len;
    const char *utf8;
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "expected str");
        return -1;
    }
    utf8 = PyUnicode_AsUTF8AndSize(s, &len);
    if (!utf8)
        return -1;
    /* The 64-bit length: a value past SQLite's limit is its SQLITE_TOOBIG, not a
       length cut to an int. */
    return sqlite3_bind_text64(stmt, column, utf8, (sqlite3_uint64)len, SQLITE_STATIC,
                               SQLITE_UTF8) == SQLITE_OK
               ? 0 : -2;
}

/* Row ids are 0, 1, 2, ...: the first one explicit, the rest NULL, which SQLite
   numbers max + 1 and appends without a seek (explicit ids cost a b-tree search). */
static void bind_row_id(sqlite3_stmt *stmt, Py_ssize_t i)
{
    if (i == 0)
        sqlite3_bind_int64(stmt, 1, 0);
    else if (i == 1)
        sqlite3_bind_null(stmt, 1);
}

/* Step a bound statement and reset it; -2 on an SQLite error. */
static int step(sqlite3_stmt *stmt)
{
    int rc = sqlite3_step(stmt);
    sqlite3_reset(stmt);
    return rc == SQLITE_DONE ? 0 : -2;
}

/* Open the index at `path` (a bytes object, released here) for one bulk transaction:
   the journal off, BEGIN issued. NULL with an exception set if it cannot be opened; a
   failed BEGIN is left for finish_bulk to raise (*rc = -2). */
static sqlite3 *begin_bulk(PyObject *path, int *rc)
{
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(PyBytes_AS_STRING(path), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        NULL)
        != SQLITE_OK) {
        raise_sqlite(db, "cannot open the index");
        sqlite3_close(db);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    *rc = sqlite3_exec(db, "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; BEGIN", NULL,
                       NULL, NULL) == SQLITE_OK ? 0 : -2;
    return db;
}

/* Commit if every row went in (rc == 0), raise `what` on an SQLite error (rc == -2),
   close the connection (rolling back an open transaction); None, or NULL on error. */
static PyObject *finish_bulk(sqlite3 *db, int rc, const char *what)
{
    if (rc == 0)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK ? 0 : -2;
    if (rc == -2)
        raise_sqlite(db, what);
    sqlite3_close(db);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int insert_members(sqlite3 *db, PyObject *members)
{
    PyObject *sample_id, *names, *ext_names, *ext_codes, *header, *data, *size;
    Column cols[5] = {{0}};
    sqlite3_stmt *stmt = NULL;
    Py_ssize_t n, n_ext, i;
    int rc = -1;

    if (!PyArg_ParseTuple(members, "OO!O!OOOO;members", &sample_id, &PyList_Type, &names,
                          &PyList_Type, &ext_names, &ext_codes, &header, &data, &size))
        return -1;
    n = PyList_GET_SIZE(names);
    n_ext = PyList_GET_SIZE(ext_names);
    if (get_column(sample_id, n, "sample_id", &cols[0]) < 0
        || get_column(ext_codes, n, "ext_codes", &cols[1]) < 0
        || get_column(header, n, "header_offset", &cols[2]) < 0
        || get_column(data, n, "data_offset", &cols[3]) < 0
        || get_column(size, n, "size", &cols[4]) < 0)
        goto done;
    for (i = 0; i < n; i++) {
        int64_t code = cols[1].data[i];
        if (code < 0 || code >= n_ext) {
            PyErr_Format(PyExc_ValueError, "ext_codes[%zd] = %lld is out of range", i,
                         (long long)code);
            goto done;
        }
    }
    if (sqlite3_prepare_v2(db, "INSERT INTO members (member_id, sample_id, name, ext, header_offset, "
                           "data_offset, size) VALUES (?, ?, ?, ?, ?, ?, ?)", -1, &stmt,
                           NULL) != SQLITE_OK) {
        rc = -2;
        goto done;
    }
    for (i = 0; i < n; i++) {
        bind_row_id(stmt, i);
        sqlite3_bind_int64(stmt, 2, cols[0].data[i]);
        if ((rc = bind_str(stmt, 3, PyList_GET_ITEM(names, i))) < 0
            || (rc = bind_str(stmt, 4, PyList_GET_ITEM(ext_names, cols[1].data[i]))) < 0)
            goto done;
        sqlite3_bind_int64(stmt, 5, cols[2].data[i]);
        sqlite3_bind_int64(stmt, 6, cols[3].data[i]);
        sqlite3_bind_int64(stmt, 7, cols[4].data[i]);
        if ((rc = step(stmt)) < 0)
            goto done;
    }
    rc = 0;
done:
    sqlite3_finalize(stmt);
    release_columns(cols, 5);
    return rc;
}

static int insert_samples(sqlite3 *db, PyObject *samples)
{
    PyObject *keys, *first, *count, *start, *end;
    Column cols[4] = {{0}};
    sqlite3_stmt *stmt = NULL;
    Py_ssize_t n, i;
    int rc = -1;

    if (!PyArg_ParseTuple(samples, "O!OOOO;samples", &PyList_Type, &keys, &first, &count,
                          &start, &end))
        return -1;
    n = PyList_GET_SIZE(keys);
    if (get_column(first, n, "first_member", &cols[0]) < 0
        || get_column(count, n, "member_count", &cols[1]) < 0
        || get_column(start, n, "start_offset", &cols[2]) < 0
        || get_column(end, n, "end_offset", &cols[3]) < 0)
        goto done;
    if (sqlite3_prepare_v2(db, "INSERT INTO samples (sample_id, key, first_member, member_count, "
                           "start_offset, end_offset) VALUES (?, ?, ?, ?, ?, ?)", -1, &stmt,
                           NULL) != SQLITE_OK) {
        rc = -2;
        goto done;
    }
    for (i = 0; i < n; i++) {
        bind_row_id(stmt, i);
        if ((rc = bind_str(stmt, 2, PyList_GET_ITEM(keys, i))) < 0)
            goto done;
        sqlite3_bind_int64(stmt, 3, cols[0].data[i]);
        sqlite3_bind_int64(stmt, 4, cols[1].data[i]);
        sqlite3_bind_int64(stmt, 5, cols[2].data[i]);
        sqlite3_bind_int64(stmt, 6, cols[3].data[i]);
        if ((rc = step(stmt)) < 0)
            goto done;
    }
    rc = 0;
done:
    sqlite3_finalize(stmt);
    release_columns(cols, 4);
    return rc;
}

static PyObject *insert_rows(PyObject *self, PyObject *args)
{
    PyObject *path_obj, *members, *samples;
    sqlite3 *db = NULL;
    int rc;

    if (!PyArg_ParseTuple(args, "O&O!O!:insert_rows", PyUnicode_FSConverter, &path_obj,
                          &PyTuple_Type, &members, &PyTuple_Type, &samples))
        return NULL;
    if (!(db = begin_bulk(path_obj, &rc)))
        return NULL;
    if (rc == 0)
        rc = insert_members(db, members);
    if (rc == 0)
        rc = insert_samples(db, samples);
    return finish_bulk(db, rc, "cannot write the index rows");
}

/* Bind one Python value by its type: None, int (64-bit), float, str, bytes. */
static int bind_value(sqlite3_stmt *stmt, int column, PyObject *value)
{
    if (value == Py_None)
        return sqlite3_bind_null(stmt, column) == SQLITE_OK ? 0 : -2;
    if (PyFloat_Check(value))
        return sqlite3_bind_double(stmt, column, PyFloat_AS_DOUBLE(value)) == SQLITE_OK ? 0 : -2;
    if (PyUnicode_Check(value))
        return bind_str(stmt, column, value);
    if (PyLong_Check(value)) {
        int overflow = 0;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "an attribute integer does not fit 64 bits");
            return -1;
        }
        if (number == -1 && PyErr_Occurred())
            return -1;
        return sqlite3_bind_int64(stmt, column, number) == SQLITE_OK ? 0 : -2;
    }
    if (PyBytes_Check(value))
        return sqlite3_bind_blob64(stmt, column, PyBytes_AS_STRING(value),
                                   (sqlite3_uint64)PyBytes_GET_SIZE(value),
                                   SQLITE_STATIC) == SQLITE_OK
                   ? 0 : -2;
    PyErr_Format(PyExc_TypeError, "cannot store a %s attribute", Py_TYPE(value)->tp_name);
    return -1;
}

/* insert_values(path, sql, rows, columns): `sql` is an INSERT of 1 + len(columns)
 * parameters, the row id (0, 1, 2, ...) then one value from each column, a list of
 * `rows` values each (None, int, float, str or bytes). Per-sample attributes
 * (indextar/index/attributes.py) go in this way: executemany costs about 1 us a row
 * converting its tuples. */
static PyObject *insert_values(PyObject *self, PyObject *args)
{
    PyObject *path_obj, *sql, *columns;
    Py_ssize_t rows, width, i, c;
    const char *sql_text;
    sqlite3 *db = NULL;
    sqlite3_stmt *stmt = NULL;
    int rc;

    if (!PyArg_ParseTuple(args, "O&UnO!:insert_values", PyUnicode_FSConverter, &path_obj, &sql,
                          &rows, &PyList_Type, &columns))
        return NULL;
    width = PyList_GET_SIZE(columns);
    for (c = 0; c < width; c++) {
        PyObject *column = PyList_GET_ITEM(columns, c);
        if (!PyList_Check(column) || PyList_GET_SIZE(column) != rows) {
            Py_DECREF(path_obj);
            PyErr_Format(PyExc_ValueError, "column %zd: expected a list of %zd values", c, rows);
            return NULL;
        }
    }
    sql_text = PyUnicode_AsUTF8(sql);
    if (!sql_text) {
        Py_DECREF(path_obj);
        return NULL;
    }
    if (!(db = begin_bulk(path_obj, &rc)))
        return NULL;
    if (rc == 0 && sqlite3_prepare_v2(db, sql_text, -1, &stmt, NULL) != SQLITE_OK)
        rc = -2;
    for (i = 0; rc == 0 && i < rows; i++) {
        bind_row_id(stmt, i);
        for (c = 0; rc == 0 && c < width; c++)
            rc = bind_value(stmt, (int)c + 2, PyList_GET_ITEM(PyList_GET_ITEM(columns, c), i));
        if (rc == 0)
            rc = step(stmt);
    }
    sqlite3_finalize(stmt);
    return finish_bulk(db, rc, "cannot write the attribute rows");
}

static PyMethodDef methods[] = {
    {"insert_rows", insert_rows, METH_VARARGS,
     "insert_rows(path, members, samples): bulk-insert a shard index's rows."},
    {"insert_values", insert_values, METH_VARARGS,
     "insert_values(path, sql, rows, columns): bulk-insert rows of Python values."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "indextar.index.shard._sqlitebulk", "A shard index's bulk rows, through SQLite's C API.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__sqlitebulk(void) { return PyModule_Create(&module); }
