/* The Timeout type: the async with block that cancels the current task at a loop time.
 *
 * The context manager of wheel/_timeout.py (the reference), on the compiled wheel: the
 * same states, checks, messages and order of effects. Its expiry is a Timer on the wheel
 * (a deadline already past goes through loop.call_soon instead). __aenter__ and
 * __aexit__ return a one-shot awaitable (Step, below) that does the work when awaited,
 * as a coroutine would.
 *
 * It follows the asyncio of the Python it is compiled for (a build is per interpreter):
 * from 3.13, a CancelledError subclass leaving an expired block becomes TimeoutError
 * too, and another exception leaving it (and each member of an ExceptionGroup) gets a
 * TimeoutError put before the CancelledError in its __context__ chain.
 */

#ifndef TICKWHEEL_TIMEOUT_H
#define TICKWHEEL_TIMEOUT_H

#include <Python.h>

#include "clock.h"
#include "driver.h"
#include "objects.h"
#include "state.h"
#include "timer.h"

enum { TO_CREATED, TO_ENTERED, TO_EXPIRING, TO_EXPIRED, TO_EXITED };
static const char *const to_state_names[] = {"created", "active", "expiring", "expired",
                                             "finished"};

typedef struct {
    PyObject_HEAD
    WheelObject *wheel;
    PyObject *when;  /* the deadline as given; None: never */
    PyObject *timer; /* the pending expiry (a Timer), or NULL */
    PyObject *soon;  /* the pending loop.call_soon handle for a past deadline, or NULL */
    PyObject *task;  /* the task to cancel, or NULL */
    PyObject *cancelling; /* the task's cancelling() on entry */
    int state;
} TimeoutObject;

