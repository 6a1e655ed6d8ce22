/*
 * Regions: sealed memfd shared memory and imported GPU allocations, registered with the daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_priv.h"
#include "wire.h"

static void cl_region_link(convd_client *c, convd_region *r)
{
    r->prev = NULL;
    r->next = c->regions;
    if (c->regions != NULL)
        c->regions->prev = r;
    c->regions = r;
    c->n_regions++;
    c->mapped_bytes += r->size;
}

static void cl_region_unlink(convd_client *c, convd_region *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        c->regions = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    c->n_regions--;
    c->mapped_bytes -= r->size;
}

static void cl_region_destroy(convd_region *r)
{
    if (r->data != NULL)
        munmap(r->data, r->size);
    free(r);
}

void cl_regions_drop_all(convd_client *c)
{
    while (c->regions != NULL) {
        convd_region *r = c->regions;
        cl_region_unlink(c, r);
        cl_region_destroy(r);
    }
    c->staging = NULL;
}

/* The daemon's per-client limits, checked here first for a sentence that says which. */
static int cl_region_limits(convd_client *c, uint64_t size)
{
    if (c->info.max_regions != 0 && c->n_regions >= c->info.max_regions)
        return cl_fail(c, CONVD_ELIMIT,
                       "this client has %zu regions registered, the daemon allows %u", c->n_regions,
                       c->info.max_regions);
    if (c->info.max_mapped_bytes != 0 &&
        (size > c->info.max_mapped_bytes || c->mapped_bytes > c->info.max_mapped_bytes - size))
        return cl_fail(c, CONVD_ELIMIT,
                       "a region of %llu bytes would bring this client to %llu bytes mapped, the "
                       "daemon allows %llu",
                       (unsigned long long)size, (unsigned long long)(c->mapped_bytes + size),
                       (unsigned long long)c->info.max_mapped_bytes);
    return 0;
}

/* Sends RegisterRegion and waits for the answer. On a failure other than the daemon's own
 * refusal the daemon may yet register the region, so it is told to drop it again (its answer to
 * that is ignored as stale). */
static int cl_region_register(convd_client *c, convd_region *r, Convd__RegisterRegion *reg, int fd)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
    m.register_region = reg;
    int timeout = c->timeout_ms > CL_REGION_TIMEOUT_MS ? c->timeout_ms : CL_REGION_TIMEOUT_MS;
    Convd__ServerMessage *reply = NULL;
    int rc = cl_request(c, &m, fd, CL_EXPECT_REGION, r->id, cl_deadline(timeout), &reply);
    if (rc != 0) {
        if (rc != CONVD_ECLOSED && !c->closed) {
            char keep[CL_ERRSTR_BYTES];
            memcpy(keep, c->errstr, sizeof(keep));
            Convd__UnregisterRegion un = CONVD__UNREGISTER_REGION__INIT;
            un.region_id = r->id;
            Convd__ClientMessage mu = CONVD__CLIENT_MESSAGE__INIT;
            mu.msg_case = CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION;
            mu.unregister_region = &un;
            cl_send(c, &mu, -1, cl_deadline(c->timeout_ms));
            memcpy(c->errstr, keep, sizeof(keep));
        }
        return rc;
    }
    const Convd__RegionReply *rr = reply->region_reply;
    if (rr->status != 0) {
        rc = rr->status < 0 ? rr->status : CONVD_EPROTO;
        cl_fail(c, rc, "the daemon refused the region: %s",
                rr->error[0] != '\0' ? rr->error : convd_strerror(rc));
    }
    convd__server_message__free_unpacked(reply, NULL);
    return rc;
}

static int cl_errno_code(int err)
{
    return err == ENOMEM || err == EMFILE || err == ENFILE || err == ENOSPC ? CONVD_ENOMEM
                                                                            : CONVD_EIO;
}

