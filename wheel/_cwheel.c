/* tickwheel.wheel._cwheel: the compiled hot path of the timing wheel.
 *
 * The pure-Python modules (_core.py, _handle.py, _driver.py) are the executable
 * reference; this file keeps their observable behaviour (deadline rounding, the order
 * timers fire in, the arming of the loop's call_at, errors and messages) and changes
 * only the data structures:
 *
 * - A Timer is one GC object of 96 bytes (with its GC header): the handle and the list
 *   node at once. Pending timers sit in intrusive circular doubly-linked lists, one per
 *   bucket, and the wheel owns one reference to each pending timer.
 * - Levels are fixed: 11 levels of 64 slots cover deadlines below 2**62 ticks; a bucket's
 *   occupancy bit is exact (a cancel that empties a bucket clears it), so the earliest
 *   bucket is a find-first-set per level. Deadlines at or beyond 2**62 ticks (over
 *   146,000 years at 1 ms) go to a "far" list; they keep their exact loop time but can
 *   never come due, since the wheel's clock (an int64 of ticks) cannot get there.
 * - Cascading re-places the entries of an upper bucket one by one, in list order,
 *   which keeps FIFO within a tick; the Python core's leaf trick only saves bytecode.
 *
 * Python helpers (set by _setup) do the cold work: argument checks for types other than
 * float and int, and repr.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#define BITS 6
#define SLOTS 64
#define MASK 63
#define NLEVELS 11
#define FAR_LEVEL 0xFF /* Timer.level of a far deadline */
#define FAR_LIMIT 4611686018427387904.0 /* 2**62 */

/* Where a timer is. */
enum {
    ST_BUCKET = 1, /* in a level bucket (level, slot) */
    ST_FIRING,     /* in the bucket handed out to the firing loop */
    ST_FAR,        /* in the far list */
    ST_FIRED,      /* callback ran (or is running) */
    ST_CANCELLED,  /* cancel() dropped callback and args */
    ST_CLOSED,     /* returned by close(): not pending, callback kept */
};

typedef struct Node {
    struct Node *prev;
    struct Node *next;
} Node;

typedef struct WheelObject WheelObject;

typedef struct {
    PyObject_HEAD
    Node node;
    int64_t deadline;   /* tick; for ST_FAR see far_deadline */
    WheelObject *wheel; /* owner (strong) */
    PyObject *callback;
    PyObject *args;
    PyObject *context;
    uint8_t state;
    uint8_t level;
    uint8_t slot;
} TimerObject;

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
    /* the core */
    int64_t elapsed;
    int64_t fired_tick;
    Py_ssize_t len;
    int levels;
    uint64_t occupied[NLEVELS];
    Node buckets[NLEVELS][SLOTS];
    Node firing;
    Node far;
};

static PyTypeObject TimerType;
static PyTypeObject WheelType;

/* Set by _setup(). */
static PyObject *WheelClosedErr, *WheelFullErr, *SlowWhenAfter, *SlowCheckWhen, *TimerRepr;
static PyObject *str_cancel, *str_context, *str_message, *str_exception, *str_timer;
static PyObject *str_call_exception_handler, *str_run, *str_call_at;
static PyObject *time_monotonic; /* time.monotonic, to recognise it */
static PyObject *kwnames_context;

#define TIMER_OF(n) ((TimerObject *)((char *)(n) - offsetof(TimerObject, node)))