static int timeout_cancel_soon(TimeoutObject *self) {
    PyObject *soon = self->soon;
    if (soon == NULL) return 0;
    self->soon = NULL;
    PyObject *r = PyObject_CallMethodNoArgs(soon, str_cancel);
    Py_DECREF(soon);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int timeout_cancel_timer(TimeoutObject *self) {
    PyObject *timer = self->timer;
    if (timer == NULL) return 0;
    self->timer = NULL;
    PyObject *r = Timer_cancel((TimerObject *)timer, NULL);
    Py_DECREF(timer);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *Timeout_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *wheel, *when;
    static char *kwlist[] = {"wheel", "when", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O:Timeout", kwlist, &WheelType, &wheel,
                                     &when))
        return NULL;
    TimeoutObject *self = (TimeoutObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->wheel = (WheelObject *)Py_NewRef(wheel);
    self->when = Py_NewRef(when);
    self->state = TO_CREATED;
    return (PyObject *)self;
}

static PyObject *timeout_state_error(TimeoutObject *self) {
    if (self->state == TO_CREATED)
        PyErr_SetString(PyExc_RuntimeError, "Timeout has not been entered");
    else
        PyErr_Format(PyExc_RuntimeError, "Cannot change state of %s Timeout",
                     to_state_names[self->state]);
    return NULL;
}

/* A past deadline: expire at the next loop iteration (loop.call_soon), not a tick later. */
static int timeout_soon(TimeoutObject *self) {
    if (timeout_cancel_timer(self) < 0) return -1;
    if (self->soon != NULL) return 0;
    PyObject *cb = PyObject_GetAttr((PyObject *)self, str_on_timeout);
    if (cb == NULL) return -1;
    if (self->wheel->loop == NULL) {
        Py_DECREF(cb);
        PyErr_SetString(PyExc_RuntimeError, "the TimingWheel is not initialised");
        return -1;
    }
    PyObject *h = PyObject_CallMethodOneArg(self->wheel->loop, str_call_soon, cb);
    Py_DECREF(cb);
    if (h == NULL) return -1;
    self->soon = h;
    return 0;
}

/* A future deadline: move the pending timer, or schedule one. */
static int timeout_later(TimeoutObject *self, PyObject *when_obj) {
    double when;
    if (check_when(when_obj, &when) < 0) return -1; /* raises before a change */
    PyObject *timer = self->timer;
    if (timer != NULL) {
        PyObject *moved = timer_move_to((TimerObject *)timer, when);
        if (moved == NULL) return -1;
        Py_DECREF(moved);
        if (moved == Py_False) Py_CLEAR(self->timer);
    }
    if (self->timer == NULL) {
        PyObject *cb = PyObject_GetAttr((PyObject *)self, str_on_timeout);
        if (cb == NULL) return -1;
        PyObject *args = PyTuple_New(0);
        if (args == NULL) {
            Py_DECREF(cb);
            return -1;
        }
        PyObject *t = wheel_add(self->wheel, when, 0.0, cb, args, Py_None, 0);
        Py_DECREF(cb);
        if (t == NULL) return -1;
        self->timer = t;
    }
    return timeout_cancel_soon(self);
}

static PyObject *timeout_reschedule(TimeoutObject *self, PyObject *when) {
    if (self->state != TO_ENTERED) return timeout_state_error(self);
    int never, past;
    if (when == Py_None) {
        never = 1;
        past = 0;
    } else if (PyFloat_CheckExact(when)) {
        double d = PyFloat_AS_DOUBLE(when);
        never = d == INFINITY;
        past = 0;
        if (!never) {
            double now;
            if (read_clock(self->wheel, &now) < 0) return NULL;
            past = d <= now; /* NaN: False, for check_when to refuse */
        }
    } else {
        never = PyObject_RichCompareBool(when, py_inf, Py_EQ);
        if (never < 0) return NULL;
        past = 0;
        if (!never) {
            double now;
            if (read_clock(self->wheel, &now) < 0) return NULL;
            PyObject *now_obj = PyFloat_FromDouble(now);
            if (now_obj == NULL) return NULL;
            past = PyObject_RichCompareBool(when, now_obj, Py_LE);
            Py_DECREF(now_obj);
            if (past < 0) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_TypeError, "when must be a real number, got %R", when);
                }
                return NULL;
            }
        }
    }
    int err;
    if (never) {
        err = timeout_cancel_timer(self);
        if (!err) err = timeout_cancel_soon(self);
    } else if (past) {
        err = timeout_soon(self);
    } else {
        err = timeout_later(self, when);
    }
    if (err < 0) return NULL;
    Py_SETREF(self->when, Py_NewRef(when));
    Py_RETURN_NONE;
}

static PyObject *Timeout_reschedule(TimeoutObject *self, PyObject *when) {
    return timeout_reschedule(self, when);
}

static PyObject *Timeout_when(TimeoutObject *self, PyObject *Py_UNUSED(ignored)) {
    return Py_NewRef(self->when);
}

static PyObject *Timeout_expired(TimeoutObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(self->state == TO_EXPIRING || self->state == TO_EXPIRED);
}

static PyObject *Timeout_repr(TimeoutObject *self) {
    const char *state = to_state_names[self->state];
    if (self->state == TO_ENTERED && self->when == Py_None)
        return PyUnicode_FromFormat("<Timeout [%s] when=None>", state);
    if (self->state == TO_ENTERED) {
        PyObject *r = PyObject_CallMethod(self->when, "__round__", "i", 3);
        if (r == NULL) return NULL;
        PyObject *s = PyUnicode_FromFormat("<Timeout [%s] when=%S>", state, r);
        Py_DECREF(r);
        return s;
    }
    return PyUnicode_FromFormat("<Timeout [%s]>", state);
}

static PyObject *Timeout__on_timeout(TimeoutObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->state != TO_ENTERED || self->task == NULL) {
        PyErr_SetNone(PyExc_AssertionError);
        return NULL;
    }
    PyObject *r = PyObject_CallMethodNoArgs(self->task, str_cancel);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    self->state = TO_EXPIRING;
    Py_CLEAR(self->timer);
    Py_CLEAR(self->soon);
    Py_RETURN_NONE;
}