int convd_region_create(convd_client *c, size_t size, convd_region **ret_region)
{
    int fd = -1, rc;
    convd_region *r = NULL;
    if (c == NULL)
        return CONVD_EINVAL;
    if (ret_region == NULL)
        return cl_fail(c, CONVD_EINVAL, "ret_region must not be NULL");
    if (size == 0 || (uint64_t)size > (uint64_t)INT64_MAX)
        return cl_fail(c, CONVD_EINVAL, "region size %zu is out of range", size);
    if (c->closed)
        return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection");
    if ((rc = cl_region_limits(c, size)) != 0)
        return rc;

    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return cl_fail(c, CONVD_ENOMEM, "out of memory for a region");
    r->client = c;
    r->size = size;

    fd = memfd_create("convd-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        rc = cl_fail(c, cl_errno_code(errno), "memfd_create failed: %s", strerror(errno));
        goto fail;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        rc = cl_fail(c, cl_errno_code(errno), "cannot size a memfd to %zu bytes: %s", size,
                     strerror(errno));
        goto fail;
    }
    /* The daemon maps this file; sealed, neither side can shrink it under the other's mapping. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = cl_fail(c, CONVD_EIO, "cannot seal the memfd: %s", strerror(errno));
        goto fail;
    }
    r->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->data == MAP_FAILED) {
        r->data = NULL;
        rc = cl_fail(c, cl_errno_code(errno), "cannot map %zu bytes: %s", size, strerror(errno));
        goto fail;
    }

    r->id = c->next_region_id++;
    Convd__RegisterRegion reg = CONVD__REGISTER_REGION__INIT;
    reg.region_id = r->id;
    reg.kind = CONVD__REGION_KIND__REGION_MEMFD;
    reg.size = size;
    rc = cl_region_register(c, r, &reg, fd);
    if (rc != 0)
        goto fail;
    close(fd);
    cl_region_link(c, r);
    *ret_region = r;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    cl_region_destroy(r);
    return rc;
}

int convd_region_import_gpu(convd_client *c, const void *ipc_handle, size_t handle_len,
                            uint64_t offset, uint64_t size, convd_region **ret_region)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (ipc_handle == NULL || ret_region == NULL)
        return cl_fail(c, CONVD_EINVAL, "ipc_handle and ret_region must not be NULL");
    if (handle_len != CONVD_IPC_HANDLE_BYTES)
        return cl_fail(c, CONVD_EINVAL, "handle_len is %zu, an IPC handle is %u bytes", handle_len,
                       CONVD_IPC_HANDLE_BYTES);
    uint64_t end;
    if (size == 0 || size > SIZE_MAX || __builtin_add_overflow(offset, size, &end))
        return cl_fail(c, CONVD_EINVAL, "region of %llu bytes at offset %llu is out of range",
                       (unsigned long long)size, (unsigned long long)offset);
    if (c->closed)
        return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection");
    if (strcmp(c->info.backend, "gpu") != 0)
        return cl_fail(c, CONVD_EUNSUPPORTED,
                       "the daemon runs the %s backend, which cannot import GPU memory",
                       c->info.backend);
    int rc = cl_region_limits(c, size);
    if (rc != 0)
        return rc;

    convd_region *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return cl_fail(c, CONVD_ENOMEM, "out of memory for a region");
    r->client = c;
    r->size = (size_t)size;
    r->gpu = true;
    r->id = c->next_region_id++;
    Convd__RegisterRegion reg = CONVD__REGISTER_REGION__INIT;
    reg.region_id = r->id;
    reg.kind = CONVD__REGION_KIND__REGION_GPU_IPC;
    reg.size = size;
    reg.ipc_handle.len = handle_len;
    reg.ipc_handle.data = (uint8_t *)ipc_handle;
    reg.ipc_offset = offset;
    rc = cl_region_register(c, r, &reg, -1);
    if (rc != 0) {
        cl_region_destroy(r);
        return rc;
    }
    cl_region_link(c, r);
    *ret_region = r;
    return 0;
}

void *convd_region_data(const convd_region *r)
{
    return r != NULL ? r->data : NULL;
}

size_t convd_region_size(const convd_region *r)
{
    return r != NULL ? r->size : 0;
}

int convd_region_free(convd_region *r)
{
    if (r == NULL)
        return 0;
    convd_client *c = r->client;
    int rc = 0;
    /* Unmapped below: no done word of it may be written after that, so write them now. */
    if (!r->gpu)
        cl_gates_release(c, r);
    cl_region_unlink(c, r);
    if (c->staging == r)
        c->staging = NULL;
    if (c->closed) {
        rc = cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection");
        goto finish;
    }
    Convd__UnregisterRegion un = CONVD__UNREGISTER_REGION__INIT;
    un.region_id = r->id;
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION;
    m.unregister_region = &un;
    int timeout = c->timeout_ms > CL_REGION_TIMEOUT_MS ? c->timeout_ms : CL_REGION_TIMEOUT_MS;
    Convd__ServerMessage *reply = NULL;
    rc = cl_request(c, &m, -1, CL_EXPECT_REGION, r->id, cl_deadline(timeout), &reply);
    if (rc != 0)
        goto finish;
    const Convd__RegionReply *rr = reply->region_reply;
    if (rr->status != 0) {
        rc = rr->status < 0 ? rr->status : CONVD_EPROTO;
        cl_fail(c, rc, "the daemon could not unregister region %llu: %s", (unsigned long long)r->id,
                rr->error[0] != '\0' ? rr->error : convd_strerror(rc));
    }
    convd__server_message__free_unpacked(reply, NULL);
finish:
    /* Our mapping goes whatever the daemon said: the caller is done with the region. */
    cl_region_destroy(r);
    return rc;
}
