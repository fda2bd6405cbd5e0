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

/* ---- module -------------------------------------------------------------------------- */

static PyObject *mod_setup(PyObject *m, PyObject *args) {
    PyObject *closed, *full, *slow_when_after, *slow_check_when, *timer_repr;
    if (!PyArg_ParseTuple(args, "OOOOO", &closed, &full, &slow_when_after, &slow_check_when,
                          &timer_repr))
        return NULL;
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
    PyObject *time_mod = PyImport_ImportModule("time");
    if (time_mod == NULL) return NULL;
    time_monotonic = PyObject_GetAttrString(time_mod, "monotonic");
    Py_DECREF(time_mod);
    if (time_monotonic == NULL) return NULL;
    kwnames_context = PyTuple_Pack(1, str_context);
    if (kwnames_context == NULL) return NULL;
    if (PyType_Ready(&TimerType) < 0 || PyType_Ready(&WheelType) < 0) return NULL;
    PyObject *m = PyModule_Create(&cwheel_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Timer", (PyObject *)&TimerType) < 0 ||
        PyModule_AddObjectRef(m, "Wheel", (PyObject *)&WheelType) < 0 ||
        PyModule_AddIntConstant(m, "NLEVELS", NLEVELS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
