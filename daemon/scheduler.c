#include "convd/status.h"
#include "scheduler.h"

void sched_init(struct sched *s, uint32_t limit, uint32_t max_batch)
{
    for (int l = 0; l < SCHED_LEVELS; l++)
        list_init(&s->ring[l]);
    s->queued = 0;
    s->limit = limit;
    s->max_batch = max_batch ? max_batch : 1;
    s->deadline_floor = 0;
}

void sched_client_init(struct sched_client *c)
{
    for (int l = 0; l < SCHED_LEVELS; l++) {
        list_init(&c->fifo[l]);
        list_init(&c->ring[l]);
    }
    c->cursor = NULL;
    c->queued = 0;
}

int sched_push(struct sched *s, struct sched_client *c, struct sched_item *it)
{
    if (it->priority >= SCHED_LEVELS)
        return CONVD_EINVAL;
    if (s->queued >= s->limit)
        return CONVD_EQUEUEFULL;
    unsigned l = it->priority;
    it->client = c;
    if (list_empty(&c->fifo[l]))
        list_add_tail(&s->ring[l], &c->ring[l]);
    list_add_tail(&c->fifo[l], &it->link);
    c->queued++;
    s->queued++;
    if (it->deadline_ns != 0 && (s->deadline_floor == 0 || it->deadline_ns < s->deadline_floor))
        s->deadline_floor = it->deadline_ns;
    return 0;
}

/* Unlinks an item from its client's FIFO, and the client from the ring when that empties it. */
static void sched_unlink(struct sched *s, struct sched_item *it)
{
    struct sched_client *c = it->client;
    unsigned l = it->priority;
    list_del(&it->link);
    if (list_empty(&c->fifo[l]))
        list_del(&c->ring[l]);
    c->queued--;
    s->queued--;
}

static int sched_head_level(const struct sched *s)
{
    for (int l = 0; l < SCHED_LEVELS; l++)
        if (!list_empty(&s->ring[l]))
            return l;
    return -1;
}

static struct sched_item *sched_head(const struct sched *s, int level)
{
    struct sched_client *c = list_entry(s->ring[level].next, struct sched_client, ring[level]);
    return list_entry(c->fifo[level].next, struct sched_item, link);
}

/* Collects up to `cap` more items with the head's problem at one level, one per client per pass.
 * `take` false only counts. Returns the number found. */
static size_t sched_gather_level(struct sched *s, int l, const struct convd_problem *p,
                                 struct sched_item **out, size_t cap, int take)
{
    struct list_node *pos, *tmp;
    size_t n = 0;
    list_for_each(pos, &s->ring[l])
    {
        struct sched_client *c = list_entry(pos, struct sched_client, ring[l]);
        c->cursor = &c->fifo[l];
    }
    while (n < cap) {
        size_t took = 0;
        list_for_each_safe(pos, tmp, &s->ring[l])
        {
            struct sched_client *c = list_entry(pos, struct sched_client, ring[l]);
            struct list_node *q;
            for (q = c->cursor->next; q != &c->fifo[l]; q = q->next)
                if (convd_problem_same(list_entry(q, struct sched_item, link)->problem, p))
                    break;
            if (q == &c->fifo[l]) {
                c->cursor = c->fifo[l].prev; /* exhausted: later passes find nothing at once */
                continue;
            }
            took++;
            if (take) {
                struct sched_item *it = list_entry(q, struct sched_item, link);
                c->cursor = q->prev;
                /* unlinking may drop c from the ring: the safe iteration already holds tmp */
                sched_unlink(s, it);
                out[n] = it;
            } else {
                c->cursor = q;
            }
            if (++n == cap)
                break;
        }
        if (took == 0)
            break;
    }
    return n;
}