static inline void list_init(Node *h) { h->prev = h->next = h; }
static inline int list_empty(Node *h) { return h->next == h; }
static inline void list_append(Node *h, Node *n) {
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
static inline void list_unlink(Node *n) {
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}
/* Move the whole list of src to the empty dst. */
static inline void list_take(Node *dst, Node *src) {
    if (list_empty(src)) {
        list_init(dst);
        return;
    }
    dst->next = src->next;
    dst->prev = src->prev;
    dst->next->prev = dst;
    dst->prev->next = dst;
    list_init(src);
}

static inline int bit_length64(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* ---- the core ------------------------------------------------------------------------ */

/* Deadline tick of ``when`` rounded up (never early, G1); sets *far for 2**62 and up. */
static inline int64_t deadline_of(double when, double tick, int *far, double *fard) {
    double q = ceil(when / tick);
    if (q >= FAR_LIMIT) {
        *far = 1;
        if (q * tick < when) q += 1.0;
        *fard = q;
        return 0;
    }
    *far = 0;
    if (q < -FAR_LIMIT) q = -FAR_LIMIT;
    int64_t d = (int64_t)q;
    if ((double)d * tick < when) d += 1;
    return d;
}

/* Place a timer (not linked) due at ``deadline``; raises an overdue one (rule 6).
 * Steals no reference: the caller hands the wheel's reference over. Returns the deadline. */
static int64_t core_place(WheelObject *w, TimerObject *t, int64_t deadline) {
    int64_t elapsed = w->elapsed;
    if (deadline <= elapsed) deadline = elapsed > w->fired_tick ? elapsed : w->fired_tick + 1;
    uint64_t diff = (uint64_t)(elapsed ^ deadline);
    int level, slot;
    if (diff < SLOTS) {
        level = 0;
        slot = (int)(deadline & MASK);
    } else {
        level = (bit_length64(diff) - 1) / BITS;
        slot = (int)((deadline >> (level * BITS)) & MASK);
    }
    if (level + 1 > w->levels) w->levels = level + 1;
    list_append(&w->buckets[level][slot], &t->node);
    w->occupied[level] |= (uint64_t)1 << slot;
    t->state = ST_BUCKET;
    t->level = (uint8_t)level;
    t->slot = (uint8_t)slot;
    t->deadline = deadline;
    return deadline;
}

static void core_place_far(WheelObject *w, TimerObject *t, double fard) {
    list_append(&w->far, &t->node);
    t->state = ST_FAR;
    t->level = FAR_LEVEL;
    /* the bits of the double, to keep its exact value */
    memcpy(&t->deadline, &fard, sizeof fard);
    /* levels as the Python core would have allocated them */
    int e;
    frexp(fard, &e);
    int lv = (e - 1) / BITS + 1;
    if (lv > w->levels) w->levels = lv;
}

static inline double far_deadline(TimerObject *t) {
    double d;
    memcpy(&d, &t->deadline, sizeof d);
    return d;
}

/* Unlink a pending timer, keeping the occupancy bit exact. Keeps the reference. */
static inline void core_unlink(WheelObject *w, TimerObject *t) {
    if (t->state == ST_BUCKET) {
        Node *h = &w->buckets[t->level][t->slot];
        list_unlink(&t->node);
        if (list_empty(h)) w->occupied[t->level] &= ~((uint64_t)1 << t->slot);
    } else {
        list_unlink(&t->node);
    }
}

static inline int64_t slot_start(int64_t elapsed, int level, int slot) {
    int shift = level * BITS;
    int above = shift + BITS;
    uint64_t hi = above >= 64 ? 0 : (((uint64_t)elapsed >> above) << above);
    return (int64_t)(hi | ((uint64_t)slot << shift));
}

/* Earliest non-empty bucket: returns its level, or -1; *slot set. */
static inline int core_earliest(WheelObject *w, int *slot) {
    int64_t elapsed = w->elapsed;
    for (int level = 0; level < w->levels && level < NLEVELS; level++) {
        uint64_t bits = w->occupied[level];
        if (!bits) continue;
        int pos = (int)((elapsed >> (level * BITS)) & MASK);
        uint64_t ahead = bits >> pos;
        if (ahead) {
            *slot = pos + __builtin_ctzll(ahead);
            return level;
        }
    }
    return -1;
}

/* Earliest deadline: 0 if empty; 1 with *exact set; 2 (far) with *out set. */
static int core_next_deadline_exact(WheelObject *w, int64_t *exact, double *out) {
    int slot;
    int level = core_earliest(w, &slot);
    if (level == 0) {
        *exact = slot_start(w->elapsed, 0, slot);
        return 1;
    }
    if (level > 0) {
        Node *h = &w->buckets[level][slot];
        int64_t best = INT64_MAX;
        for (Node *n = h->next; n != h; n = n->next) {
            int64_t d = TIMER_OF(n)->deadline;
            if (d < best) best = d;
        }
        *exact = best;
        return 1;
    }
    if (!list_empty(&w->far)) {
        double best = INFINITY;
        for (Node *n = w->far.next; n != &w->far; n = n->next) {
            double d = far_deadline(TIMER_OF(n));
            if (d < best) best = d;
        }
        *out = best;
        return 2;
    }
    return 0;
}

/* Earliest deadline as a double tick (exact below 2**53); returns 0 if empty. */
static int core_next_deadline(WheelObject *w, double *out) {
    int64_t exact;
    int found = core_next_deadline_exact(w, &exact, out);
    if (found == 1) *out = (double)exact;
    return found != 0;
}

/* Move the next due level-0 bucket into w->firing; returns 1, or 0 when none is due. */
static int core_pop_due(WheelObject *w, int64_t now) {
    for (;;) {
        int slot;
        int level = core_earliest(w, &slot);
        if (level < 0) break;
        int64_t start = slot_start(w->elapsed, level, slot);
        if (start > now) break;
        w->occupied[level] &= ~((uint64_t)1 << slot);
        w->elapsed = start;
        if (level == 0) {
            list_take(&w->firing, &w->buckets[0][slot]);
            for (Node *n = w->firing.next; n != &w->firing; n = n->next)
                TIMER_OF(n)->state = ST_FIRING;
            w->fired_tick = start;
            return 1;
        }
        Node tmp;
        list_take(&tmp, &w->buckets[level][slot]);
        while (!list_empty(&tmp)) {
            Node *n = tmp.next;
            list_unlink(n);
            TimerObject *t = TIMER_OF(n);
            core_place(w, t, t->deadline);
        }
    }
    if (now > w->elapsed) w->elapsed = now;
    return 0;
}

/* ---- the driver's pieces ------------------------------------------------------------- */

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

static int refuse(WheelObject *w) {
    if (w->closed)
        PyErr_SetString(WheelClosedErr, "cannot schedule on a closed TimingWheel");
    else
        PyErr_Format(WheelFullErr, "max_pending=%R timers are pending", w->max_pending);
    return -1;
}

/* Make and place a timer; args is a new reference that is stolen. */
static PyObject *wheel_add(WheelObject *w, double when, double now, PyObject *callback,
                           PyObject *args, PyObject *context, int idle_from_when) {
    if (!PyCallable_Check(callback)) {
        Py_DECREF(args);
        return PyErr_Format(PyExc_TypeError, "callback must be callable, got %R", callback);
    }
    if ((double)w->len >= w->capacity) {
        Py_DECREF(args);
        refuse(w);
        return NULL;
    }
    int far;
    double fard;
    int64_t deadline = deadline_of(when, w->tick, &far, &fard);
    if (!w->len) {
        int64_t n;
        if (idle_from_when) {
            n = floor_tick(now, w->tick);
        } else {
            double t;
            if (read_clock(w, &t) < 0) {
                Py_DECREF(args);
                return NULL;
            }
            n = floor_tick(t, w->tick);
        }
        if (n > w->elapsed) w->elapsed = n;
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
    t->node.prev = t->node.next = NULL;
    t->state = 0;
    t->level = t->slot = 0;
    PyObject_GC_Track(t);
    Py_INCREF(t); /* the wheel's reference */
    w->len++;
    double dl;
    if (far) {
        core_place_far(w, t, fard);
        dl = fard;
    } else {
        dl = (double)core_place(w, t, deadline);
    }
    if (dl < w->armed_tick && wheel_arm(w, dl) < 0) {
        /* the timer is placed; report the loop's error like Python would */
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static PyObject *split_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            PyObject **context) {
    *context = Py_None;
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, "context") == 0) {
                *context = args[nargs + i];
            } else {
                PyErr_Format(PyExc_TypeError,
                             "schedule() got an unexpected keyword argument %R", k);
                return NULL;
            }
        }
    }
    PyObject *rest = PyTuple_New(nargs - 2);
    if (rest == NULL) return NULL;
    for (Py_ssize_t i = 2; i < nargs; i++) PyTuple_SET_ITEM(rest, i - 2, Py_NewRef(args[i]));
    return rest;
}

