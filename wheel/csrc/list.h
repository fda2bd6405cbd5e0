/* An intrusive circular doubly-linked list.
 *
 * The links live inside the element (a Node member), so adding an element allocates
 * nothing. A list is a sentinel head Node; an empty list is a head that points at itself.
 * Appending, unlinking and moving a whole list are O(1). CONTAINER_OF goes back from a
 * Node to the struct that holds it.
 */

#ifndef TICKWHEEL_LIST_H
#define TICKWHEEL_LIST_H

#include <stddef.h>

typedef struct Node {
    struct Node *prev;
    struct Node *next;
} Node;

#define CONTAINER_OF(node, type, member) ((type *)((char *)(node) - offsetof(type, member)))

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

#endif /* TICKWHEEL_LIST_H */
