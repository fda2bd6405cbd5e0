/* The driver: adding timers, arming the loop's call_at, and firing what is due.
 *
 * The C twin of the hot path of wheel/_driver.py (the reference), on the same ground
 * rules (see there):
 *
 * 1. At most one loop.call_at is armed, for the earliest non-empty bucket's start
 *    (armed_tick), and none while the wheel is empty. Adding a timer due earlier re-arms;
 *    cancelling never re-arms, but cancelling the last timer disarms.
 * 2. Deadlines round up to ticks, and tick n fires only once n * tick <= the clock:
 *    never early.
 * 3. While _run fires callbacks, armed_tick is -inf, so that the timers they schedule do
 *    not arm; _run arms once at the end.
 *
 * The wheel holds one reference to each pending timer: taken in wheel_place, dropped when
 * the timer fires (fire_one), is cancelled (timer.h) or is drained (wheel.h). Its lists
 * hold the loop's handles too (handle.h): one of those is not called when it fires but
 * appended to the wheel's due list (fire_handle), which the loop runs.
 */

#ifndef TICKWHEEL_DRIVER_H
#define TICKWHEEL_DRIVER_H

#include <Python.h>
#include <math.h>

#include "clock.h"
#include "objects.h"
#include "state.h"

/* ---- arming -------------------------------------------------------------------------- */

