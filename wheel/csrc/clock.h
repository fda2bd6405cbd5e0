/* The wheel's clock and the times callers pass, checked and read in C.
 *
 * The clock is the loop's (loop.time), read without a call when it is time.monotonic.
 * float and int delays and deadlines are checked here with the pure-Python wheel's
 * messages; any other real goes to the Python helpers _setup handed over (SlowWhenAfter,
 * SlowCheckWhen), which check it as the reference does.
 */

#ifndef TICKWHEEL_CLOCK_H
#define TICKWHEEL_CLOCK_H

#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "objects.h"
#include "state.h"

/* The last tick n with n * tick <= t, clamped to the core's 62-bit clock. */
static inline int64_t floor_tick(double t, double tick) {
    double n = floor(t / tick);
    if (n * tick > t) n -= 1.0;
    if (n >= FAR_LIMIT) n = FAR_LIMIT - 1;
    if (n < -FAR_LIMIT) n = -FAR_LIMIT;
    return (int64_t)n;
}

/* time.monotonic() without the call: the same clock and the same rounding to a double
 * as CPython's (pytime.c: _PyTime_GetMonotonicClock, _PyTime_AsSecondsDouble). */
static inline double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    volatile double d;
    if (t % 1000000000 == 0) {
        d = (double)(t / 1000000000);
    } else {
        d = (double)t;
        d /= 1e9;
    }
    return d;
}

static inline int read_clock(WheelObject *w, double *out) {
    if (w->monotonic) {
        *out = monotonic_seconds();
        return 0;
    }
    if (w->time == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the TimingWheel is not initialised");
        return -1;
    }
    PyObject *r = PyObject_CallNoArgs(w->time);
    if (r == NULL) return -1;
    double v = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* delay -> (now, when) for schedule/reschedule; the same checks and messages as Python. */
static int when_after(WheelObject *w, PyObject *delay, double *now, double *when) {
    double d;
    if (PyFloat_CheckExact(delay)) {
        d = PyFloat_AS_DOUBLE(delay);
    } else if (PyLong_CheckExact(delay)) {
        d = PyLong_AsDouble(delay);
        if (d == -1.0 && PyErr_Occurred()) return -1;
    } else {
        /* any other real: the Python reference does the checks (and raises) */
        PyObject *r = PyObject_CallFunctionObjArgs(SlowWhenAfter, (PyObject *)w, delay, NULL);
        if (r == NULL) return -1;
        int ok = PyArg_ParseTuple(r, "dd", now, when);
        Py_DECREF(r);
        return ok ? 0 : -1;
    }
    if (!(0.0 <= d && d < INFINITY)) {
        PyErr_Format(PyExc_ValueError, "delay must be a finite number >= 0, got %R", delay);
        return -1;
    }
    double t;
    if (read_clock(w, &t) < 0) return -1;
    *when = t + d;
    *now = *when - d;
    return 0;
}

static int check_when(PyObject *when_obj, double *when) {
    if (PyFloat_CheckExact(when_obj)) {
        *when = PyFloat_AS_DOUBLE(when_obj);
    } else {
        PyObject *r = PyObject_CallOneArg(SlowCheckWhen, when_obj);
        if (r == NULL) return -1;
        *when = PyFloat_AsDouble(r);
        Py_DECREF(r);
        if (*when == -1.0 && PyErr_Occurred()) return -1;
        return 0;
    }
    if (!(-INFINITY < *when && *when < INFINITY)) {
        PyErr_Format(PyExc_ValueError, "when must be a finite number, got %R", when_obj);
        return -1;
    }
    return 0;
}

#endif /* TICKWHEEL_CLOCK_H */
