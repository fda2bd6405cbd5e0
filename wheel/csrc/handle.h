/* The loop's timer handle: an asyncio.TimerHandle that is also the wheel's list entry.
 *
 * WheelEventLoop and WheelUVLoop (wheel/_loop.py, wheel/_uvloop.py) return one from every
 * call_later and call_at. It is a subclass of asyncio.TimerHandle made at run time
 * (_make_loop_handle, called once by wheel/_loop_timers.py at import) with
 * PyType_FromSpecWithBases: the base class's slots (callback, args, context, loop, ...)
 * come first and are set by asyncio's own __init__; a HandleTail (objects.h) follows,
 * holding the core's entry, so that a pending call needs no Timer object beside its
 * handle (96 bytes and one allocation less per timer). What it changes of the base:
 *
 * - _when: a finite float is kept as a double in the tail (no float object per pending
 *   timer); anything else (an int, inf, a Decimal) in the base's own slot, so that
 *   when() returns what was asked for, as asyncio's handle does.
 * - cancel(): unlinks the entry from the wheel (O(1), the callback dropped at once by
 *   asyncio.Handle.cancel, which it then runs; asyncio.TimerHandle.cancel would tell the
 *   loop's heap, which holds nothing).
 * - Wheel._file(handle, when) files it. When it comes due the wheel does not call it but
 *   appends it to its due list, _scheduled False (driver.h: fire_handle); the loop runs
 *   it among its ready handles.
 *
 * The tail holds no reference, so the base class's dealloc, traverse and clear (CPython's
 * for classes with __slots__) serve it unchanged: a pending handle is kept alive by the
 * wheel's reference, and a wheel unlinks every entry (closed) before it goes. Nor does
 * it hold a pointer to its wheel: cancel() finds the wheel by the entry's owner, an index
 * into loop_wheels kept in what was the entry's padding, so that the tail is the entry
 * and a double (40 bytes: a handle is 152 bytes with its GC header, the wheel's Timer
 * alone was 96).
 */

#ifndef TICKWHEEL_HANDLE_H
#define TICKWHEEL_HANDLE_H

#include <Python.h>
#include <math.h>
#include <structmember.h>

#include "clock.h"
#include "driver.h"
#include "objects.h"
#include "state.h"

#define HANDLE_TAIL(o) ((HandleTail *)((char *)(o) + handle_entry_offset))

/* The wheels that file loop handles (those given a due list), by Entry.owner - 1; a slot
 * is NULL once its wheel is cleared (every entry of it unlinked first). */
static WheelObject **loop_wheels;
static Py_ssize_t loop_wheels_len;

static int wheel_register(WheelObject *w) {
    if (w->owner) return 0;
    Py_ssize_t i = 0;
    while (i < loop_wheels_len && loop_wheels[i] != NULL) i++;
    if (i == loop_wheels_len) {
        if (loop_wheels_len >= (Py_ssize_t)UINT32_MAX - 1) {
            PyErr_SetString(PyExc_OverflowError, "too many wheel-timed loops");
            return -1;
        }
        Py_ssize_t n = loop_wheels_len ? loop_wheels_len * 2 : 8;
        WheelObject **grown = PyMem_Realloc(loop_wheels, (size_t)n * sizeof(WheelObject *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t j = loop_wheels_len; j < n; j++) grown[j] = NULL;
        loop_wheels = grown;
        loop_wheels_len = n;
    }
    loop_wheels[i] = w; /* borrowed: Wheel_clear takes it out */
    w->owner = (uint32_t)(i + 1);
    return 0;
}

static void wheel_unregister(WheelObject *w) {
    if (w->owner) loop_wheels[w->owner - 1] = NULL;
    w->owner = 0;
}

static inline int entry_pending(Entry *e) {
    uint8_t s = e->state;
    return s == ST_BUCKET || s == ST_FIRING || s == ST_FAR;
}

static PyObject *LoopHandle_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *self = type->tp_alloc(type, 0); /* zeroed: the entry is not pending */
    if (self == NULL) return NULL;
    HandleTail *t = HANDLE_TAIL(self);
    t->entry.kind = KIND_HANDLE;
    t->when = NAN;
    return self;
}

/* cancel(): take the entry out of the wheel, then asyncio.Handle.cancel (which drops the
 * callback and its args, and keeps the repr in debug mode). */
