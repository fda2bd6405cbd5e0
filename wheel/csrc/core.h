/* The wheel's core on integer ticks: buckets, levels, and advancing the clock.
 *
 * The C twin of wheel/_core.py (the reference), on its ground rules; it knows nothing of
 * the loop, the clock in seconds or Python callbacks. An Entry (embedded in each Timer)
 * sits in one intrusive list at a time:
 *
 * - Levels are fixed: 11 levels of 64 slots cover deadlines below 2**62 ticks; a bucket's
 *   occupancy bit is exact (an unlink that empties a bucket clears it), so the earliest
 *   bucket is a find-first-set per level. Deadlines at or beyond 2**62 ticks (over
 *   146,000 years at 1 ms) go to a "far" list; they keep their exact loop time but can
 *   never come due, since the core's clock (an int64 of ticks) cannot get there.
 * - Advancing pops the earliest due bucket. A level-0 bucket moves whole to the firing
 *   list; an upper one is cascaded: its entries are re-placed one by one, in list order,
 *   which keeps FIFO within a tick (the Python core's leaf trick only saves bytecode).
 *
 * The core never takes or drops a reference: its callers own the entries.
 */

#ifndef TICKWHEEL_CORE_H
#define TICKWHEEL_CORE_H

#include <Python.h> /* Py_ssize_t; the translation unit includes it first */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "list.h"

#define BITS 6
#define SLOTS 64
#define MASK 63
#define NLEVELS 11
#define FAR_LEVEL 0xFF /* Entry.level of a far deadline */
#define FAR_LIMIT 4611686018427387904.0 /* 2**62 */

/* Where an entry is; the core sets the first three, the timer and driver the rest. */
enum {
    ST_BUCKET = 1, /* in a level bucket (level, slot) */
    ST_FIRING,     /* in the bucket handed out to the firing loop */
    ST_FAR,        /* in the far list */
    ST_FIRED,      /* callback ran (or is running) */
    ST_CANCELLED,  /* cancel() dropped callback and args */
    ST_CLOSED,     /* returned by close(): not pending, callback kept */
};

typedef struct {
    Node node;
    int64_t deadline; /* tick; for ST_FAR the bits of a double (entry_far_deadline) */
    uint8_t state;
    uint8_t level;
    uint8_t slot;
    uint8_t kind;   /* what holds the entry (objects.h: KIND_*); the core never reads it */
    uint32_t owner; /* a loop handle's wheel (handle.h: loop_wheels); the core never reads it */
} Entry;

#define ENTRY_OF(n) CONTAINER_OF(n, Entry, node)

typedef struct {
    int64_t elapsed;    /* the core's clock: the ticks it has advanced past */
    int64_t fired_tick; /* the last tick handed out to fire */
    Py_ssize_t len;     /* pending entries, counted by the callers */
    int levels;         /* levels used so far, as the Python core allocates them */
    uint64_t occupied[NLEVELS];
    Node buckets[NLEVELS][SLOTS];
    Node firing; /* the level-0 bucket being fired */
    Node far;    /* deadlines at or beyond 2**62 ticks */
} Core;

