/* tickwheel.wheel._cwheel: the compiled hot path of the timing wheel.
 *
 * The pure-Python modules (_core.py, _handle.py, _driver.py, _timeout.py) are the
 * executable reference; this extension keeps their observable behaviour (deadline
 * rounding, the order timers fire in, the arming of the loop's call_at, errors and
 * messages) and changes only the data structures.
 *
 * One translation unit, so that the hot path (schedule, cancel, reschedule, firing)
 * inlines across the parts as it did when they were one file. The parts, in the order
 * they build on each other (each includes what it uses):
 *
 *   csrc/list.h     the intrusive doubly-linked list
 *   csrc/core.h     the wheel on integer ticks: buckets, levels, advancing (no Python)
 *   csrc/objects.h  the layouts of Timer, the loop handle's tail and Wheel (shared with
 *                   _cwheel_testing.c)
 *   csrc/state.h    the module-wide names, types and helpers the parts share
 *   csrc/clock.h    reading the clock; checking the delays and times callers pass
 *   csrc/driver.h   adding timers, arming the loop's call_at, firing what is due
 *   csrc/handle.h   the loops' handle: an asyncio.TimerHandle that is its own entry
 *   csrc/wheel.h    the Wheel type (the base of _cdriver.TimingWheel)
 *   csrc/timer.h    the Timer type
 *   csrc/timeout.h  the Timeout type and its awaitable step
 *
 * This file is the module: _setup, which takes the Python helpers (wheel/_cdriver.py
 * calls it at import), and PyInit__cwheel. The hooks the tests drive the core with live
 * in a separate extension, _cwheel_testing.c, that only the tests import.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "csrc/list.h"
#include "csrc/core.h"
#include "csrc/objects.h"
#include "csrc/state.h"
#include "csrc/clock.h"
#include "csrc/driver.h"
#include "csrc/handle.h"
#include "csrc/wheel.h"
#include "csrc/timer.h"
#include "csrc/timeout.h"

static PyObject *mod_setup(PyObject *m, PyObject *args) {
    PyObject *closed, *full, *slow_when_after, *slow_check_when, *timer_repr, *current_task;
    PyObject *cancelled_error;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &closed, &full, &slow_when_after, &slow_check_when,
                          &timer_repr, &current_task, &cancelled_error))
        return NULL;
    Py_XSETREF(CurrentTask, Py_NewRef(current_task));
    Py_XSETREF(CancelledErr, Py_NewRef(cancelled_error));
    Py_XSETREF(WheelClosedErr, Py_NewRef(closed));
    Py_XSETREF(WheelFullErr, Py_NewRef(full));
    Py_XSETREF(SlowWhenAfter, Py_NewRef(slow_when_after));
    Py_XSETREF(SlowCheckWhen, Py_NewRef(slow_check_when));
    Py_XSETREF(TimerRepr, Py_NewRef(timer_repr));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_setup", (PyCFunction)mod_setup, METH_VARARGS, NULL},
    {"_make_loop_handle", (PyCFunction)mod_make_loop_handle, METH_VARARGS, NULL},
    {NULL},
};

static struct PyModuleDef cwheel_module = {
    PyModuleDef_HEAD_INIT, "_cwheel", "The compiled hot path of tickwheel.wheel.", -1,
    module_methods,
};

#define INTERN(var, s)                                       \
    do {                                                     \
        if ((var = PyUnicode_InternFromString(s)) == NULL) { \
            return NULL;                                     \
        }                                                    \
    } while (0)

PyMODINIT_FUNC PyInit__cwheel(void) {
    INTERN(str_cancel, "cancel");
    INTERN(str_context, "context");
    INTERN(str_message, "message");
    INTERN(str_exception, "exception");
    INTERN(str_timer, "timer");
    INTERN(str_call_exception_handler, "call_exception_handler");
    INTERN(str_run, "_run");
    INTERN(str_call_at, "call_at");
    INTERN(str_on_timeout, "_on_timeout");
    INTERN(str_call_soon, "call_soon");
    INTERN(str_cancelling, "cancelling");
    INTERN(str_uncancel, "uncancel");
    if ((py_inf = PyFloat_FromDouble(INFINITY)) == NULL) return NULL;
    PyObject *builtins = PyImport_ImportModule("builtins");
    if (builtins == NULL) return NULL;
    ExceptionGroupType = PyObject_GetAttrString(builtins, "ExceptionGroup");
    Py_DECREF(builtins);
    if (ExceptionGroupType == NULL) return NULL;
    PyObject *time_mod = PyImport_ImportModule("time");
    if (time_mod == NULL) return NULL;
    time_monotonic = PyObject_GetAttrString(time_mod, "monotonic");
    Py_DECREF(time_mod);
    if (time_monotonic == NULL) return NULL;
    kwnames_context = PyTuple_Pack(1, str_context);
    if (kwnames_context == NULL) return NULL;
    if (PyType_Ready(&TimerType) < 0 || PyType_Ready(&WheelType) < 0 ||
        PyType_Ready(&TimeoutType) < 0 || PyType_Ready(&StepType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&cwheel_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Timer", (PyObject *)&TimerType) < 0 ||
        PyModule_AddObjectRef(m, "Wheel", (PyObject *)&WheelType) < 0 ||
        PyModule_AddObjectRef(m, "Timeout", (PyObject *)&TimeoutType) < 0 ||
        PyModule_AddIntConstant(m, "NLEVELS", NLEVELS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