static PyObject *LoopHandle_cancel(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *cancelled = *handle_slot(self, cancelled_offset);
    int done = cancelled == NULL ? 1 : PyObject_IsTrue(cancelled); /* NULL: base raises */
    if (done < 0) return NULL;
    if (!done) {
        Entry *e = &HANDLE_TAIL(self)->entry;
        if (entry_pending(e)) {
            WheelObject *w = loop_wheels[e->owner - 1]; /* alive: it holds the entry */
            core_unlink(&w->core, e);
            e->state = ST_CANCELLED;
            w->cancelled++;
            w->core.len--;
            int err = w->core.len ? 0 : wheel_disarm(w);
            Py_DECREF(self); /* the wheel's reference; the caller holds one */
            if (err < 0) return NULL;
        }
        Py_XSETREF(*handle_slot(self, scheduled_offset), Py_NewRef(Py_False));
    }
    return PyObject_CallOneArg(HandleCancel, self);
}

static PyObject *LoopHandle_get_when(PyObject *self, void *c) {
    PyObject *obj = *handle_slot(self, when_offset);
    if (obj != NULL) return Py_NewRef(obj);
    double when = HANDLE_TAIL(self)->when;
    if (isnan(when)) {
        PyErr_SetString(PyExc_AttributeError, "_when");
        return NULL;
    }
    return PyFloat_FromDouble(when);
}

static int LoopHandle_set_when(PyObject *self, PyObject *value, void *c) {
    HandleTail *t = HANDLE_TAIL(self);
    PyObject **slot = handle_slot(self, when_offset);
    if (value != NULL && PyFloat_CheckExact(value) && isfinite(PyFloat_AS_DOUBLE(value))) {
        t->when = PyFloat_AS_DOUBLE(value);
        Py_CLEAR(*slot);
    } else {
        t->when = NAN;
        Py_XSETREF(*slot, Py_XNewRef(value)); /* NULL: deleted */
    }
    return 0;
}

/* The deadline tick while filed (TimingWheel.close sorts what it returns by it). */
static PyObject *LoopHandle_get_deadline(PyObject *self, void *c) {
    Entry *e = &HANDLE_TAIL(self)->entry;
    if (e->level == FAR_LEVEL) return PyLong_FromDouble(entry_far_deadline(e));
    return PyLong_FromLongLong(e->deadline);
}

/* Wheel._file(handle, when): file a fresh loop handle for loop time when (its _when).
 * A finite when is placed; -inf is due now (one tick back: now itself would round up);
 * +inf never fires and is not placed (as asyncio's heap never pops it). Returns handle.
 * Raises ValueError for NaN, and what the loop's when check raises for a non-float. */
static PyObject *Wheel__file(WheelObject *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_file() takes a handle and a when");
        return NULL;
    }
    PyObject *h = args[0], *when_obj = args[1];
    if (LoopHandleType == NULL || !PyObject_TypeCheck(h, LoopHandleType)) {
        PyErr_SetString(PyExc_TypeError, "_file() takes a loop handle");
        return NULL;
    }
    double when;
    if (PyFloat_CheckExact(when_obj)) {
        when = PyFloat_AS_DOUBLE(when_obj);
    } else {
        PyObject *r = PyObject_CallOneArg(SlowLoopWhen, when_obj);
        if (r == NULL) return NULL;
        when = PyFloat_AsDouble(r);
        Py_DECREF(r);
        if (when == -1.0 && PyErr_Occurred()) return NULL;
    }
    if (isnan(when)) return PyErr_Format(PyExc_ValueError, "when must be a number, got %R", when_obj);
    HandleTail *t = HANDLE_TAIL(h);
    if (entry_pending(&t->entry)) {
        PyErr_SetString(PyExc_RuntimeError, "the handle is already filed in a wheel");
        return NULL;
    }
    if (!w->owner) {
        PyErr_SetString(PyExc_RuntimeError, "_file() needs the wheel's due list (_set_due)");
        return NULL;
    }
    if (*handle_slot(h, cancelled_offset) == NULL) {
        PyErr_SetString(PyExc_TypeError, "_file() takes an initialised handle");
        return NULL;
    }
    if (when < INFINITY) {
        if ((double)w->core.len >= w->capacity) {
            refuse(w);
            return NULL;
        }
        if (when == -INFINITY) {
            double now;
            if (read_clock(w, &now) < 0) return NULL;
            when = now - w->tick;
        }
        if (wheel_catch_up(w, 0.0, 0) < 0) return NULL;
        t->entry.owner = w->owner;
        Py_XSETREF(*handle_slot(h, scheduled_offset), Py_NewRef(Py_True));
        if (wheel_place(w, &t->entry, h, when) < 0) return NULL; /* placed; arming failed */
    } else {
        Py_XSETREF(*handle_slot(h, scheduled_offset), Py_NewRef(Py_True));
    }
    return Py_NewRef(h);
}

