/* The Wheel type: the base of the compiled TimingWheel (wheel/_cdriver.py subclasses it).
 *
 * Its methods are the entry points into the driver: schedule and schedule_at (argument
 * parsing, then wheel_add), _run (the armed call_at), next_when, and what the Python
 * subclass needs for __init__, close() and stats() (_init_core, _disarm, _drain and the
 * private attributes), and what the wheel-timed loops use (_file, _set_due: handle.h). The rest is the object's life: allocation, the GC's traverse and
 * clear, and dealloc.
 */

#ifndef TICKWHEEL_WHEEL_H
#define TICKWHEEL_WHEEL_H

#include <Python.h>
#include <structmember.h>

#include "driver.h"
#include "handle.h"
#include "objects.h"
#include "state.h"

/* ---- scheduling ---------------------------------------------------------------------- */

static PyObject *split_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            PyObject **context) {
    *context = Py_None;
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, "context") == 0) {
                *context = args[nargs + i];
            } else {
                PyErr_Format(PyExc_TypeError,
                             "schedule() got an unexpected keyword argument %R", k);
                return NULL;
            }
        }
    }
    PyObject *rest = PyTuple_New(nargs - 2);
    if (rest == NULL) return NULL;
    for (Py_ssize_t i = 2; i < nargs; i++) PyTuple_SET_ITEM(rest, i - 2, Py_NewRef(args[i]));
    return rest;
}

static PyObject *Wheel_schedule(WheelObject *w, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    if (nargs < 2) {
        return PyErr_Format(PyExc_TypeError,
                            "schedule() missing required argument: '%s'",
                            nargs == 0 ? "delay" : "callback");
    }
    double now, when;
    if (when_after(w, args[0], &now, &when) < 0) return NULL;
    PyObject *context;
    PyObject *rest = split_args(args, nargs, kwnames, &context);
    if (rest == NULL) return NULL;
    return wheel_add(w, when, now, args[1], rest, context, 1);
}

static PyObject *Wheel_schedule_at(WheelObject *w, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    if (nargs < 2) {
        return PyErr_Format(PyExc_TypeError,
                            "schedule_at() missing required argument: '%s'",
                            nargs == 0 ? "when" : "callback");
    }
    double when;
    if (check_when(args[0], &when) < 0) return NULL;
    PyObject *context;
    PyObject *rest = split_args(args, nargs, kwnames, &context);
    if (rest == NULL) return NULL;
    return wheel_add(w, when, 0.0, args[1], rest, context, 0);
}

/* ---- what the Python subclass uses ---------------------------------------------------- */

static PyObject *Wheel_next_when(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    double d;
    if (!core_next_deadline(&w->core, &d)) Py_RETURN_NONE;
    return PyFloat_FromDouble(d * w->tick);
}

static Py_ssize_t Wheel_len(WheelObject *w) { return w->core.len; }

static void collect(WheelObject *w, Node *h, PyObject *list, int *err) {
    for (Node *n = h->next; n != h; n = n->next)
        if (!*err && PyList_Append(list, object_of(ENTRY_OF(n))) < 0) *err = 1;
}

/* Every pending timer but the firing ones: the buckets in order, then the far list. */
static PyObject *wheel_entries(WheelObject *w) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    int err = 0;
    for (int level = 0; level < NLEVELS; level++)
        for (int slot = 0; slot < SLOTS; slot++)
            collect(w, &w->core.buckets[level][slot], list, &err);
    collect(w, &w->core.far, list, &err);
    if (err) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

/* close(): take every timer out of the buckets, in bucket order (the caller sorts them
 * by deadline, stably: a tick's timers share one bucket, so FIFO survives). */
static PyObject *Wheel__drain(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = wheel_entries(w);
    if (list == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        Entry *e = Py_IS_TYPE(o, &TimerType) ? &((TimerObject *)o)->entry : &HANDLE_TAIL(o)->entry;
        core_unlink(&w->core, e);
        e->state = ST_CLOSED;
        Py_DECREF(o); /* the wheel's reference; the list holds its own */
    }
    for (int level = 0; level < NLEVELS; level++) w->core.occupied[level] = 0;
    w->core.len -= n;
    return list;
}

/* ---- the object ---------------------------------------------------------------------- */