static PyObject *Wheel_schedule(WheelObject *w, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    if (nargs < 2) {
        return PyErr_Format(PyExc_TypeError,
                            "schedule() missing required argument: '%s'",
                            nargs == 0 ? "delay" : "callback");
    }
    double now, when;
    if (when_after(w, args[0], &now, &when) < 0) return NULL;
    PyObject *context;
    PyObject *rest = split_args(args, nargs, kwnames, &context);
    if (rest == NULL) return NULL;
    return wheel_add(w, when, now, args[1], rest, context, 1);
}

static PyObject *Wheel_schedule_at(WheelObject *w, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    if (nargs < 2) {
        return PyErr_Format(PyExc_TypeError,
                            "schedule_at() missing required argument: '%s'",
                            nargs == 0 ? "when" : "callback");
    }
    double when;
    if (check_when(args[0], &when) < 0) return NULL;
    PyObject *context;
    PyObject *rest = split_args(args, nargs, kwnames, &context);
    if (rest == NULL) return NULL;
    return wheel_add(w, when, 0.0, args[1], rest, context, 0);
}

/* Fire one timer taken off the firing list (the list's reference is passed in). */
static int fire_one(WheelObject *w, TimerObject *t) {
    PyObject *callback = t->callback;
    PyObject *args = t->args;
    PyObject *context = t->context;
    t->callback = NULL;
    t->args = NULL;
    t->context = NULL;
    t->state = ST_FIRED;
    w->len--;
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
    while (core_pop_due(w, now)) {
        while (!list_empty(&w->firing)) {
            Node *n = w->firing.next;
            list_unlink(n);
            fired++;
            if (fire_one(w, TIMER_OF(n)) < 0) {
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
        w->fired_tick = w->elapsed - 1;
        while (!list_empty(&w->firing)) {
            Node *n = w->firing.next;
            list_unlink(n);
            TimerObject *t = TIMER_OF(n);
            core_place(w, t, t->deadline);
        }
    }
    w->armed_tick = INFINITY;
    int err = 0;
    if (!w->closed) {
        double d;
        if (core_next_deadline(w, &d)) err = wheel_arm(w, d);
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

/* The earliest deadline tick as an int (exact), or None. */
static PyObject *Wheel_next_deadline(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    int64_t exact;
    double d;
    switch (core_next_deadline_exact(w, &exact, &d)) {
    case 1:
        return PyLong_FromLongLong(exact);
    case 2:
        return PyLong_FromDouble(d);
    default:
        Py_RETURN_NONE;
    }
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

/* _t_insert(callback, deadline) -> (timer, deadline used): Core.insert on ticks. */
static PyObject *Wheel__t_insert(WheelObject *w, PyObject *args) {
    PyObject *callback, *dl;
    if (!PyArg_ParseTuple(args, "OO", &callback, &dl)) return NULL;
    int err;
    int64_t deadline = tick_arg(dl, &err);
    if (err) return NULL;
    TimerObject *t = PyObject_GC_New(TimerObject, &TimerType);
    if (t == NULL) return NULL;
    t->wheel = (WheelObject *)Py_NewRef(w);
    t->callback = Py_NewRef(callback);
    t->args = PyTuple_New(0);
    t->context = NULL;
    t->state = 0;
    PyObject_GC_Track(t);
    Py_INCREF(t);
    w->len++;
    int64_t used = core_place(w, t, deadline);
    return Py_BuildValue("NL", (PyObject *)t, (long long)used);
}

/* _t_move(timer, deadline) -> deadline used: Core.move on ticks. */
static PyObject *Wheel__t_move(WheelObject *w, PyObject *args) {
    PyObject *dl;
    TimerObject *t;
    if (!PyArg_ParseTuple(args, "O!O", &TimerType, &t, &dl)) return NULL;
    int err;
    int64_t deadline = tick_arg(dl, &err);
    if (err) return NULL;
    if (t->wheel != w || !(t->state == ST_BUCKET || t->state == ST_FIRING))
        return PyErr_Format(PyExc_ValueError, "%R is not pending", (PyObject *)t);
    core_unlink(w, t);
    return PyLong_FromLongLong(core_place(w, t, deadline));
}

/* _t_advance(now) -> the timers due by tick now, in firing order, marked fired (their
 * callbacks are not called): pop_due until nothing is due. */
static PyObject *Wheel__t_advance(WheelObject *w, PyObject *arg) {
    int err;
    int64_t now = tick_arg(arg, &err);
    if (err) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    while (core_pop_due(w, now)) {
        while (!list_empty(&w->firing)) {
            Node *n = w->firing.next;
            list_unlink(n);
            TimerObject *t = TIMER_OF(n);
            t->state = ST_FIRED;
            Py_CLEAR(t->callback);
            Py_CLEAR(t->args);
            Py_CLEAR(t->context);
            w->len--;
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

static PyObject *Wheel_next_when(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    double d;
    if (!core_next_deadline(w, &d)) Py_RETURN_NONE;
    return PyFloat_FromDouble(d * w->tick);
}

static Py_ssize_t Wheel_len(WheelObject *w) { return w->len; }

static void collect(WheelObject *w, Node *h, PyObject *list, int *err) {
    for (Node *n = h->next; n != h; n = n->next)
        if (!*err && PyList_Append(list, (PyObject *)TIMER_OF(n)) < 0) *err = 1;
}

/* Every timer in a bucket (not the firing one), by deadline then FIFO. */
static PyObject *wheel_entries(WheelObject *w, int with_far) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    int err = 0;
    for (int level = 0; level < NLEVELS; level++)
        for (int slot = 0; slot < SLOTS; slot++) collect(w, &w->buckets[level][slot], list, &err);
    if (with_far) collect(w, &w->far, list, &err);
    if (err) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

/* close(): take every timer out of the buckets, in bucket order (the caller sorts them
 * by deadline, stably: a tick's timers share one bucket, so FIFO survives). */
static PyObject *Wheel__drain(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = wheel_entries(w, 1);
    if (list == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        TimerObject *t = (TimerObject *)PyList_GET_ITEM(list, i);
        core_unlink(w, t);
        t->state = ST_CLOSED;
        Py_DECREF(t); /* the wheel's reference; the list holds its own */
    }
    for (int level = 0; level < NLEVELS; level++) w->occupied[level] = 0;
    w->len -= n;
    return list;
}

static PyObject *Wheel__entries(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    return wheel_entries(w, 1);
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

/* The core's ground rules and (unless core_only) the driver's arming rule. O(n). */
static PyObject *wheel_check(WheelObject *w, int core_only) {
    Py_ssize_t count = 0;
    int64_t elapsed = w->elapsed;
    int64_t earliest = INT64_MAX;
    if (w->fired_tick > elapsed) return assert_fail("fired > elapsed");
    for (int level = 0; level < NLEVELS; level++) {
        int pos = (int)((elapsed >> (level * BITS)) & MASK);
        for (int slot = 0; slot < SLOTS; slot++) {
            Node *h = &w->buckets[level][slot];
            int bit = (int)((w->occupied[level] >> slot) & 1);
            if (bit != !list_empty(h))
                return assert_fail("occupancy bit %d/%d is wrong", level, slot);
            if (level && !list_empty(h) && slot == pos)
                return assert_fail("current slot of level %d is not empty", level);
            for (Node *n = h->next; n != h; n = n->next) {
                TimerObject *t = TIMER_OF(n);
                count++;
                if (t->state != ST_BUCKET || t->level != level || t->slot != slot)
                    return assert_fail("timer in %d/%d has a wrong place", level, slot);
                if (t->deadline < elapsed) return assert_fail("timer due before elapsed");
                uint64_t diff = (uint64_t)(elapsed ^ t->deadline);
                int lv = diff < SLOTS ? 0 : (bit_length64(diff) - 1) / BITS;
                int sl = (int)((t->deadline >> (lv * BITS)) & MASK);
                if (lv != level || sl != slot)
                    return assert_fail("timer in %d/%d belongs in %d/%d", level, slot, lv, sl);
                if (Py_REFCNT(t) < 1) return assert_fail("dead timer in a bucket");
                if (t->deadline < earliest) earliest = t->deadline;
            }
        }
    }
    for (Node *n = w->far.next; n != &w->far; n = n->next) count++;
    if (count != w->len)
        return assert_fail("len %zd != %zd in buckets", w->len, count);
    if (core_only) Py_RETURN_NONE;
    if (w->len == 0) {
        if (w->handle != Py_None) return assert_fail("armed while empty");
    } else {
        if (w->handle == Py_None) return assert_fail("not armed while timers are pending");
        if (earliest != INT64_MAX && w->armed_tick > (double)earliest)
            return assert_fail("armed later than a timer is due");
    }
    Py_RETURN_NONE;
}

static PyObject *Wheel__check(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    return wheel_check(w, 0);
}

static PyObject *Wheel__check_core(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    return wheel_check(w, 1);
}

static PyObject *Wheel__init_core(WheelObject *w, PyObject *args) {
    double tick, capacity;
    PyObject *loop, *time, *context, *max_pending, *call_at, *run;
    long long elapsed;
    if (!PyArg_ParseTuple(args, "dOOOOLd", &tick, &loop, &time, &context, &max_pending,
                          &elapsed, &capacity))
        return NULL;
    call_at = PyObject_GetAttr(loop, str_call_at);
    if (call_at == NULL) return NULL;
    run = PyObject_GetAttr((PyObject *)w, str_run);
    if (run == NULL) {
        Py_DECREF(call_at);
        return NULL;
    }
    w->tick = tick;
    Py_XSETREF(w->loop, Py_NewRef(loop));
    Py_XSETREF(w->time, Py_NewRef(time));
    w->monotonic = time == time_monotonic;
    Py_XSETREF(w->context, Py_NewRef(context));
    Py_XSETREF(w->max_pending, Py_NewRef(max_pending));
    Py_XSETREF(w->call_at, call_at);
    Py_XSETREF(w->run, run);
    w->capacity = capacity;
    w->elapsed = elapsed;
    Py_RETURN_NONE;
}

static PyObject *Wheel_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    WheelObject *w = (WheelObject *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->tick = 0.001;
    w->handle = Py_NewRef(Py_None);
    w->max_pending = Py_NewRef(Py_None);
    w->capacity = INFINITY;
    w->armed_tick = INFINITY;
    w->fired_tick = -1;
    w->levels = 1;
    for (int level = 0; level < NLEVELS; level++)
        for (int slot = 0; slot < SLOTS; slot++) list_init(&w->buckets[level][slot]);
    list_init(&w->firing);
    list_init(&w->far);
    return (PyObject *)w;
}

static int visit_list(Node *h, visitproc visit, void *arg) {
    for (Node *n = h->next; n != h; n = n->next) Py_VISIT((PyObject *)TIMER_OF(n));
    return 0;
}

static int Wheel_traverse(WheelObject *w, visitproc visit, void *arg) {
    Py_VISIT(w->loop);
    Py_VISIT(w->time);
    Py_VISIT(w->context);
    Py_VISIT(w->handle);
    Py_VISIT(w->max_pending);
    Py_VISIT(w->call_at);
    Py_VISIT(w->run);
    for (int level = 0; level < NLEVELS; level++) {
        if (!w->occupied[level]) continue;
        for (int slot = 0; slot < SLOTS; slot++) {
            int r = visit_list(&w->buckets[level][slot], visit, arg);
            if (r) return r;
        }
    }
    int r = visit_list(&w->firing, visit, arg);
    if (r) return r;
    return visit_list(&w->far, visit, arg);
}

static void clear_list(WheelObject *w, Node *h) {
    while (!list_empty(h)) {
        Node *n = h->next;
        list_unlink(n);
        TimerObject *t = TIMER_OF(n);
        t->state = ST_CLOSED;
        w->len--;
        Py_DECREF(t);
    }
}

static int Wheel_clear(WheelObject *w) {
    for (int level = 0; level < NLEVELS; level++) {
        for (int slot = 0; slot < SLOTS; slot++) clear_list(w, &w->buckets[level][slot]);
        w->occupied[level] = 0;
    }
    clear_list(w, &w->firing);
    clear_list(w, &w->far);
    w->monotonic = 0; /* so that a late call finds w->time gone and refuses */
    Py_CLEAR(w->loop);
    Py_CLEAR(w->time);
    Py_CLEAR(w->context);
    Py_CLEAR(w->handle);
    Py_CLEAR(w->max_pending);
    Py_CLEAR(w->call_at);
    Py_CLEAR(w->run);
    return 0;
}

static void Wheel_dealloc(WheelObject *w) {
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_GC_UnTrack(w);
    Wheel_clear(w);
    tp->tp_free((PyObject *)w);
}

static PyObject *Wheel_get_len(WheelObject *w, void *c) { return PyLong_FromSsize_t(w->len); }
static PyObject *Wheel_get_levels(WheelObject *w, void *c) { return PyLong_FromLong(w->levels); }
static PyObject *Wheel_get_elapsed(WheelObject *w, void *c) {
    return PyLong_FromLongLong(w->elapsed);
}

static PyObject *Wheel_get_closed(WheelObject *w, void *c) { return PyBool_FromLong(w->closed); }
static int Wheel_set_closed(WheelObject *w, PyObject *v, void *c) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _closed");
        return -1;
    }
    int b = PyObject_IsTrue(v);
    if (b < 0) return -1;
    w->closed = b;
    return 0;
}

static PyObject *Wheel__disarm(WheelObject *w, PyObject *Py_UNUSED(ignored)) {
    if (wheel_disarm(w) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Wheel_methods[] = {
    {"schedule", (PyCFunction)(void (*)(void))Wheel_schedule, METH_FASTCALL | METH_KEYWORDS,
     NULL},
    {"schedule_at", (PyCFunction)(void (*)(void))Wheel_schedule_at,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_run", (PyCFunction)Wheel__run, METH_NOARGS, NULL},
    {"next_when", (PyCFunction)Wheel_next_when, METH_NOARGS, NULL},
    {"_next_deadline", (PyCFunction)Wheel_next_deadline, METH_NOARGS, NULL},
    {"_drain", (PyCFunction)Wheel__drain, METH_NOARGS, NULL},
    {"_entries", (PyCFunction)Wheel__entries, METH_NOARGS, NULL},
    {"_check", (PyCFunction)Wheel__check, METH_NOARGS, NULL},
    {"_check_core", (PyCFunction)Wheel__check_core, METH_NOARGS, NULL},
    {"_disarm", (PyCFunction)Wheel__disarm, METH_NOARGS, NULL},
    {"_init_core", (PyCFunction)Wheel__init_core, METH_VARARGS, NULL},
    {"_t_insert", (PyCFunction)Wheel__t_insert, METH_VARARGS, NULL},
    {"_t_move", (PyCFunction)Wheel__t_move, METH_VARARGS, NULL},
    {"_t_advance", (PyCFunction)Wheel__t_advance, METH_O, NULL},
    {NULL},
};

static PyMemberDef Wheel_members[] = {
    {"_tick", T_DOUBLE, offsetof(WheelObject, tick), READONLY, NULL},
    {"_loop", T_OBJECT, offsetof(WheelObject, loop), READONLY, NULL},
    {"_time", T_OBJECT, offsetof(WheelObject, time), READONLY, NULL},
    {"_context", T_OBJECT, offsetof(WheelObject, context), READONLY, NULL},
    {"_handle", T_OBJECT, offsetof(WheelObject, handle), READONLY, NULL},
    {"_max_pending", T_OBJECT, offsetof(WheelObject, max_pending), READONLY, NULL},
    {"_capacity", T_DOUBLE, offsetof(WheelObject, capacity), 0, NULL},
    {"_armed_tick", T_DOUBLE, offsetof(WheelObject, armed_tick), READONLY, NULL},
    {"_fired", T_LONGLONG, offsetof(WheelObject, fired), READONLY, NULL},
    {"_wakeups", T_LONGLONG, offsetof(WheelObject, wakeups), READONLY, NULL},
    {"_cancelled", T_LONGLONG, offsetof(WheelObject, cancelled), READONLY, NULL},
    {"_late_max", T_DOUBLE, offsetof(WheelObject, late_max), READONLY, NULL},
    {"_late_sum", T_DOUBLE, offsetof(WheelObject, late_sum), READONLY, NULL},
    {NULL},
};

static PyGetSetDef Wheel_getset[] = {
    {"_len", (getter)Wheel_get_len, NULL, NULL, NULL},
    {"_levels", (getter)Wheel_get_levels, NULL, NULL, NULL},
    {"_elapsed", (getter)Wheel_get_elapsed, NULL, NULL, NULL},
    {"_closed", (getter)Wheel_get_closed, (setter)Wheel_set_closed, NULL, NULL},
    {NULL},
};

static PySequenceMethods Wheel_as_sequence = {.sq_length = (lenfunc)Wheel_len};

static PyTypeObject WheelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tickwheel.wheel._cwheel.Wheel",
    .tp_basicsize = sizeof(WheelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled wheel: the base of the C TimingWheel.",
    .tp_new = Wheel_new,
    .tp_dealloc = (destructor)Wheel_dealloc,
    .tp_traverse = (traverseproc)Wheel_traverse,
    .tp_clear = (inquiry)Wheel_clear,
    .tp_methods = Wheel_methods,
    .tp_members = Wheel_members,
    .tp_getset = Wheel_getset,
    .tp_as_sequence = &Wheel_as_sequence,
};

/* ---- Timer --------------------------------------------------------------------------- */

static inline int is_pending(TimerObject *t) {
    return t->state == ST_BUCKET || t->state == ST_FIRING || t->state == ST_FAR;
}

static PyObject *Timer_cancel(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    if (!is_pending(t)) Py_RETURN_FALSE;
    WheelObject *w = t->wheel;
    core_unlink(w, t);
    t->state = ST_CANCELLED;
    PyObject *cb = t->callback, *args = t->args, *ctx = t->context;
    t->callback = t->args = t->context = NULL;
    w->cancelled++;
    w->len--;
    int err = 0;
    if (!w->len) err = wheel_disarm(w);
    Py_XDECREF(cb);
    Py_XDECREF(args);
    Py_XDECREF(ctx);
    Py_DECREF(t); /* the wheel's reference; the caller still holds one */
    if (err < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Timer_cancelled(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(t->state == ST_CANCELLED || t->state == ST_CLOSED);
}

static PyObject *Timer_pending(TimerObject *t, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(is_pending(t));
}

static double timer_deadline(TimerObject *t) {
    return t->level == FAR_LEVEL ? far_deadline(t) : (double)t->deadline;
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
    core_unlink(w, t);
    double dl;
    if (far) {
        core_place_far(w, t, fard);
        dl = fard;
    } else {
        dl = (double)core_place(w, t, deadline);
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

static PyObject *Timer_repr(TimerObject *t) { return PyObject_CallOneArg(TimerRepr, (PyObject *)t); }

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
    if (t->level == FAR_LEVEL) return PyLong_FromDouble(far_deadline(t));
    return PyLong_FromLongLong(t->deadline);
}
static PyObject *Timer_get_fired(TimerObject *t, void *c) {
    return PyBool_FromLong(t->state == ST_FIRED);
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

/* ---- Timeout ------------------------------------------------------------------------- */

/* The context manager of wheel/_timeout.py (the reference), on the compiled wheel: the
 * same states, checks, messages and order of effects. __aenter__ and __aexit__ return a
 * one-shot awaitable (Step) that does the work when awaited, as a coroutine would. */

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

static PyTypeObject TimeoutType;
static PyTypeObject StepType;
static PyObject *CurrentTask, *CancelledErr;
static PyObject *str_on_timeout, *str_call_soon, *str_cancelling, *str_uncancel;
static PyObject *py_inf;

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
    if (self->state == TO_ENTERED && self->when != Py_None) {
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

static PyObject *timeout_exit(TimeoutObject *self, PyObject *exc_type, PyObject *exc_val) {
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
        if (ours && exc_type == CancelledErr) {
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
    PyObject *r = s->exc_type == NULL ? timeout_enter(cm) : timeout_exit(cm, s->exc_type, s->exc_val);
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

/* ---- module -------------------------------------------------------------------------- */

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

static PyObject *mod_sizes(PyObject *m, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("nn", (Py_ssize_t)sizeof(TimerObject), (Py_ssize_t)sizeof(WheelObject));
}

static PyMethodDef module_methods[] = {
    {"_setup", (PyCFunction)mod_setup, METH_VARARGS, NULL},
    {"_sizes", (PyCFunction)mod_sizes, METH_NOARGS, NULL},
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