static PyMethodDef LoopHandle_methods[] = {
    {"cancel", (PyCFunction)LoopHandle_cancel, METH_NOARGS,
     "Cancel the call; a no-op once it has run or been cancelled. O(1)."},
    {NULL},
};

static PyGetSetDef LoopHandle_getset[] = {
    {"_when", (getter)LoopHandle_get_when, (setter)LoopHandle_set_when, NULL, NULL},
    {"_deadline", (getter)LoopHandle_get_deadline, NULL, NULL, NULL},
    {NULL},
};

static const char LoopHandle_doc[] =
    "The handle call_later/call_at return on a wheel-timed loop.\n\n"
    "An asyncio.TimerHandle (when(), cancel(), cancelled(), the caller's context, debug\n"
    "mode's source traceback) that is also the wheel's entry: filed in the wheel\n"
    "without a Timer of its own. when() is the time asked for; the callback runs once\n"
    "the wheel's tick holding it has begun: never before when(), at most one tick\n"
    "after it (plus the loop's own latency).";

/* The offset of a slot (an object member) that a class of the base's MRO defines. */
static Py_ssize_t slot_offset(PyObject *base, const char *name) {
    PyObject *d = PyObject_GetAttrString(base, name);
    if (d == NULL) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", base, name);
    Py_DECREF(d);
    return off;
}

/* _make_loop_handle(base, handle_cancel, check_when): the loop handle type, a subclass
 * of base (asyncio.TimerHandle); made once per process (later calls return it). */
static PyObject *mod_make_loop_handle(PyObject *m, PyObject *args) {
    PyObject *base, *handle_cancel, *check_when;
    if (!PyArg_ParseTuple(args, "O!OO", &PyType_Type, &base, &handle_cancel, &check_when))
        return NULL;
    if (LoopHandleType != NULL) return Py_NewRef(LoopHandleType);
    PyTypeObject *bt = (PyTypeObject *)base;
    if (bt->tp_itemsize != 0) {
        PyErr_SetString(PyExc_TypeError, "the base of the loop handle must be fixed-size");
        return NULL;
    }
    Py_ssize_t scheduled = slot_offset(base, "_scheduled");
    Py_ssize_t when = scheduled < 0 ? -1 : slot_offset(base, "_when");
    Py_ssize_t cancelled = when < 0 ? -1 : slot_offset(base, "_cancelled");
    if (cancelled < 0) return NULL;
    Py_ssize_t align = (Py_ssize_t)_Alignof(HandleTail);
    Py_ssize_t tail = (bt->tp_basicsize + align - 1) / align * align;
    PyType_Slot slots[] = {
        {Py_tp_new, (void *)LoopHandle_new},
        {Py_tp_methods, LoopHandle_methods},
        {Py_tp_getset, LoopHandle_getset},
        {Py_tp_doc, (void *)LoopHandle_doc},
        {0, NULL},
    };
    PyType_Spec spec = {
        .name = "tickwheel.wheel._loop_timers.WheelTimerHandle",
        .basicsize = (int)(tail + (Py_ssize_t)sizeof(HandleTail)),
        .itemsize = 0,
        .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
        .slots = slots,
    };
    PyObject *bases = PyTuple_Pack(1, base);
    if (bases == NULL) return NULL;
    PyObject *tp = PyType_FromSpecWithBases(&spec, bases);
    Py_DECREF(bases);
    if (tp == NULL) return NULL;
    handle_entry_offset = tail + (Py_ssize_t)offsetof(HandleTail, entry);
    scheduled_offset = scheduled;
    when_offset = when;
    cancelled_offset = cancelled;
    Py_XSETREF(HandleCancel, Py_NewRef(handle_cancel));
    Py_XSETREF(SlowLoopWhen, Py_NewRef(check_when));
    LoopHandleType = (PyTypeObject *)Py_NewRef(tp);
    return tp;
}

#endif /* TICKWHEEL_HANDLE_H */
