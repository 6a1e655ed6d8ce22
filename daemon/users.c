#include <stdlib.h>

#include "users.h"

void users_init(struct users *u)
{
    list_init(&u->all);
    u->count = 0;
}

struct user *users_get(struct users *u, uid_t uid)
{
    struct list_node *pos;
    list_for_each(pos, &u->all)
    {
        struct user *usr = list_entry(pos, struct user, link);
        if (usr->uid == uid) {
            usr->refs++;
            return usr;
        }
    }
    struct user *usr = calloc(1, sizeof(*usr));
    if (usr == NULL)
        return NULL;
    usr->uid = uid;
    usr->refs = 1;
    list_add_tail(&u->all, &usr->link);
    u->count++;
    return usr;
}

void users_put(struct users *u, struct user *usr)
{
    if (usr == NULL || --usr->refs > 0)
        return;
    list_del(&usr->link);
    u->count--;
    free(usr);
}

void users_destroy(struct users *u)
{
    while (!list_empty(&u->all)) {
        struct user *usr = list_entry(u->all.next, struct user, link);
        list_del(&usr->link);
        free(usr);
    }
    u->count = 0;
}