size_t sched_take(struct sched *s, struct sched_item **out, size_t cap)
{
    int level = sched_head_level(s);
    if (level < 0 || cap == 0)
        return 0;
    if (cap > s->max_batch)
        cap = s->max_batch;
    struct sched_item *head = sched_head(s, level);
    struct sched_client *hc = head->client;
    sched_unlink(s, head);
    /* Round-robin: the client just served goes to the back of its ring. */
    if (!list_unlinked(&hc->ring[level])) {
        list_del(&hc->ring[level]);
        list_add_tail(&s->ring[level], &hc->ring[level]);
    }
    out[0] = head;
    size_t n = 1;
    for (int l = level; l < SCHED_LEVELS && n < cap; l++)
        n += sched_gather_level(s, l, head->problem, out + n, cap - n, 1);
    return n;
}

size_t sched_peek(struct sched *s, const struct sched_item **ret_head)
{
    int level = sched_head_level(s);
    *ret_head = NULL;
    if (level < 0)
        return 0;
    const struct sched_item *head = sched_head(s, level);
    *ret_head = head;
    /* Counting walks the same passes as taking (moving only the scratch cursors); the head,
     * still queued, counts itself. */
    size_t n = 0;
    for (int l = level; l < SCHED_LEVELS && n < s->max_batch; l++)
        n += sched_gather_level(s, l, head->problem, NULL, s->max_batch - n, 0);
    return n;
}

size_t sched_expire(struct sched *s, uint64_t now_ns, struct list_node *out)
{
    if (s->deadline_floor == 0 || now_ns < s->deadline_floor)
        return 0;
    size_t n = 0;
    uint64_t floor = 0; /* the earliest deadline left */
    for (int l = 0; l < SCHED_LEVELS; l++) {
        struct list_node *cpos, *ctmp;
        list_for_each_safe(cpos, ctmp, &s->ring[l])
        {
            struct sched_client *c = list_entry(cpos, struct sched_client, ring[l]);
            struct list_node *pos, *tmp;
            list_for_each_safe(pos, tmp, &c->fifo[l])
            {
                struct sched_item *it = list_entry(pos, struct sched_item, link);
                if (it->deadline_ns != 0 && it->deadline_ns <= now_ns) {
                    sched_unlink(s, it);
                    list_add_tail(out, &it->link);
                    n++;
                } else if (it->deadline_ns != 0 && (floor == 0 || it->deadline_ns < floor)) {
                    floor = it->deadline_ns;
                }
            }
        }
    }
    s->deadline_floor = floor;
    return n;
}

static size_t sched_drain_fifo(struct sched *s, struct sched_client *c, int l,
                               struct list_node *out)
{
    size_t n = 0;
    while (!list_empty(&c->fifo[l])) {
        struct sched_item *it = list_entry(c->fifo[l].next, struct sched_item, link);
        sched_unlink(s, it);
        list_add_tail(out, &it->link);
        n++;
    }
    return n;
}

size_t sched_cancel_client(struct sched *s, struct sched_client *c, struct list_node *out)
{
    size_t n = 0;
    for (int l = 0; l < SCHED_LEVELS; l++)
        n += sched_drain_fifo(s, c, l, out);
    return n;
}

size_t sched_cancel_all(struct sched *s, struct list_node *out)
{
    size_t n = 0;
    for (int l = 0; l < SCHED_LEVELS; l++)
        while (!list_empty(&s->ring[l])) {
            struct sched_client *c = list_entry(s->ring[l].next, struct sched_client, ring[l]);
            n += sched_drain_fifo(s, c, l, out);
        }
    return n;
}

uint64_t sched_next_deadline(const struct sched *s)
{
    uint64_t best = 0;
    for (int l = 0; l < SCHED_LEVELS; l++) {
        const struct list_node *cpos;
        list_for_each(cpos, &s->ring[l])
        {
            const struct sched_client *c = list_entry(cpos, struct sched_client, ring[l]);
            const struct list_node *pos;
            list_for_each(pos, &c->fifo[l])
            {
                const struct sched_item *it = list_entry(pos, struct sched_item, link);
                if (it->deadline_ns != 0 && (best == 0 || it->deadline_ns < best))
                    best = it->deadline_ns;
            }
        }
    }
    return best;
}
