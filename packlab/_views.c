/* packlab._views: dataset[i] of a memory-mapped shard, compiled.
 *
 * The read of packlab.formats.bintable.BinTable.reader (three numpy views of the shard's
 * mapped columns in a dict, the read advice counted down) without the interpreter: measured on
 * notebook 11's bins, the Python closure takes ~0.7 us a read before any byte is copied, most
 * of it three numpy slices and the bytecode around them; here the views are made directly.
 * Everything else stays in Python: an index this does not serve (negative, numpy, wrong) goes
 * to ``other``, and a due read advice to ``advice.advise_bin`` / ``advise_batch``.
 *
 * TableReader(ids, mask, bounds, start, stop, mask_start, bound_at, advice, other, advise_batch)
 *   ids, mask, bounds   1-D C-contiguous ndarrays (the mapped columns, the boundaries in RAM)
 *   start, stop,        per-bin positions: buffers of uint32 ('I') or int64 ('q'), num_bins
 *   mask_start            values each (mask_start may be start itself)
 *   bound_at            the same, num_bins + 1 values
 *   advice              an object with an integer ``due`` and ``advise_bin(t0, m0, n)``
 *   other               called with any index that is not an int in [0, num_bins)
 *   advise_batch        called with a batch's index list when the advice is due for it
 * reader(b)      -> {"input_ids": ..., "loss_mask": ..., "seq_boundaries": ...}
 * reader.items(indices) -> a list of those (indices: a list of ints in range; else None, and
 *                           the caller takes its Python path)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

typedef struct {
    Py_buffer view;
    int wide; /* int64 values, else uint32 */
} Positions;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyArrayObject *columns[3]; /* ids, mask, bounds */
    Positions start, stop, mask_start, bound_at;
    Py_ssize_t num_bins;
    PyObject *advice, *other, *advise_batch;
} TableReader;

static PyObject *KEYS[3]; /* "input_ids", "loss_mask", "seq_boundaries" */
static PyObject *DUE, *ADVISE_BIN;

static inline Py_ssize_t at(const Positions *p, Py_ssize_t i) {
    return p->wide ? (Py_ssize_t)((const int64_t *)p->view.buf)[i]
                   : (Py_ssize_t)((const uint32_t *)p->view.buf)[i];
}