static PyObject *Wheel__init_core(WheelObject *w, PyObject *args) {
    double tick, capacity;
    PyObject *loop, *time, *context, *max_pending, *call_at, *run;
    long long elapsed;
    if (!PyArg_ParseTuple(args, "dOOOOLd", &tick, &loop, &time, &context, &max_pending,
                          &elapsed, &capacity))
        return NULL;
    call_at = PyObject_GetAttr(loop, str_call_at);
    if (call_at == NULL) return NULL;
    run = PyObject_GetAttr((PyObject *)w, str_run);
    if (run == NULL) {
        Py_DECREF(call_at);
        return NULL;
    }
    w->tick = tick;
    Py_XSETREF(w->loop, Py_NewRef(loop));
    Py_XSETREF(w->time, Py_NewRef(time));
    w->monotonic = time == time_monotonic;
    Py_XSETREF(w->context, Py_NewRef(context));
    Py_XSETREF(w->max_pending, Py_NewRef(max_pending));
    Py_XSETREF(w->call_at, call_at);
    Py_XSETREF(w->run, run);
    w->capacity = capacity;
    w->core.elapsed = elapsed;
    Py_RETURN_NONE;
}

static PyObject *Wheel_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    WheelObject *w = (WheelObject *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->tick = 0.001;
    w->handle = Py_NewRef(Py_None);
    w->max_pending = Py_NewRef(Py_None);
    w->capacity = INFINITY;
    w->armed_tick = INFINITY;
    core_init(&w->core);
    return (PyObject *)w;
}

static int visit_list(Node *h, visitproc visit, void *arg) {
    for (Node *n = h->next; n != h; n = n->next) Py_VISIT(object_of(ENTRY_OF(n)));
    return 0;
}

static int Wheel_traverse(WheelObject *w, visitproc visit, void *arg) {
    Py_VISIT(w->loop);
    Py_VISIT(w->time);
    Py_VISIT(w->context);
    Py_VISIT(w->handle);
    Py_VISIT(w->max_pending);
    Py_VISIT(w->call_at);
    Py_VISIT(w->run);
    Py_VISIT(w->due);
    for (int level = 0; level < NLEVELS; level++) {
        if (!w->core.occupied[level]) continue;
        for (int slot = 0; slot < SLOTS; slot++) {
            int r = visit_list(&w->core.buckets[level][slot], visit, arg);
            if (r) return r;
        }
    }
    int r = visit_list(&w->core.firing, visit, arg);
    if (r) return r;
    return visit_list(&w->core.far, visit, arg);
}

static void clear_list(WheelObject *w, Node *h) {
    while (!list_empty(h)) {
        Node *n = h->next;
        list_unlink(n);
        Entry *e = ENTRY_OF(n);
        e->state = ST_CLOSED;
        w->core.len--;
        Py_DECREF(object_of(e));
    }
}

static int Wheel_clear(WheelObject *w) {
    for (int level = 0; level < NLEVELS; level++) {
        for (int slot = 0; slot < SLOTS; slot++) clear_list(w, &w->core.buckets[level][slot]);
        w->core.occupied[level] = 0;
    }
    clear_list(w, &w->core.firing);
    clear_list(w, &w->core.far);
    wheel_unregister(w); /* no loop handle is filed in it any more */
    w->monotonic = 0; /* so that a late call finds w->time gone and refuses */
    Py_CLEAR(w->loop);
    Py_CLEAR(w->time);
    Py_CLEAR(w->context);
    Py_CLEAR(w->handle);
    Py_CLEAR(w->max_pending);
    Py_CLEAR(w->call_at);
    Py_CLEAR(w->run);
    Py_CLEAR(w->due);
    return 0;
}

static void Wheel_dealloc(WheelObject *w) {
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_GC_UnTrack(w);
    Wheel_clear(w);
    tp->tp_free((PyObject *)w);
}

static PyObject *Wheel_get_len(WheelObject *w, void *c) {
    return PyLong_FromSsize_t(w->core.len);
}
static PyObject *Wheel_get_levels(WheelObject *w, void *c) {
    return PyLong_FromLong(w->core.levels);
}
static PyObject *Wheel_get_elapsed(WheelObject *w, void *c) {
    return PyLong_FromLongLong(w->core.elapsed);
}

static PyObject *Wheel_get_closed(WheelObject *w, void *c) { return PyBool_FromLong(w->closed); }
static int Wheel_set_closed(WheelObject *w, PyObject *v, void *c) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _closed");
        return -1;
    }
    int b = PyObject_IsTrue(v);
    if (b < 0) return -1;
    w->closed = b;
    return 0;
}

