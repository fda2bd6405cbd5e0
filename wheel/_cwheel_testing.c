/* tickwheel.wheel._cwheel_testing: the hooks the tests drive the compiled wheel with.
 *
 * Kept out of _cwheel, which users import: only the tests import this module. It is
 * built beside _cwheel from the same layout (csrc/objects.h) and core (csrc/core.h), and
 * refuses to import when the two extensions' object sizes disagree (a stale build). It
 * works on the wheels and timers of _cwheel:
 *
 * - check(wheel), check_core(wheel): assert the core's ground rules and the driver's
 *   arming rule (wheel/_core.py's Core._check and wheel/_driver.py's _check). O(n).
 * - insert, move, advance, next_deadline: the core on integer ticks, without the loop
 *   (tests/wheel_impls.py: CompiledCore, for the model tests).
 * - sizes(): sizeof the Timer and the Wheel.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>

/* The hooks use part of the core; the rest is compiled in unused. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "csrc/core.h"
#pragma GCC diagnostic pop
#include "csrc/objects.h"

/* _cwheel's types, taken from the module at import. */
static PyTypeObject *TimerTp, *WheelTp;

static int wheel_arg(PyObject *o, void *out) {
    if (!PyObject_TypeCheck(o, WheelTp)) {
        PyErr_Format(PyExc_TypeError, "expected a compiled wheel, got %R", o);
        return 0;
    }
    *(WheelObject **)out = (WheelObject *)o;
    return 1;
}