static int wheel_disarm(WheelObject *w) {
    PyObject *h = w->handle;
    if (h != NULL && h != Py_None) {
        w->handle = Py_NewRef(Py_None);
        PyObject *r = PyObject_CallMethodNoArgs(h, str_cancel);
        Py_DECREF(h);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    if (w->armed_tick != -INFINITY) w->armed_tick = INFINITY;
    return 0;
}

static int wheel_arm(WheelObject *w, double deadline) {
    if (w->call_at == NULL) {
        /* torn down by the GC (or never initialised): refuse rather than crash */
        PyErr_SetString(PyExc_RuntimeError, "the TimingWheel is not initialised");
        return -1;
    }
    PyObject *h = w->handle;
    if (h != NULL && h != Py_None) {
        PyObject *r = PyObject_CallMethodNoArgs(h, str_cancel);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    w->armed_tick = deadline;
    PyObject *when = PyFloat_FromDouble(deadline * w->tick);
    if (when == NULL) return -1;
    PyObject *argv[3] = {when, w->run, w->context};
    PyObject *nh = PyObject_Vectorcall(w->call_at, argv, 2, kwnames_context);
    Py_DECREF(when);
    if (nh == NULL) return -1;
    Py_SETREF(w->handle, nh);
    return 0;
}

/* ---- adding -------------------------------------------------------------------------- */

static int refuse(WheelObject *w) {
    if (w->closed)
        PyErr_SetString(WheelClosedErr, "cannot schedule on a closed TimingWheel");
    else
        PyErr_Format(WheelFullErr, "max_pending=%R timers are pending", w->max_pending);
    return -1;
}

/* Bring the core's clock up to now when the wheel is empty (an idle wheel does not
 * advance): from ``now`` when the caller read the clock (schedule), else read here. */
static int wheel_catch_up(WheelObject *w, double now, int idle_from_when) {
    if (w->core.len) return 0;
    int64_t n;
    if (idle_from_when) {
        n = floor_tick(now, w->tick);
    } else {
        double t;
        if (read_clock(w, &t) < 0) return -1;
        n = floor_tick(t, w->tick);
    }
    if (n > w->core.elapsed) w->core.elapsed = n;
    return 0;
}

/* Place the unlinked entry ``e`` of ``obj`` for ``when`` (wheel_catch_up done), taking
 * the wheel's reference to obj, and arm. -1 if arming failed: the entry stays placed. */
static int wheel_place(WheelObject *w, Entry *e, PyObject *obj, double when) {
    int far;
    double fard;
    int64_t deadline = deadline_of(when, w->tick, &far, &fard);
    Py_INCREF(obj); /* the wheel's reference */
    w->core.len++;
    double dl;
    if (far) {
        core_place_far(&w->core, e, fard);
        dl = fard;
    } else {
        dl = (double)core_place(&w->core, e, deadline);
    }
    if (dl < w->armed_tick && wheel_arm(w, dl) < 0) return -1;
    return 0;
}

/* Make and place a timer; args is a new reference that is stolen. */
static PyObject *wheel_add(WheelObject *w, double when, double now, PyObject *callback,
                           PyObject *args, PyObject *context, int idle_from_when) {
    if (!PyCallable_Check(callback)) {
        Py_DECREF(args);
        return PyErr_Format(PyExc_TypeError, "callback must be callable, got %R", callback);
    }
    if ((double)w->core.len >= w->capacity) {
        Py_DECREF(args);
        refuse(w);
        return NULL;
    }
    if (wheel_catch_up(w, now, idle_from_when) < 0) {
        Py_DECREF(args);
        return NULL;
    }
    TimerObject *t = PyObject_GC_New(TimerObject, &TimerType);
    if (t == NULL) {
        Py_DECREF(args);
        return NULL;
    }
    t->wheel = (WheelObject *)Py_NewRef(w);
    t->callback = Py_NewRef(callback);
    t->args = args;
    t->context = context == Py_None ? NULL : Py_XNewRef(context);
    t->entry.node.prev = t->entry.node.next = NULL;
    t->entry.state = 0;
    t->entry.level = t->entry.slot = 0;
    t->entry.kind = KIND_TIMER;
    PyObject_GC_Track(t);
    if (wheel_place(w, &t->entry, (PyObject *)t, when) < 0) {
        /* the timer is placed; report the loop's error like Python would */
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

/* ---- firing -------------------------------------------------------------------------- */

/* Fire a loop handle taken off the firing list (the list's reference is passed in): it is
 * not run here but appended to the loop's due list (handle.h), its _scheduled False. */
static int fire_handle(WheelObject *w, Entry *e) {
    PyObject *h = object_of(e);
    e->state = ST_FIRED;
    w->core.len--;
    Py_XSETREF(*handle_slot(h, scheduled_offset), Py_NewRef(Py_False));
    int status;
    if (w->due == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the wheel has no due list for loop handles");
        status = -1;
    } else {
        status = PyList_Append(w->due, h);
    }
    Py_DECREF(h);
    return status;
}

/* Fire one timer taken off the firing list (the list's reference is passed in). */
static int fire_one(WheelObject *w, TimerObject *t) {
    PyObject *callback = t->callback;
    PyObject *args = t->args;
    PyObject *context = t->context;
    t->callback = NULL;
    t->args = NULL;
    t->context = NULL;
    t->entry.state = ST_FIRED;
    w->core.len--;
    PyObject *r;
    if (context == NULL) {
        r = PyObject_Call(callback, args, NULL);
    } else {
        if (PyContext_Enter(context) < 0) {
            r = NULL;
        } else {
            r = PyObject_Call(callback, args, NULL);
            if (PyContext_Exit(context) < 0) Py_CLEAR(r);
        }
    }
    int status = 0;
    if (r != NULL) {
        Py_DECREF(r);
    } else if (PyErr_ExceptionMatches(PyExc_SystemExit) ||
               PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        status = -1;
    } else {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
        PyObject *msg = PyUnicode_FromFormat("Exception in timer callback %R", callback);
        PyObject *ctx = msg ? PyDict_New() : NULL;
        if (ctx != NULL && PyDict_SetItem(ctx, str_message, msg) == 0 &&
            PyDict_SetItem(ctx, str_exception, value ? value : Py_None) == 0 &&
            PyDict_SetItem(ctx, str_timer, (PyObject *)t) == 0) {
            PyObject *h = PyObject_CallMethodOneArg(w->loop, str_call_exception_handler, ctx);
            if (h == NULL)
                status = -1;
            else
                Py_DECREF(h);
        } else {
            status = -1;
        }
        Py_XDECREF(msg);
        Py_XDECREF(ctx);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    Py_DECREF(callback);
    Py_XDECREF(args);
    Py_XDECREF(context);
    Py_DECREF(t);
    return status;
}

static PyObject *Wheel__run(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    if (w->call_at == NULL) {
        /* a wake-up armed before the GC cleared the wheel: refuse rather than crash */
        PyErr_SetString(PyExc_RuntimeError, "the TimingWheel is not initialised");
        return NULL;
    }
    Py_XSETREF(w->handle, Py_NewRef(Py_None));
    double t_now;
    if (read_clock(w, &t_now) < 0) return NULL;
    double late = t_now - w->armed_tick * w->tick;
    if (-INFINITY < late && late < INFINITY) {
        w->late_sum += late;
        if (late > w->late_max) w->late_max = late;
    }
    w->armed_tick = -INFINITY;
    w->wakeups++;
    int64_t now = floor_tick(t_now, w->tick);
    long long fired = 0;
    int status = 0;
    Py_INCREF(w);
    while (core_pop_due(&w->core, now)) {
        while (!list_empty(&w->core.firing)) {
            Node *n = w->core.firing.next;
            list_unlink(n);
            fired++;
            Entry *e = ENTRY_OF(n);
            if ((e->kind == KIND_HANDLE ? fire_handle(w, e) : fire_one(w, TIMER_OF(n))) < 0) {
                status = -1;
                break;
            }
        }
        if (status < 0) break;
    }
    w->fired += fired;
    PyObject *exc_type = NULL, *exc_val = NULL, *exc_tb = NULL;
    if (status < 0) {
        PyErr_Fetch(&exc_type, &exc_val, &exc_tb);
        /* unwinding: the rest of this bucket stays due now, in its order (restore) */
        w->core.fired_tick = w->core.elapsed - 1;
        while (!list_empty(&w->core.firing)) {
            Node *n = w->core.firing.next;
            list_unlink(n);
            Entry *e = ENTRY_OF(n);
            core_place(&w->core, e, e->deadline);
        }
    }
    w->armed_tick = INFINITY;
    int err = 0;
    if (!w->closed) {
        double d;
        if (core_next_deadline(&w->core, &d)) err = wheel_arm(w, d);
    }
    Py_DECREF(w);
    if (status < 0) {
        if (err < 0) PyErr_Clear();
        PyErr_Restore(exc_type, exc_val, exc_tb);
        return NULL;
    }
    if (err < 0) return NULL;
    Py_RETURN_NONE;
}

#endif /* TICKWHEEL_DRIVER_H */
