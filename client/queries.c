/*
 * Queries answered by the daemon's loop thread: ping, status, metrics. Each carries a fresh tag so
 * that a late answer to a call that timed out is recognised and dropped.
 */
#include <stdlib.h>
#include <string.h>

#include "client_priv.h"
#include "clock.h"

int convd_ping(convd_client *c, uint64_t *ret_rtt_ns)
{
    if (c == NULL)
        return CONVD_EINVAL;
    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = c->next_tag++;
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    uint64_t t0 = convd_now_ns();
    Convd__ServerMessage *reply = NULL;
    int rc = cl_request(c, &m, -1, CL_EXPECT_PONG, ping.tag, cl_deadline(c->timeout_ms), &reply);
    if (rc != 0)
        return rc;
    uint64_t rtt = convd_now_ns() - t0;
    convd__server_message__free_unpacked(reply, NULL);
    if (ret_rtt_ns != NULL)
        *ret_rtt_ns = rtt;
    return 0;
}

int convd_status_get(convd_client *c, struct convd_status *ret_status)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (ret_status == NULL)
        return cl_fail(c, CONVD_EINVAL, "ret_status must not be NULL");
    Convd__StatusRequest req = CONVD__STATUS_REQUEST__INIT;
    req.tag = c->next_tag++;
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_STATUS;
    m.status = &req;
    Convd__ServerMessage *reply = NULL;
    int rc = cl_request(c, &m, -1, CL_EXPECT_STATUS, req.tag, cl_deadline(c->timeout_ms), &reply);
    if (rc != 0)
        return rc;
    const Convd__StatusReply *r = reply->status_reply;
    struct convd_status st;
    memset(&st, 0, sizeof(st));
    cl_strlcpy(st.server_version, sizeof(st.server_version), r->server_version);
    cl_strlcpy(st.backend, sizeof(st.backend), r->backend);
    cl_strlcpy(st.device, sizeof(st.device), r->device);
    st.protocol_version = r->protocol_version;
    st.clients = r->clients;
    st.queue_depth = r->queue_depth;
    st.inflight = r->inflight;
    st.requests_served = r->requests_served;
    st.requests_failed = r->requests_failed;
    st.batches = r->batches;
    st.uptime_ms = r->uptime_ms;
    convd__server_message__free_unpacked(reply, NULL);
    *ret_status = st;
    return 0;
}

int convd_metrics_get(convd_client *c, char **ret_text)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (ret_text == NULL)
        return cl_fail(c, CONVD_EINVAL, "ret_text must not be NULL");
    Convd__MetricsRequest req = CONVD__METRICS_REQUEST__INIT;
    req.tag = c->next_tag++;
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_METRICS;
    m.metrics = &req;
    Convd__ServerMessage *reply = NULL;
    int rc = cl_request(c, &m, -1, CL_EXPECT_METRICS, req.tag, cl_deadline(c->timeout_ms), &reply);
    if (rc != 0)
        return rc;
    char *text = strdup(reply->metrics_reply->text != NULL ? reply->metrics_reply->text : "");
    convd__server_message__free_unpacked(reply, NULL);
    if (text == NULL)
        return cl_fail(c, CONVD_ENOMEM, "out of memory for the metrics text");
    *ret_text = text;
    return 0;
}
