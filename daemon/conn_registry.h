/*
 * The daemon's connections as one piece of state, owned by connection.c: only its conn_*
 * functions add, remove, count and walk them. The daemon holds one (struct convd_daemon.conns)
 * and asks connection.c for what it needs (conn_shutdown_all, conn_poll_rings, ...).
 */
#ifndef CONVD_DAEMON_CONN_REGISTRY_H
#define CONVD_DAEMON_CONN_REGISTRY_H

#include <stdint.h>

#include "list.h"

#define CONN_MAX_LANES 64 /* the most lanes the daemon uses, whatever the backend offers */

struct conn_registry {
    struct list_node all;    /* every struct conn not yet freed */
    struct list_node rings;  /* READY connections with rings, polled by the loop */
    struct list_node notify; /* connections owed a doorbell check */
    struct list_node gates;  /* connections with requests waiting on their gates */
    struct list_node held;   /* connections whose registration waits for the lanes */
    uint32_t nheld;
    uint32_t gated;          /* those requests, over all connections */
    uint32_t gated_conns;    /* the connections on `gates` */
    uint32_t waiting;        /* requests in lanes, over all connections */
    struct conn *lane_owner[CONN_MAX_LANES]; /* the connection holding each lane, or NULL */
    uint32_t clients;        /* connections counted against max_clients */
    uint32_t refused;        /* refused connections waiting to be told why */
    uint64_t next_serial;
};

#endif