static PyObject *assert_fail(const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg != NULL) {
        PyErr_SetObject(PyExc_AssertionError, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* ---- invariants ---------------------------------------------------------------------- */

/* The core's ground rules and (unless core_only) the driver's arming rule. O(n). */
static PyObject *wheel_check(WheelObject *w, int core_only) {
    Py_ssize_t count = 0;
    int64_t elapsed = w->core.elapsed;
    int64_t earliest = INT64_MAX;
    if (w->core.fired_tick > elapsed) return assert_fail("fired > elapsed");
    for (int level = 0; level < NLEVELS; level++) {
        int pos = (int)((elapsed >> (level * BITS)) & MASK);
        for (int slot = 0; slot < SLOTS; slot++) {
            Node *h = &w->core.buckets[level][slot];
            int bit = (int)((w->core.occupied[level] >> slot) & 1);
            if (bit != !list_empty(h))
                return assert_fail("occupancy bit %d/%d is wrong", level, slot);
            if (level && !list_empty(h) && slot == pos)
                return assert_fail("current slot of level %d is not empty", level);
            for (Node *n = h->next; n != h; n = n->next) {
                Entry *e = ENTRY_OF(n);
                count++;
                if (e->state != ST_BUCKET || e->level != level || e->slot != slot)
                    return assert_fail("timer in %d/%d has a wrong place", level, slot);
                if (e->deadline < elapsed) return assert_fail("timer due before elapsed");
                uint64_t diff = (uint64_t)(elapsed ^ e->deadline);
                int lv = diff < SLOTS ? 0 : (bit_length64(diff) - 1) / BITS;
                int sl = (int)((e->deadline >> (lv * BITS)) & MASK);
                if (lv != level || sl != slot)
                    return assert_fail("timer in %d/%d belongs in %d/%d", level, slot, lv, sl);
                if (e->kind != KIND_TIMER && e->kind != KIND_HANDLE)
                    return assert_fail("entry of unknown kind %d", (int)e->kind);
                if (e->kind == KIND_TIMER && Py_REFCNT(TIMER_OF(n)) < 1)
                    return assert_fail("dead timer in a bucket");
                if (e->deadline < earliest) earliest = e->deadline;
            }
        }
    }
    for (Node *n = w->core.far.next; n != &w->core.far; n = n->next) count++;
    if (count != w->core.len)
        return assert_fail("len %zd != %zd in buckets", w->core.len, count);
    if (core_only) Py_RETURN_NONE;
    if (w->core.len == 0) {
        if (w->handle != Py_None) return assert_fail("armed while empty");
    } else {
        if (w->handle == Py_None) return assert_fail("not armed while timers are pending");
        if (earliest != INT64_MAX && w->armed_tick > (double)earliest)
            return assert_fail("armed later than a timer is due");
    }
    Py_RETURN_NONE;
}

static PyObject *t_check(PyObject *m, PyObject *arg) {
    WheelObject *w;
    if (!wheel_arg(arg, &w)) return NULL;
    return wheel_check(w, 0);
}

static PyObject *t_check_core(PyObject *m, PyObject *arg) {
    WheelObject *w;
    if (!wheel_arg(arg, &w)) return NULL;
    return wheel_check(w, 1);
}

/* ---- the core on integer ticks, without the loop (for the model tests) --------------- */

static int64_t tick_arg(PyObject *v, int *err) {
    long long d = PyLong_AsLongLong(v);
    *err = (d == -1 && PyErr_Occurred()) ? -1 : 0;
    if (!*err && (d >= (long long)FAR_LIMIT || d <= -(long long)FAR_LIMIT)) {
        PyErr_SetString(PyExc_OverflowError, "deadline must be within +-2**62 ticks");
        *err = -1;
    }
    return (int64_t)d;
}

/* insert(wheel, callback, deadline) -> (timer, deadline used): Core.insert on ticks. */
static PyObject *t_insert(PyObject *m, PyObject *args) {
    WheelObject *w;
    PyObject *callback, *dl;
    if (!PyArg_ParseTuple(args, "O&OO", wheel_arg, &w, &callback, &dl)) return NULL;
    int err;
    int64_t deadline = tick_arg(dl, &err);
    if (err) return NULL;
    TimerObject *t = PyObject_GC_New(TimerObject, TimerTp);
    if (t == NULL) return NULL;
    t->wheel = (WheelObject *)Py_NewRef(w);
    t->callback = Py_NewRef(callback);
    t->args = PyTuple_New(0);
    t->context = NULL;
    t->entry.state = 0;
    t->entry.kind = KIND_TIMER;
    PyObject_GC_Track(t);
    Py_INCREF(t); /* the wheel's reference */
    w->core.len++;
    int64_t used = core_place(&w->core, &t->entry, deadline);
    return Py_BuildValue("NL", (PyObject *)t, (long long)used);
}

/* move(wheel, timer, deadline) -> deadline used: Core.move on ticks. */
static PyObject *t_move(PyObject *m, PyObject *args) {
    WheelObject *w;
    PyObject *dl;
    TimerObject *t;
    if (!PyArg_ParseTuple(args, "O&O!O", wheel_arg, &w, TimerTp, &t, &dl)) return NULL;
    int err;
    int64_t deadline = tick_arg(dl, &err);
    if (err) return NULL;
    if (t->wheel != w || !(t->entry.state == ST_BUCKET || t->entry.state == ST_FIRING))
        return PyErr_Format(PyExc_ValueError, "%R is not pending", (PyObject *)t);
    core_unlink(&w->core, &t->entry);
    return PyLong_FromLongLong(core_place(&w->core, &t->entry, deadline));
}

/* advance(wheel, now) -> the timers due by tick now, in firing order, marked fired (their
 * callbacks are not called): pop_due until nothing is due. */
static PyObject *t_advance(PyObject *m, PyObject *args) {
    WheelObject *w;
    PyObject *now_obj;
    if (!PyArg_ParseTuple(args, "O&O", wheel_arg, &w, &now_obj)) return NULL;
    int err;
    int64_t now = tick_arg(now_obj, &err);
    if (err) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    while (core_pop_due(&w->core, now)) {
        while (!list_empty(&w->core.firing)) {
            Node *n = w->core.firing.next;
            list_unlink(n);
            TimerObject *t = TIMER_OF(n);
            t->entry.state = ST_FIRED;
            Py_CLEAR(t->callback);
            Py_CLEAR(t->args);
            Py_CLEAR(t->context);
            w->core.len--;
            int bad = PyList_Append(out, (PyObject *)t);
            Py_DECREF(t);
            if (bad < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

/* next_deadline(wheel) -> the earliest deadline tick as an int (exact), or None. */
static PyObject *t_next_deadline(PyObject *m, PyObject *arg) {
    WheelObject *w;
    if (!wheel_arg(arg, &w)) return NULL;
    int64_t exact;
    double d;
    switch (core_next_deadline_exact(&w->core, &exact, &d)) {
    case 1:
        return PyLong_FromLongLong(exact);
    case 2:
        return PyLong_FromDouble(d);
    default:
        Py_RETURN_NONE;
    }
}

static PyObject *t_sizes(PyObject *m, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("nn", (Py_ssize_t)sizeof(TimerObject), (Py_ssize_t)sizeof(WheelObject));
}

/* ---- module -------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"check", (PyCFunction)t_check, METH_O, NULL},
    {"check_core", (PyCFunction)t_check_core, METH_O, NULL},
    {"insert", (PyCFunction)t_insert, METH_VARARGS, NULL},
    {"move", (PyCFunction)t_move, METH_VARARGS, NULL},
    {"advance", (PyCFunction)t_advance, METH_VARARGS, NULL},
    {"next_deadline", (PyCFunction)t_next_deadline, METH_O, NULL},
    {"sizes", (PyCFunction)t_sizes, METH_NOARGS, NULL},
    {NULL},
};

static struct PyModuleDef testing_module = {
    PyModuleDef_HEAD_INIT, "_cwheel_testing",
    "Test hooks of the compiled wheel (tickwheel.wheel._cwheel); for the tests only.", -1,
    module_methods,
};

/* _cwheel's type ``name``, checked to have the layout this module was built with. */
static PyTypeObject *layout_checked(PyObject *cwheel, const char *name, Py_ssize_t size) {
    PyObject *tp = PyObject_GetAttrString(cwheel, name);
    if (tp == NULL) return NULL;
    if (!PyType_Check(tp) || ((PyTypeObject *)tp)->tp_basicsize != size) {
        PyErr_Format(PyExc_ImportError,
                     "tickwheel.wheel._cwheel.%s does not have the layout _cwheel_testing "
                     "was built with: rebuild both extensions",
                     name);
        Py_DECREF(tp);
        return NULL;
    }
    return (PyTypeObject *)tp; /* kept for the life of the process */
}

PyMODINIT_FUNC PyInit__cwheel_testing(void) {
    /* _cdriver hands _cwheel its helpers (a timer's repr among them): import it first. */
    PyObject *driver = PyImport_ImportModule("tickwheel.wheel._cdriver");
    if (driver == NULL) return NULL;
    Py_DECREF(driver);
    PyObject *cwheel = PyImport_ImportModule("tickwheel.wheel._cwheel");
    if (cwheel == NULL) return NULL;
    TimerTp = layout_checked(cwheel, "Timer", (Py_ssize_t)sizeof(TimerObject));
    WheelTp = TimerTp ? layout_checked(cwheel, "Wheel", (Py_ssize_t)sizeof(WheelObject)) : NULL;
    Py_DECREF(cwheel);
    if (WheelTp == NULL) return NULL;
    return PyModule_Create(&testing_module);
}
