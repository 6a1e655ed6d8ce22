/*
 * What each user (peer uid) holds across all its connections, so that limits bind a user and
 * not only a connection: one uid with many connections must neither fill the whole queue nor
 * take every connection slot and lock other users out (dbus-broker charges its quotas the same
 * way). Pure bookkeeping, loop thread only.
 */
#ifndef CONVD_DAEMON_USERS_H
#define CONVD_DAEMON_USERS_H

#include <stdint.h>
#include <sys/types.h>

#include "list.h"
#include "regions.h"

struct user {
    struct list_node link;
    uid_t uid;
    uint32_t refs;                 /* connections pointing here (counted or not yet freed) */
    uint32_t conns;                /* connections counted against max_clients_per_user */
    uint32_t inflight;             /* requests queued or running, all connections together */
    struct region_account regions; /* regions of all its connections, until released */
};

struct users {
    struct list_node all;
    uint32_t count;
};

void users_init(struct users *u);

/* The account of uid, made on first use (NULL when out of memory), with one reference taken. */
struct user *users_get(struct users *u, uid_t uid);

/* Drops a reference; the account goes with the last one. Accepts NULL. */
void users_put(struct users *u, struct user *usr);

/* Frees every account (at shutdown). */
void users_destroy(struct users *u);

#endif