static int positions(PyObject *obj, Positions *p, Py_ssize_t count, const char *name) {
    if (PyObject_GetBuffer(obj, &p->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = p->view.format ? p->view.format : "B";
    if (f[0] == '=' || f[0] == '<' || f[0] == '@') f++;
    if (f[0] == 'I' && f[1] == 0 && p->view.itemsize == 4) p->wide = 0;
    else if ((f[0] == 'q' || f[0] == 'l') && f[1] == 0 && p->view.itemsize == 8) p->wide = 1;
    else {
        PyErr_Format(PyExc_TypeError, "%s: uint32 or int64 positions expected, got '%s'",
                     name, p->view.format ? p->view.format : "B");
        PyBuffer_Release(&p->view);
        p->view.obj = NULL;
        return -1;
    }
    if (p->view.len / p->view.itemsize != count) {
        PyErr_Format(PyExc_ValueError, "%s: %zd positions, %zd expected", name,
                     p->view.len / p->view.itemsize, count);
        PyBuffer_Release(&p->view);
        p->view.obj = NULL;
        return -1;
    }
    return 0;
}

/* The view column[lo:lo + n]: what numpy's slice gives (same dtype and write flag, based on
 * the column), without parsing an index. */
static PyObject *view_of(PyArrayObject *column, Py_ssize_t lo, Py_ssize_t n) {
    PyArray_Descr *descr = PyArray_DESCR(column);
    npy_intp dims[1] = {n};
    Py_INCREF(descr);
    int flags = PyArray_FLAGS(column) & NPY_ARRAY_WRITEABLE;
    PyObject *out = PyArray_NewFromDescr(
        &PyArray_Type, descr, 1, dims, NULL,
        PyArray_BYTES(column) + lo * PyArray_ITEMSIZE(column), flags, NULL);
    if (out == NULL) return NULL;
    Py_INCREF(column);
    if (PyArray_SetBaseObject((PyArrayObject *)out, (PyObject *)column) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* Bin b (in range) as the item dict. */
static PyObject *item(TableReader *self, Py_ssize_t b, Py_ssize_t t0, Py_ssize_t n,
                      Py_ssize_t m0) {
    Py_ssize_t s0 = at(&self->bound_at, b), s1 = at(&self->bound_at, b + 1);
    PyObject *dict = PyDict_New();
    if (dict == NULL) return NULL;
    PyObject *views[3] = {view_of(self->columns[0], t0, n), view_of(self->columns[1], m0, n),
                          view_of(self->columns[2], s0, s1 - s0)};
    int failed = 0;
    for (int k = 0; k < 3; k++) {
        if (views[k] == NULL || PyDict_SetItem(dict, KEYS[k], views[k]) < 0) failed = 1;
        Py_XDECREF(views[k]);
    }
    if (failed) {
        Py_DECREF(dict);
        return NULL;
    }
    return dict;
}

/* advice.due -= count; returns the new value (or -2**62 with an error set). */
static long long count_down(TableReader *self, Py_ssize_t count) {
    PyObject *due = PyObject_GetAttr(self->advice, DUE);
    if (due == NULL) return LLONG_MIN;
    long long left = PyLong_AsLongLong(due) - count;
    Py_DECREF(due);
    if (PyErr_Occurred()) return LLONG_MIN;
    PyObject *now = PyLong_FromLongLong(left);
    if (now == NULL) return LLONG_MIN;
    int failed = PyObject_SetAttr(self->advice, DUE, now);
    Py_DECREF(now);
    return failed ? LLONG_MIN : left;
}

static PyObject *read_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    TableReader *self = (TableReader *)callable;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a table's read takes one index");
        return NULL;
    }
    PyObject *index = args[0];
    if (!PyLong_CheckExact(index))
        return PyObject_CallOneArg(self->other, index);
    int overflow = 0;
    long long b = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (overflow || b < 0 || b >= self->num_bins)
        return PyObject_CallOneArg(self->other, index);
    Py_ssize_t t0 = at(&self->start, b), n = at(&self->stop, b) - t0;
    Py_ssize_t m0 = at(&self->mask_start, b);
    long long left = count_down(self, 1);
    if (left == LLONG_MIN) return NULL;
    if (left < 0) {
        PyObject *where[3] = {PyLong_FromSsize_t(t0), PyLong_FromSsize_t(m0),
                              PyLong_FromSsize_t(n)};
        PyObject *done = NULL;
        if (where[0] && where[1] && where[2])
            done = PyObject_CallMethodObjArgs(self->advice, ADVISE_BIN, where[0], where[1],
                                              where[2], NULL);
        for (int k = 0; k < 3; k++) Py_XDECREF(where[k]);
        if (done == NULL) return NULL;
        Py_DECREF(done);
    }
    return item(self, (Py_ssize_t)b, t0, n, m0);
}

static PyObject *items(TableReader *self, PyObject *indices) {
    if (!PyList_CheckExact(indices)) Py_RETURN_NONE;
    Py_ssize_t count = PyList_GET_SIZE(indices);
    /* the bins, taken before any Python runs (the advice's call could change the list) */
    Py_ssize_t *bins = PyMem_Malloc((count ? count : 1) * sizeof(Py_ssize_t));
    if (bins == NULL) return PyErr_NoMemory();
    PyObject *out = NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *index = PyList_GET_ITEM(indices, k);
        int overflow = 0;
        long long b = PyLong_CheckExact(index) ? PyLong_AsLongLongAndOverflow(index, &overflow)
                                               : -1;
        if (overflow || b < 0 || b >= self->num_bins) {
            PyMem_Free(bins);
            Py_RETURN_NONE;
        }
        bins[k] = (Py_ssize_t)b;
    }
    if (count > 0) {
        long long left = count_down(self, count);
        if (left == LLONG_MIN) goto done;
        if (left < 0) {
            PyObject *advised = PyObject_CallOneArg(self->advise_batch, indices);
            if (advised == NULL) goto done;
            Py_DECREF(advised);
        }
    }
    out = PyList_New(count);
    if (out == NULL) goto done;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t b = bins[k], t0 = at(&self->start, b);
        PyObject *one = item(self, b, t0, at(&self->stop, b) - t0, at(&self->mask_start, b));
        if (one == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, k, one);
    }
done:
    PyMem_Free(bins);
    return out;
}

