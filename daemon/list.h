/*
 * Intrusive doubly linked lists (the Linux kernel's list_head): a node lives inside the object it
 * links, so queues of requests, connections and datagrams cost no allocation of their own.
 */
#ifndef CONVD_DAEMON_LIST_H
#define CONVD_DAEMON_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list_node {
    struct list_node *prev, *next;
};

#define LIST_INIT(name)                                                                            \
    {                                                                                              \
        &(name), &(name)                                                                           \
    }

/* The object that contains node `ptr` as its member `member`. */
#define list_entry(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static inline void list_init(struct list_node *head)
{
    head->prev = head->next = head;
}

static inline bool list_empty(const struct list_node *head)
{
    return head->next == head;
}

/* True when a node initialised with list_init() and removed with list_del() is on no list. */
static inline bool list_unlinked(const struct list_node *node)
{
    return node->next == node;
}

static inline void list_insert_between(struct list_node *n, struct list_node *prev,
                                       struct list_node *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

static inline void list_add_tail(struct list_node *head, struct list_node *n)
{
    list_insert_between(n, head->prev, head);
}

static inline void list_add_head(struct list_node *head, struct list_node *n)
{
    list_insert_between(n, head, head->next);
}

/* Unlinks n and leaves it pointing at itself, so list_unlinked() is true and a second list_del()
 * is harmless. */
static inline void list_del(struct list_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* Moves every node of `from` to the tail of `to`, leaving `from` empty. */
static inline void list_splice_tail(struct list_node *to, struct list_node *from)
{
    if (list_empty(from))
        return;
    struct list_node *first = from->next, *last = from->prev;
    first->prev = to->prev;
    to->prev->next = first;
    last->next = to;
    to->prev = last;
    list_init(from);
}

static inline size_t list_length(const struct list_node *head)
{
    size_t n = 0;
    for (const struct list_node *p = head->next; p != head; p = p->next)
        n++;
    return n;
}

#define list_for_each(pos, head) for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)

/* Iteration that survives removing `pos`. */
#define list_for_each_safe(pos, tmp, head)                                                         \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                               \
         (pos) = (tmp), (tmp) = (pos)->next)

#endif