static PyObject *Timeout_get_timer(TimeoutObject *self, void *c) {
    return Py_NewRef(self->timer ? self->timer : Py_None);
}
static PyObject *Timeout_get_state(TimeoutObject *self, void *c) {
    return PyUnicode_FromString(to_state_names[self->state]);
}
static PyObject *Timeout_get_wheel(TimeoutObject *self, void *c) {
    return Py_NewRef((PyObject *)self->wheel);
}

static PyObject *timeout_enter(TimeoutObject *self) {
    if (self->state != TO_CREATED) {
        PyErr_SetString(PyExc_RuntimeError, "Timeout has already been entered");
        return NULL;
    }
    PyObject *task = PyObject_CallNoArgs(CurrentTask);
    if (task == NULL) return NULL;
    if (task == Py_None) {
        Py_DECREF(task);
        PyErr_SetString(PyExc_RuntimeError, "Timeout should be used inside a task");
        return NULL;
    }
    self->state = TO_ENTERED;
    Py_XSETREF(self->task, task);
    PyObject *n = PyObject_CallMethodNoArgs(task, str_cancelling);
    if (n == NULL) return NULL;
    Py_XSETREF(self->cancelling, n);
    PyObject *r = timeout_reschedule(self, self->when);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    return Py_NewRef((PyObject *)self);
}

#if PY_VERSION_HEX >= 0x030D0000
/* Put a TimeoutError, caused by it, before the first CancelledError in exc's context
 * chain (asyncio 3.13's Timeout._insert_timeout_error). */
static int timeout_insert_error(PyObject *exc) {
    PyObject *context;
    Py_INCREF(exc);
    while ((context = PyException_GetContext(exc)) != NULL) {
        int is = PyObject_IsInstance(context, CancelledErr);
        if (is < 0) {
            Py_DECREF(context);
            Py_DECREF(exc);
            return -1;
        }
        if (is) {
            PyObject *err = PyObject_CallNoArgs(PyExc_TimeoutError);
            if (err == NULL) {
                Py_DECREF(context);
                Py_DECREF(exc);
                return -1;
            }
            PyException_SetContext(err, Py_NewRef(context)); /* each steals a reference */
            PyException_SetCause(err, context);
            PyException_SetContext(exc, err);
            Py_DECREF(exc);
            return 0;
        }
        Py_SETREF(exc, context);
    }
    Py_DECREF(exc);
    return 0;
}

/* A foreign exception left an expired block: insert the TimeoutError into its chain,
 * and into each member's when it is an ExceptionGroup (as a TaskGroup raises). */
