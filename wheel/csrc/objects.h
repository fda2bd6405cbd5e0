/* The memory layout of the compiled wheel's objects: Timer, the loop's handle, Wheel.
 *
 * Shared by the extension (_cwheel.c) and its test hooks (_cwheel_testing.c), which
 * are built together from these same headers (the hooks check the sizes at import).
 *
 * - A Timer is one GC object of 96 bytes (with its GC header): the handle and the core's
 *   list entry at once. The wheel owns one reference to each pending timer.
 * - A loop handle (handle.h) is an asyncio.TimerHandle, a Python class, extended by a
 *   HandleTail: the core's entry sits after the base class's slots, at an offset known
 *   only once the type is made at run time (handle_entry_offset).
 * - A Wheel is the driver's state (the loop, the armed call_at, the counters) around
 *   one Core. Its lists hold both kinds of entry; Entry.kind says which, and
 *   object_of() finds the object that holds an entry.
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

/* Entry.kind: which object holds the entry. */
enum {
    KIND_TIMER = 0,  /* a TimerObject (wheel.schedule) */
    KIND_HANDLE = 1, /* a loop handle (handle.h): fired onto the wheel's due list */
};

/* What a loop handle adds after the slots of asyncio.TimerHandle. It holds no reference,
 * so the base class's dealloc, traverse and clear serve the handle unchanged. The wheel
 * it is filed in is entry.owner (an index, in what was the entry's padding). */
typedef struct {
    Entry entry; /* the core's: list links, deadline, state and place; owner */
    double when; /* _when when it is a finite float; NAN: see the _when slot */
} HandleTail;

/* The offset of a loop handle's HandleTail (and entry) from its start: the base class's
 * size, set when the type is made (handle.h); 0 until then, or in the test hooks. */
static Py_ssize_t handle_entry_offset;

/* A slot of a Python class's instance (asyncio.TimerHandle's), at its member offset. */
static inline PyObject **handle_slot(PyObject *o, Py_ssize_t offset) {
    return (PyObject **)((char *)o + offset);
}

/* The object holding an entry: the wheel's lists hold Timers and loop handles. */
static inline PyObject *object_of(Entry *e) {
    if (e->kind == KIND_HANDLE) return (PyObject *)((char *)e - handle_entry_offset);
    return (PyObject *)CONTAINER_OF(e, TimerObject, entry);
}

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
    PyObject *due;     /* list the loop handles it fires go to (set by the loop), or NULL */
    uint32_t owner;    /* 1 + its index in loop_wheels (handle.h) once due is set; else 0 */
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
