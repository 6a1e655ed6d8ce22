#include <stdlib.h>

#include "convd/status.h"
#include "idmap.h"
#include "mix.h"

void idmap_init(struct idmap *m)
{
    m->slots = NULL;
    m->cap = 0;
    m->count = 0;
}

void idmap_free(struct idmap *m)
{
    free(m->slots);
    idmap_init(m);
}

static struct idmap_slot *idmap_find(const struct idmap *m, uint64_t key)
{
    if (m->cap == 0)
        return NULL;
    for (size_t i = mix_id_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        struct idmap_slot *s = &m->slots[i];
        if (s->value == NULL)
            return NULL;
        if (s->key == key)
            return s;
    }
}

void *idmap_get(const struct idmap *m, uint64_t key)
{
    struct idmap_slot *s = idmap_find(m, key);
    return s != NULL ? s->value : NULL;
}

static void idmap_insert_new(struct idmap_slot *slots, size_t cap, uint64_t key, void *value)
{
    size_t i = mix_id_slot(key, cap);
    while (slots[i].value != NULL)
        i = (i + 1) & (cap - 1);
    slots[i].key = key;
    slots[i].value = value;
}

static int idmap_grow(struct idmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    struct idmap_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return CONVD_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].value != NULL)
            idmap_insert_new(slots, cap, m->slots[i].key, m->slots[i].value);
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int idmap_put(struct idmap *m, uint64_t key, void *value)
{
    if (idmap_find(m, key) != NULL)
        return CONVD_EEXIST;
    /* keep the load under 3/4 so probe runs stay short */
    if ((m->count + 1) * 4 > m->cap * 3) {
        int rc = idmap_grow(m);
        if (rc != 0)
            return rc;
    }
    idmap_insert_new(m->slots, m->cap, key, value);
    m->count++;
    return 0;
}

void *idmap_del(struct idmap *m, uint64_t key)
{
    struct idmap_slot *s = idmap_find(m, key);
    if (s == NULL)
        return NULL;
    void *value = s->value;
    size_t mask = m->cap - 1;
    size_t hole = (size_t)(s - m->slots);
    /* Backward-shift: move later members of the probe run into the hole when their home slot
     * does not lie cyclically between the hole and their position. */
    for (size_t j = (hole + 1) & mask; m->slots[j].value != NULL; j = (j + 1) & mask) {
        size_t home = mix_id_slot(m->slots[j].key, m->cap);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].value = NULL;
    m->slots[hole].key = 0;
    m->count--;
    return value;
}

void idmap_foreach(const struct idmap *m, void (*fn)(void *value, void *arg), void *arg)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].value != NULL)
            fn(m->slots[i].value, arg);
}
