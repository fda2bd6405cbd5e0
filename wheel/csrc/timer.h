/* The Timer type: the handle schedule() returns, like asyncio.TimerHandle.
 *
 * The C twin of wheel/_handle.py (the reference). A Timer is also the core's list entry
 * (objects.h), so cancel and reschedule unlink and re-place it in O(1) without a lookup.
 * Its repr is the Python helper _setup handed over (TimerRepr).
 */

#ifndef TICKWHEEL_TIMER_H
#define TICKWHEEL_TIMER_H

#include <Python.h>

#include "clock.h"
#include "driver.h"
#include "objects.h"
#include "state.h"

static inline int is_pending(TimerObject *t) {
    uint8_t s = t->entry.state;
    return s == ST_BUCKET || s == ST_FIRING || s == ST_FAR;
}

static PyObject *Timer_cancel(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    if (!is_pending(t)) Py_RETURN_FALSE;
    WheelObject *w = t->wheel;
    core_unlink(&w->core, &t->entry);
    t->entry.state = ST_CANCELLED;
    PyObject *cb = t->callback, *args = t->args, *ctx = t->context;
    t->callback = t->args = t->context = NULL;
    w->cancelled++;
    w->core.len--;
    int err = 0;
    if (!w->core.len) err = wheel_disarm(w);
    Py_XDECREF(cb);
    Py_XDECREF(args);
    Py_XDECREF(ctx);
    Py_DECREF(t); /* the wheel's reference; the caller still holds one */
    if (err < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Timer_cancelled(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(t->entry.state == ST_CANCELLED || t->entry.state == ST_CLOSED);
}

static PyObject *Timer_pending(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(is_pending(t));
}

static double timer_deadline(TimerObject *t) {
    Entry *e = &t->entry;
    return e->level == FAR_LEVEL ? entry_far_deadline(e) : (double)e->deadline;
}

static PyObject *Timer_when(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    return PyFloat_FromDouble(timer_deadline(t) * t->wheel->tick);
}

static PyObject *timer_move_to(TimerObject *t, double when) {
    if (!is_pending(t)) Py_RETURN_FALSE;
    WheelObject *w = t->wheel;
    int far;
    double fard;
    int64_t deadline = deadline_of(when, w->tick, &far, &fard);
    core_unlink(&w->core, &t->entry);
    double dl;
    if (far) {
        core_place_far(&w->core, &t->entry, fard);
        dl = fard;
    } else {
        dl = (double)core_place(&w->core, &t->entry, deadline);
    }
    if (dl < w->armed_tick && wheel_arm(w, dl) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Timer_reschedule(TimerObject *t, PyObject *delay) {
    double now, when;
    if (when_after(t->wheel, delay, &now, &when) < 0) return NULL;
    return timer_move_to(t, when);
}

static PyObject *Timer_reschedule_at(TimerObject *t, PyObject *when_obj) {
    double when;
    if (check_when(when_obj, &when) < 0) return NULL;
    return timer_move_to(t, when);
}

static PyObject *Timer_repr(TimerObject *t) {
    return PyObject_CallOneArg(TimerRepr, (PyObject *)t);
}

static PyObject *Timer_get_callback(TimerObject *t, void *c) {
    return Py_NewRef(t->callback ? t->callback : Py_None);
}
static PyObject *Timer_get_args(TimerObject *t, void *c) {
    if (t->args == NULL) return PyTuple_New(0);
    return Py_NewRef(t->args);
}
static PyObject *Timer_get_context(TimerObject *t, void *c) {
    return Py_NewRef(t->context ? t->context : Py_None);
}
static PyObject *Timer_get_wheel(TimerObject *t, void *c) { return Py_NewRef(t->wheel); }
static PyObject *Timer_get_deadline(TimerObject *t, void *c) {
    if (t->entry.level == FAR_LEVEL) return PyLong_FromDouble(entry_far_deadline(&t->entry));
    return PyLong_FromLongLong(t->entry.deadline);
}
static PyObject *Timer_get_fired(TimerObject *t, void *c) {
    return PyBool_FromLong(t->entry.state == ST_FIRED);
}

static int Timer_traverse(TimerObject *t, visitproc visit, void *arg) {
    Py_VISIT(t->wheel);
    Py_VISIT(t->callback);
    Py_VISIT(t->args);
    Py_VISIT(t->context);
    return 0;
}

static int Timer_clear(TimerObject *t) {
    Py_CLEAR(t->callback);
    Py_CLEAR(t->args);
    Py_CLEAR(t->context);
    return 0;
}

static void Timer_dealloc(TimerObject *t) {
    PyObject_GC_UnTrack(t);
    Timer_clear(t);
    Py_CLEAR(t->wheel);
    PyObject_GC_Del(t);
}

static PyMethodDef Timer_methods[] = {
    {"cancel", (PyCFunction)Timer_cancel, METH_NOARGS,
     "Cancel the timer; True if this call prevented the callback from running."},
    {"cancelled", (PyCFunction)Timer_cancelled, METH_NOARGS,
     "True if the timer will not run: cancelled, or returned by close()."},
    {"pending", (PyCFunction)Timer_pending, METH_NOARGS, "True if the timer is still to run."},
    {"when", (PyCFunction)Timer_when, METH_NOARGS,
     "The loop time the timer is due at: its deadline rounded up to a tick."},
    {"reschedule", (PyCFunction)Timer_reschedule, METH_O,
     "Move a pending timer to delay seconds from now; False if not pending."},
    {"reschedule_at", (PyCFunction)Timer_reschedule_at, METH_O,
     "Move a pending timer to loop time when; False if not pending."},
    {NULL},
};

static PyGetSetDef Timer_getset[] = {
    {"callback", (getter)Timer_get_callback, NULL, "The callback; None once fired or cancelled.",
     NULL},
    {"args", (getter)Timer_get_args, NULL, "The callback's positional arguments.", NULL},
    {"context", (getter)Timer_get_context, NULL, "The context given to schedule, or None.", NULL},
    {"_wheel", (getter)Timer_get_wheel, NULL, NULL, NULL},
    {"_deadline", (getter)Timer_get_deadline, NULL, NULL, NULL},
    {"_fired", (getter)Timer_get_fired, NULL, NULL, NULL},
    {NULL},
};

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tickwheel.wheel._cwheel.Timer",
    .tp_basicsize = sizeof(TimerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A pending call, like asyncio.TimerHandle. Made by TimingWheel.schedule.",
    .tp_dealloc = (destructor)Timer_dealloc,
    .tp_traverse = (traverseproc)Timer_traverse,
    .tp_clear = (inquiry)Timer_clear,
    .tp_methods = Timer_methods,
    .tp_getset = Timer_getset,
    .tp_repr = (reprfunc)Timer_repr,
};

#endif /* TICKWHEEL_TIMER_H */
