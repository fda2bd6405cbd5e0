/* The memory layout of the compiled wheel's two objects, Timer and Wheel.
 *
 * Shared by the extension (_cwheel.c) and its test hooks (_cwheel_testing.c), which
 * are built together from these same headers (the hooks check the sizes at import).
 *
 * - A Timer is one GC object of 96 bytes (with its GC header): the handle and the core's
 *   list entry at once. The wheel owns one reference to each pending timer.
 * - A Wheel is the driver's state (the loop, the armed call_at, the counters) around
 *   one Core.
 */

#ifndef TICKWHEEL_OBJECTS_H
#define TICKWHEEL_OBJECTS_H

#include <Python.h>

#include "core.h"

typedef struct WheelObject WheelObject;

typedef struct {
    PyObject_HEAD
    Entry entry;        /* the core's: list links, deadline, state and place */
    WheelObject *wheel; /* owner (strong) */
    PyObject *callback;
    PyObject *args;
    PyObject *context;
} TimerObject;

#define TIMER_OF(n) CONTAINER_OF(n, TimerObject, entry.node)

struct WheelObject {
    PyObject_HEAD
    double tick;
    PyObject *loop;
    PyObject *time;    /* the clock: time.monotonic or loop.time */
    int monotonic;     /* time is time.monotonic: read CLOCK_MONOTONIC directly */
    PyObject *context; /* the wheel's own context */
    PyObject *handle;  /* the armed loop.call_at handle, or None */
    PyObject *max_pending;
    PyObject *call_at; /* loop.call_at, bound */
    PyObject *run;     /* self._run, bound */
    double capacity;
    double armed_tick;
    int closed;
    long long fired;
    long long wakeups;
    long long cancelled;
    double late_max;
    double late_sum;
    Core core;
};

#endif /* TICKWHEEL_OBJECTS_H */
