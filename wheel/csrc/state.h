/* The extension's module-wide state, shared by its parts.
 *
 * The type objects are defined in their parts (wheel.h, timer.h, timeout.h, handle.h) and declared
 * here so that any part can name them. The interned names are made by PyInit__cwheel; the
 * Python helpers are handed over by _setup, called once by wheel/_cdriver.py at import
 * (both in _cwheel.c).
 */

#ifndef TICKWHEEL_STATE_H
#define TICKWHEEL_STATE_H

#include <Python.h>

static PyTypeObject TimerType;
static PyTypeObject WheelType;
static PyTypeObject TimeoutType;
static PyTypeObject StepType;

/* Set by _setup(): the errors, the cold argument checks and repr (wheel/_cdriver.py),
 * and asyncio's current_task and CancelledError (for Timeout). */
static PyObject *WheelClosedErr, *WheelFullErr, *SlowWhenAfter, *SlowCheckWhen, *TimerRepr;
static PyObject *CurrentTask, *CancelledErr;

/* Set by _make_loop_handle (handle.h): the loop handle type, asyncio.Handle.cancel, the
 * check of a when that is not a float, and the offsets of asyncio.TimerHandle's slots. */
static PyTypeObject *LoopHandleType;
static PyObject *HandleCancel, *SlowLoopWhen;
static Py_ssize_t scheduled_offset, when_offset, cancelled_offset;

/* Set by PyInit__cwheel. */
static PyObject *str_cancel, *str_context, *str_message, *str_exception, *str_timer;
static PyObject *str_call_exception_handler, *str_run, *str_call_at;
static PyObject *str_on_timeout, *str_call_soon, *str_cancelling, *str_uncancel;
static PyObject *time_monotonic; /* time.monotonic, to recognise it */
static PyObject *kwnames_context; /* ("context",), for loop.call_at(..., context=) */
static PyObject *py_inf;          /* float("inf"), for Timeout's "never" */
static PyObject *ExceptionGroupType; /* builtins.ExceptionGroup, for Timeout on 3.13 */

#endif /* TICKWHEEL_STATE_H */