static inline int bit_length64(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

static void core_init(Core *c) {
    c->fired_tick = -1;
    c->levels = 1;
    for (int level = 0; level < NLEVELS; level++)
        for (int slot = 0; slot < SLOTS; slot++) list_init(&c->buckets[level][slot]);
    list_init(&c->firing);
    list_init(&c->far);
}

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

/* Place an entry (not linked) due at ``deadline``; raises an overdue one (_core.py's
 * rule 6). Returns the deadline used. */
static int64_t core_place(Core *c, Entry *e, int64_t deadline) {
    int64_t elapsed = c->elapsed;
    if (deadline <= elapsed) deadline = elapsed > c->fired_tick ? elapsed : c->fired_tick + 1;
    uint64_t diff = (uint64_t)(elapsed ^ deadline);
    int level, slot;
    if (diff < SLOTS) {
        level = 0;
        slot = (int)(deadline & MASK);
    } else {
        level = (bit_length64(diff) - 1) / BITS;
        slot = (int)((deadline >> (level * BITS)) & MASK);
    }
    if (level + 1 > c->levels) c->levels = level + 1;
    list_append(&c->buckets[level][slot], &e->node);
    c->occupied[level] |= (uint64_t)1 << slot;
    e->state = ST_BUCKET;
    e->level = (uint8_t)level;
    e->slot = (uint8_t)slot;
    e->deadline = deadline;
    return deadline;
}

static void core_place_far(Core *c, Entry *e, double fard) {
    list_append(&c->far, &e->node);
    e->state = ST_FAR;
    e->level = FAR_LEVEL;
    /* the bits of the double, to keep its exact value */
    memcpy(&e->deadline, &fard, sizeof fard);
    /* levels as the Python core would have allocated them */
    int bexp;
    frexp(fard, &bexp);
    int lv = (bexp - 1) / BITS + 1;
    if (lv > c->levels) c->levels = lv;
}

static inline double entry_far_deadline(Entry *e) {
    double d;
    memcpy(&d, &e->deadline, sizeof d);
    return d;
}

/* Unlink a pending entry, keeping the occupancy bit exact. */
static inline void core_unlink(Core *c, Entry *e) {
    if (e->state == ST_BUCKET) {
        Node *h = &c->buckets[e->level][e->slot];
        list_unlink(&e->node);
        if (list_empty(h)) c->occupied[e->level] &= ~((uint64_t)1 << e->slot);
    } else {
        list_unlink(&e->node);
    }
}

static inline int64_t slot_start(int64_t elapsed, int level, int slot) {
    int shift = level * BITS;
    int above = shift + BITS;
    uint64_t hi = above >= 64 ? 0 : (((uint64_t)elapsed >> above) << above);
    return (int64_t)(hi | ((uint64_t)slot << shift));
}

/* Earliest non-empty bucket: returns its level, or -1; *slot set. */
static inline int core_earliest(Core *c, int *slot) {
    int64_t elapsed = c->elapsed;
    for (int level = 0; level < c->levels && level < NLEVELS; level++) {
        uint64_t bits = c->occupied[level];
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
static int core_next_deadline_exact(Core *c, int64_t *exact, double *out) {
    int slot;
    int level = core_earliest(c, &slot);
    if (level == 0) {
        *exact = slot_start(c->elapsed, 0, slot);
        return 1;
    }
    if (level > 0) {
        Node *h = &c->buckets[level][slot];
        int64_t best = INT64_MAX;
        for (Node *n = h->next; n != h; n = n->next) {
            int64_t d = ENTRY_OF(n)->deadline;
            if (d < best) best = d;
        }
        *exact = best;
        return 1;
    }
    if (!list_empty(&c->far)) {
        double best = INFINITY;
        for (Node *n = c->far.next; n != &c->far; n = n->next) {
            double d = entry_far_deadline(ENTRY_OF(n));
            if (d < best) best = d;
        }
        *out = best;
        return 2;
    }
    return 0;
}

/* Earliest deadline as a double tick (exact below 2**53); returns 0 if empty. */
static int core_next_deadline(Core *c, double *out) {
    int64_t exact;
    int found = core_next_deadline_exact(c, &exact, out);
    if (found == 1) *out = (double)exact;
    return found != 0;
}

/* Move the next due level-0 bucket into c->firing; returns 1, or 0 when none is due. */
static int core_pop_due(Core *c, int64_t now) {
    for (;;) {
        int slot;
        int level = core_earliest(c, &slot);
        if (level < 0) break;
        int64_t start = slot_start(c->elapsed, level, slot);
        if (start > now) break;
        c->occupied[level] &= ~((uint64_t)1 << slot);
        c->elapsed = start;
        if (level == 0) {
            list_take(&c->firing, &c->buckets[0][slot]);
            for (Node *n = c->firing.next; n != &c->firing; n = n->next)
                ENTRY_OF(n)->state = ST_FIRING;
            c->fired_tick = start;
            return 1;
        }
        Node tmp;
        list_take(&tmp, &c->buckets[level][slot]);
        while (!list_empty(&tmp)) {
            Node *n = tmp.next;
            list_unlink(n);
            Entry *e = ENTRY_OF(n);
            core_place(c, e, e->deadline);
        }
    }
    if (now > c->elapsed) c->elapsed = now;
    return 0;
}

#endif /* TICKWHEEL_CORE_H */
