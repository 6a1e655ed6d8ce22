/*
 * libFuzzer target: the bytes as a ConvRequest, validated by req_validate() against the fixture's
 * regions (fixture.h) and three requests in flight (ids 5, 6, 7), as conn_on_conv does. A
 * rejection must carry a code and a sentence, and be the same whatever the in-flight limit unless
 * the limit is its reason; a request that passes must satisfy everything validation promises
 * (fx_check_valid), and its region references must come and go exactly.
 */
#include <stdlib.h>
#include <string.h>

#include "convd.pb-c.h"
#include "convd/status.h"
#include "fixture.h"
#include "idmap.h"
#include "request.h"
#include "wire.h"

static struct idmap inflight;
static int tokens[3];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct region_table *regions = fx_regions_table();
    if (inflight.count == 0)
        for (int i = 0; i < 3; i++)
            FX_CHECK(idmap_put(&inflight, 5 + (uint64_t)i, &tokens[i]) == 0);

    Convd__ConvRequest *pb = convd__conv_request__unpack(NULL, size, data);
    if (pb == NULL)
        return 0;
    struct req_context ctx = {regions, fx_backend(), &inflight, 64, CONVD_PROTOCOL_VERSION};
    struct dreq *r = malloc(sizeof(*r));
    FX_CHECK(r != NULL);
    /* What the daemon's calloc would hide: fields validation forgot to set. */
    memset(r, 0xa5, sizeof(*r));
    char *why = malloc(320); /* conn_on_conv's size, exactly, for ASan */
    FX_CHECK(why != NULL);
    int rc = req_validate(pb, &ctx, r, why, 320);
    if (rc == 0) {
        fx_check_valid(pb, &ctx, r);
        fx_ref_unref(r);
    } else {
        fx_check_sentence(rc, why, 320);
    }
    /* Checks about the request come before the in-flight limit: with no room left, a valid
     * request fails with ELIMIT and an invalid one for its own reason. */
    ctx.max_inflight = (uint32_t)inflight.count;
    int rc_full = req_validate(pb, &ctx, r, why, 320);
    FX_CHECK(rc_full == (rc == 0 ? CONVD_ELIMIT : rc));
    fx_check_sentence(rc_full, why, 320);
    fx_check_refs(NULL);
    free(why);
    free(r);
    convd__conv_request__free_unpacked(pb, NULL);
    return 0;
}