static PyObject *Wheel__disarm(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    if (wheel_disarm(w) < 0) return NULL;
    Py_RETURN_NONE;
}

/* _set_due(list): where the loop handles this wheel fires go (the loop runs them). */
static PyObject *Wheel__set_due(WheelObject *w, PyObject *due) {
    if (!PyList_CheckExact(due)) {
        PyErr_Format(PyExc_TypeError, "_set_due() takes a list, got %R", due);
        return NULL;
    }
    if (wheel_register(w) < 0) return NULL;
    Py_XSETREF(w->due, Py_NewRef(due));
    Py_RETURN_NONE;
}

static PyMethodDef Wheel_methods[] = {
    {"schedule", (PyCFunction)(void (*)(void))Wheel_schedule, METH_FASTCALL | METH_KEYWORDS,
     NULL},
    {"schedule_at", (PyCFunction)(void (*)(void))Wheel_schedule_at,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_run", (PyCFunction)Wheel__run, METH_NOARGS, NULL},
    {"next_when", (PyCFunction)Wheel_next_when, METH_NOARGS, NULL},
    {"_drain", (PyCFunction)Wheel__drain, METH_NOARGS, NULL},
    {"_disarm", (PyCFunction)Wheel__disarm, METH_NOARGS, NULL},
    {"_init_core", (PyCFunction)Wheel__init_core, METH_VARARGS, NULL},
    {"_file", (PyCFunction)(void (*)(void))Wheel__file, METH_FASTCALL, NULL},
    {"_set_due", (PyCFunction)Wheel__set_due, METH_O, NULL},
    {NULL},
};

static PyMemberDef Wheel_members[] = {
    {"_tick", T_DOUBLE, offsetof(WheelObject, tick), READONLY, NULL},
    {"_loop", T_OBJECT, offsetof(WheelObject, loop), READONLY, NULL},
    {"_time", T_OBJECT, offsetof(WheelObject, time), READONLY, NULL},
    {"_context", T_OBJECT, offsetof(WheelObject, context), READONLY, NULL},
    {"_handle", T_OBJECT, offsetof(WheelObject, handle), READONLY, NULL},
    {"_max_pending", T_OBJECT, offsetof(WheelObject, max_pending), READONLY, NULL},
    {"_capacity", T_DOUBLE, offsetof(WheelObject, capacity), 0, NULL},
    {"_armed_tick", T_DOUBLE, offsetof(WheelObject, armed_tick), READONLY, NULL},
    {"_fired", T_LONGLONG, offsetof(WheelObject, fired), READONLY, NULL},
    {"_wakeups", T_LONGLONG, offsetof(WheelObject, wakeups), READONLY, NULL},
    {"_cancelled", T_LONGLONG, offsetof(WheelObject, cancelled), READONLY, NULL},
    {"_late_max", T_DOUBLE, offsetof(WheelObject, late_max), READONLY, NULL},
    {"_late_sum", T_DOUBLE, offsetof(WheelObject, late_sum), READONLY, NULL},
    {NULL},
};

static PyGetSetDef Wheel_getset[] = {
    {"_len", (getter)Wheel_get_len, NULL, NULL, NULL},
    {"_levels", (getter)Wheel_get_levels, NULL, NULL, NULL},
    {"_elapsed", (getter)Wheel_get_elapsed, NULL, NULL, NULL},
    {"_closed", (getter)Wheel_get_closed, (setter)Wheel_set_closed, NULL, NULL},
    {NULL},
};

static PySequenceMethods Wheel_as_sequence = {.sq_length = (lenfunc)Wheel_len};

static PyTypeObject WheelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tickwheel.wheel._cwheel.Wheel",
    .tp_basicsize = sizeof(WheelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled wheel: the base of the C TimingWheel.",
    .tp_new = Wheel_new,
    .tp_dealloc = (destructor)Wheel_dealloc,
    .tp_traverse = (traverseproc)Wheel_traverse,
    .tp_clear = (inquiry)Wheel_clear,
    .tp_methods = Wheel_methods,
    .tp_members = Wheel_members,
    .tp_getset = Wheel_getset,
    .tp_as_sequence = &Wheel_as_sequence,
};

#endif /* TICKWHEEL_WHEEL_H */