static int timeout_mark_foreign(PyObject *exc_val) {
    if (timeout_insert_error(exc_val) < 0) return -1;
    int group = PyObject_IsInstance(exc_val, ExceptionGroupType);
    if (group <= 0) return group;
    PyObject *members = PyObject_GetAttrString(exc_val, "exceptions");
    if (members == NULL) return -1;
    PyObject *seq = PySequence_Fast(members, "exceptions must be a sequence");
    Py_DECREF(members);
    if (seq == NULL) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        if (timeout_insert_error(PySequence_Fast_GET_ITEM(seq, i)) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}
#endif

static PyObject *timeout_exit(TimeoutObject *self, PyObject *exc_type, PyObject *exc_val) {
    if (self->state != TO_ENTERED && self->state != TO_EXPIRING) {
        /* as asyncio's assert: an exit without an enter, or a second exit */
        PyErr_SetNone(PyExc_AssertionError);
        return NULL;
    }
    if (timeout_cancel_timer(self) < 0 || timeout_cancel_soon(self) < 0) return NULL;
    if (self->state == TO_EXPIRING) {
        self->state = TO_EXPIRED;
        if (self->task == NULL) {
            PyErr_SetNone(PyExc_AssertionError);
            return NULL;
        }
        PyObject *left = PyObject_CallMethodNoArgs(self->task, str_uncancel);
        if (left == NULL) return NULL;
        int ours = PyObject_RichCompareBool(left, self->cancelling, Py_LE);
        Py_DECREF(left);
        if (ours < 0) return NULL;
#if PY_VERSION_HEX >= 0x030D0000
        int cancelled = 0;
        if (ours && exc_type != Py_None) {
            cancelled = PyObject_IsSubclass(exc_type, CancelledErr);
            if (cancelled < 0) return NULL;
            if (!cancelled && exc_val != Py_None && timeout_mark_foreign(exc_val) < 0)
                return NULL;
        }
#else
        int cancelled = exc_type == CancelledErr;
#endif
        if (ours && cancelled) {
            /* No one else asked to cancel the task: the cancellation is ours. */
            PyObject *exc = PyObject_CallNoArgs(PyExc_TimeoutError);
            if (exc == NULL) return NULL;
            PyException_SetCause(exc, Py_NewRef(exc_val));
            PyErr_SetObject(PyExc_TimeoutError, exc);
            Py_DECREF(exc);
            return NULL;
        }
    } else if (self->state == TO_ENTERED) {
        self->state = TO_EXITED;
    }
    Py_RETURN_NONE;
}

/* The awaitable __aenter__/__aexit__ return: runs once, on the first send. */
typedef struct {
    PyObject_HEAD
    TimeoutObject *cm; /* NULL once run */
    PyObject *exc_type; /* NULL for __aenter__ */
    PyObject *exc_val;
} StepObject;

static PyObject *step_make(TimeoutObject *cm, PyObject *exc_type, PyObject *exc_val) {
    StepObject *s = PyObject_GC_New(StepObject, &StepType);
    if (s == NULL) return NULL;
    s->cm = (TimeoutObject *)Py_NewRef(cm);
    s->exc_type = Py_XNewRef(exc_type);
    s->exc_val = Py_XNewRef(exc_val);
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

static PyObject *Timeout_aenter(TimeoutObject *self, PyObject *Py_UNUSED(ignored)) {
    return step_make(self, NULL, NULL);
}

static PyObject *Timeout_aexit(TimeoutObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__aexit__ expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    return step_make(self, args[0], args[1]);
}

/* Run the step: its result (new reference), or NULL with an exception set. */
static PyObject *step_run(StepObject *s) {
    TimeoutObject *cm = s->cm;
    if (cm == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return NULL;
    }
    s->cm = NULL;
    PyObject *r = s->exc_type == NULL ? timeout_enter(cm)
                                      : timeout_exit(cm, s->exc_type, s->exc_val);
    Py_DECREF(cm);
    Py_CLEAR(s->exc_type);
    Py_CLEAR(s->exc_val);
    return r;
}

static PySendResult Step_am_send(StepObject *s, PyObject *arg, PyObject **result) {
    PyObject *r = step_run(s);
    if (r == NULL) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    *result = r;
    return PYGEN_RETURN;
}

static int set_stop_iteration(PyObject *r) {
    if (r == Py_None) {
        Py_DECREF(r);
        PyErr_SetNone(PyExc_StopIteration);
        return 0;
    }
    PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, r);
    Py_DECREF(r);
    if (e == NULL) return -1;
    PyErr_SetObject(PyExc_StopIteration, e);
    Py_DECREF(e);
    return 0;
}

static PyObject *Step_iternext(StepObject *s) {
    PyObject *r = step_run(s);
    if (r != NULL) set_stop_iteration(r);
    return NULL;
}

static PyObject *Step_send(StepObject *s, PyObject *arg) { return Step_iternext(s); }

static PyObject *Step_throw(StepObject *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "throw expected at least 1 argument");
        return NULL;
    }
    Py_CLEAR(s->cm); /* never run */
    PyObject *typ = args[0];
    PyObject *val = nargs > 1 ? args[1] : Py_None;
    if (PyExceptionInstance_Check(typ)) {
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    } else if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, val);
    } else {
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    }
    return NULL;
}