static int column(PyObject *obj, PyArrayObject **out, const char *name) {
    if (!PyArray_Check(obj) || PyArray_NDIM((PyArrayObject *)obj) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_TypeError, "%s: a 1-D C-contiguous ndarray expected", name);
        return -1;
    }
    Py_INCREF(obj);
    *out = (PyArrayObject *)obj;
    return 0;
}

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *ids, *mask, *bounds, *start, *stop, *mask_start, *bound_at, *advice, *other,
        *advise_batch;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "TableReader takes positional arguments only");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "TableReader", 10, 10, &ids, &mask, &bounds, &start, &stop,
                           &mask_start, &bound_at, &advice, &other, &advise_batch))
        return NULL;
    TableReader *self = (TableReader *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = read_vectorcall;
    if (column(ids, &self->columns[0], "ids") < 0 || column(mask, &self->columns[1], "mask") < 0 ||
        column(bounds, &self->columns[2], "bounds") < 0)
        goto fail;
    Py_ssize_t n = PyObject_Length(start);
    if (n < 0) goto fail;
    self->num_bins = n;
    if (positions(start, &self->start, n, "start") < 0 ||
        positions(stop, &self->stop, n, "stop") < 0 ||
        positions(mask_start, &self->mask_start, n, "mask_start") < 0 ||
        positions(bound_at, &self->bound_at, n + 1, "bound_at") < 0)
        goto fail;
    Py_INCREF(advice);
    self->advice = advice;
    Py_INCREF(other);
    self->other = other;
    Py_INCREF(advise_batch);
    self->advise_batch = advise_batch;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static void release(Positions *p) {
    if (p->view.obj != NULL) PyBuffer_Release(&p->view);
}

static int reader_traverse(TableReader *self, visitproc visit, void *arg) {
    for (int k = 0; k < 3; k++) Py_VISIT(self->columns[k]);
    Py_VISIT(self->advice);
    Py_VISIT(self->other);
    Py_VISIT(self->advise_batch);
    return 0;
}

static int reader_clear(TableReader *self) {
    for (int k = 0; k < 3; k++) Py_CLEAR(self->columns[k]);
    release(&self->start);
    release(&self->stop);
    release(&self->mask_start);
    release(&self->bound_at);
    Py_CLEAR(self->advice);
    Py_CLEAR(self->other);
    Py_CLEAR(self->advise_batch);
    return 0;
}

static void reader_dealloc(TableReader *self) {
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"items", (PyCFunction)items, METH_O,
     "items(indices) -> the items of a list of in-range ints, or None (take the Python path)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef reader_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(TableReader, vectorcall), READONLY, NULL},
    {"num_bins", T_PYSSIZET, offsetof(TableReader, num_bins), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TableReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packlab._views.TableReader",
    .tp_basicsize = sizeof(TableReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "dataset[i] of a memory-mapped shard (see the module)",
    .tp_new = reader_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TableReader, vectorcall),
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
    .tp_members = reader_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "packlab._views",
    "dataset[i] of a memory-mapped shard, compiled (see packlab/_views.c)", -1, NULL,
};

PyMODINIT_FUNC PyInit__views(void) {
    import_array();
    const char *names[3] = {"input_ids", "loss_mask", "seq_boundaries"};
    for (int k = 0; k < 3; k++)
        if ((KEYS[k] = PyUnicode_InternFromString(names[k])) == NULL) return NULL;
    if ((DUE = PyUnicode_InternFromString("due")) == NULL) return NULL;
    if ((ADVISE_BIN = PyUnicode_InternFromString("advise_bin")) == NULL) return NULL;
    if (PyType_Ready(&TableReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&TableReaderType);
    if (PyModule_AddObject(m, "TableReader", (PyObject *)&TableReaderType) < 0) {
        Py_DECREF(&TableReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