static PyObject *Step_close(StepObject *s, PyObject *Py_UNUSED(ignored)) {
    Py_CLEAR(s->cm);
    Py_RETURN_NONE;
}

static PyObject *Step_await(StepObject *s) { return Py_NewRef((PyObject *)s); }

static int Step_traverse(StepObject *s, visitproc visit, void *arg) {
    Py_VISIT(s->cm);
    Py_VISIT(s->exc_type);
    Py_VISIT(s->exc_val);
    return 0;
}

static int Step_clear(StepObject *s) {
    Py_CLEAR(s->cm);
    Py_CLEAR(s->exc_type);
    Py_CLEAR(s->exc_val);
    return 0;
}

static void Step_dealloc(StepObject *s) {
    PyObject_GC_UnTrack(s);
    Step_clear(s);
    PyObject_GC_Del(s);
}

static PyMethodDef Step_methods[] = {
    {"send", (PyCFunction)Step_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))Step_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)Step_close, METH_NOARGS, NULL},
    {NULL},
};

static PyAsyncMethods Step_as_async = {
    .am_await = (unaryfunc)Step_await,
    .am_send = (sendfunc)Step_am_send,
};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tickwheel.wheel._cwheel._TimeoutStep",
    .tp_basicsize = sizeof(StepObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)Step_dealloc,
    .tp_traverse = (traverseproc)Step_traverse,
    .tp_clear = (inquiry)Step_clear,
    .tp_as_async = &Step_as_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Step_iternext,
    .tp_methods = Step_methods,
};

static int Timeout_traverse(TimeoutObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->wheel);
    Py_VISIT(self->when);
    Py_VISIT(self->timer);
    Py_VISIT(self->soon);
    Py_VISIT(self->task);
    Py_VISIT(self->cancelling);
    return 0;
}

static int Timeout_clear(TimeoutObject *self) {
    Py_CLEAR(self->wheel);
    Py_CLEAR(self->when);
    Py_CLEAR(self->timer);
    Py_CLEAR(self->soon);
    Py_CLEAR(self->task);
    Py_CLEAR(self->cancelling);
    return 0;
}

static void Timeout_dealloc(TimeoutObject *self) {
    PyObject_GC_UnTrack(self);
    Timeout_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Timeout_methods[] = {
    {"when", (PyCFunction)Timeout_when, METH_NOARGS,
     "Return the deadline (loop time), or None if it never expires."},
    {"reschedule", (PyCFunction)Timeout_reschedule, METH_O,
     "Move the deadline to loop time when (None: never). O(1), no allocation."},
    {"expired", (PyCFunction)Timeout_expired, METH_NOARGS,
     "Return True if the timeout expired while the block ran."},
    {"__aenter__", (PyCFunction)Timeout_aenter, METH_NOARGS, NULL},
    {"__aexit__", (PyCFunction)(void (*)(void))Timeout_aexit, METH_FASTCALL, NULL},
    {"_on_timeout", (PyCFunction)Timeout__on_timeout, METH_NOARGS, NULL},
    {NULL},
};

static PyGetSetDef Timeout_getset[] = {
    {"_timer", (getter)Timeout_get_timer, NULL, NULL, NULL},
    {"_state", (getter)Timeout_get_state, NULL, NULL, NULL},
    {"_wheel", (getter)Timeout_get_wheel, NULL, NULL, NULL},
    {NULL},
};

static PyTypeObject TimeoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tickwheel.wheel._cwheel.Timeout",
    .tp_basicsize = sizeof(TimeoutObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An async with block that cancels the current task at a loop time.",
    .tp_new = Timeout_new,
    .tp_dealloc = (destructor)Timeout_dealloc,
    .tp_traverse = (traverseproc)Timeout_traverse,
    .tp_clear = (inquiry)Timeout_clear,
    .tp_methods = Timeout_methods,
    .tp_getset = Timeout_getset,
    .tp_repr = (reprfunc)Timeout_repr,
};

#endif /* TICKWHEEL_TIMEOUT_H */
