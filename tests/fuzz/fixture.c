#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "convd/status.h"
#include "fixture.h"
#include "wire.h"

static struct convd_backend fx_be;
static struct region_limits fx_limits;
static struct region_table fx_table;
static bool fx_ready;

void fx_fail(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
    abort();
}

static int fx_memfd(uint64_t size, bool write_sealed)
{
    int fd = memfd_create("convd-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FX_CHECK(fd >= 0);
    FX_CHECK(ftruncate(fd, (off_t)size) == 0);
    unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | (write_sealed ? F_SEAL_WRITE : 0);
    FX_CHECK(fcntl(fd, F_ADD_SEALS, (int)seals) == 0);
    return fd;
}

static void fx_init(void)
{
    struct convd_backend_config cfg = {.threads = 1, .device = -1, .max_batch = 8};
    char why[256];
    fx_be.ops = &convd_null_backend_ops;
    if (fx_be.ops->init(&cfg, &fx_be.ctx, &fx_be.info, why, sizeof(why)) != 0) {
        fprintf(stderr, "null backend: %s\n", why);
        abort();
    }
    fx_limits.max_regions = 64;
    fx_limits.max_mapped_bytes = (uint64_t)1 << 40;
    region_table_init(&fx_table, &fx_be, &fx_limits, NULL);
    /* Each file is as large as its largest region; the aliases map its start again. */
    uint64_t file_size[FX_N_FILES] = {0};
    bool file_sealed[FX_N_FILES] = {false};
    for (size_t i = 0; i < FX_N_REGIONS; i++) {
        const struct fx_region_spec *s = &fx_regions[i];
        FX_CHECK(s->file < FX_N_FILES);
        if (s->size > file_size[s->file])
            file_size[s->file] = s->size;
        file_sealed[s->file] |= s->write_sealed;
    }
    int fds[FX_N_FILES];
    for (unsigned f = 0; f < FX_N_FILES; f++)
        fds[f] = fx_memfd(file_size[f], file_sealed[f]);
    for (size_t i = 0; i < FX_N_REGIONS; i++) {
        const struct fx_region_spec *s = &fx_regions[i];
        if (region_register_memfd(&fx_table, s->id, s->size, &fds[s->file], 1, why, sizeof(why)) !=
            0) {
            fprintf(stderr, "fixture region %llu: %s\n", (unsigned long long)s->id, why);
            abort();
        }
        FX_CHECK(region_find(&fx_table, s->id)->readonly == s->write_sealed);
    }
    for (unsigned f = 0; f < FX_N_FILES; f++)
        close(fds[f]);
    fx_ready = true;
}

struct convd_backend *fx_backend(void)
{
    if (!fx_ready)
        fx_init();
    return &fx_be;
}

struct region_table *fx_regions_table(void)
{
    if (!fx_ready)
        fx_init();
    return &fx_table;
}

size_t fx_region_index(const struct region *reg)
{
    for (size_t i = 0; i < FX_N_REGIONS; i++)
        if (reg != NULL && reg->id == fx_regions[i].id && region_find(&fx_table, reg->id) == reg)
            return i;
    return FX_N_REGIONS;
}

int fx_region_refs(size_t i)
{
    return region_find(fx_regions_table(), fx_regions[i].id)->refs;
}

void fx_check_sentence(int rc, const char *why, size_t why_len)
{
    FX_CHECK(rc < 0 && strcmp(convd_status_name(rc), "UNKNOWN") != 0);
    FX_CHECK(why[0] != '\0');
    FX_CHECK(memchr(why, '\0', why_len) != NULL);
}

void fx_check_valid(const Convd__ConvRequest *pb, const struct req_context *ctx,
                    const struct dreq *r)
{
    struct convd_problem p;
    struct convd_problem_sizes sz;
    char why[256];
    FX_CHECK(pb->priority <= CONVD_MAX_PRIORITY);
    FX_CHECK(wire_problem_from_pb(pb->problem, &p, why, sizeof(why)) == 0);
    FX_CHECK(convd_problem_sizes(&p, &sz, why, sizeof(why)) == 0);
    FX_CHECK(!p.allow_tf32 || p.dtype == CONVD_DTYPE_FP32); /* TF32: an fp32 permission only */
    FX_CHECK(convd_problem_same(&r->job.problem, &p));
    FX_CHECK(r->id == pb->id);
    FX_CHECK(r->timeout_us == pb->timeout_us);
    FX_CHECK(r->sched.priority == pb->priority);
    FX_CHECK(r->sched.problem == &r->job.problem);
    FX_CHECK(r->job.owner == r);
    FX_CHECK(idmap_get(ctx->inflight, pb->id) == NULL);
    FX_CHECK(ctx->inflight->count < ctx->max_inflight);

    const Convd__TensorRef *refs[REQ_TENSORS] = {pb->input, pb->weight, pb->bias, pb->output};
    const struct convd_tensor_view *views[REQ_TENSORS] = {&r->job.input, &r->job.weight,
                                                          &r->job.bias, &r->job.output};
    const uint64_t need[REQ_TENSORS] = {sz.input_bytes, sz.weight_bytes, sz.bias_bytes,
                                        sz.output_bytes};
    const size_t esz = convd_dtype_size(p.dtype);
    FX_CHECK(esz == 2 || esz == 4);
    size_t idx[REQ_TENSORS];
    for (int i = 0; i < REQ_TENSORS; i++) {
        const struct convd_tensor_view *v = views[i];
        idx[i] = FX_N_REGIONS;
        if (i == REQ_BIAS && !p.has_bias) {
            FX_CHECK(refs[i] == NULL);
            FX_CHECK(r->regions[i] == NULL);
            FX_CHECK(v->mem == NULL && v->offset == 0 && v->bytes == 0);
            continue;
        }
        FX_CHECK(refs[i] != NULL);
        const struct region *reg = r->regions[i];
        FX_CHECK(reg != NULL);
        FX_CHECK(region_find(ctx->regions, refs[i]->region_id) == reg);
        idx[i] = fx_region_index(reg);
        FX_CHECK(idx[i] < FX_N_REGIONS);
        const struct fx_region_spec *s = &fx_regions[idx[i]];
        FX_CHECK(v->mem == &reg->mem);
        FX_CHECK(reg->mem.kind == CONVD_MEM_HOST && reg->mem.size == s->size);
        FX_CHECK(v->offset == refs[i]->offset && v->bytes == refs[i]->bytes);
        FX_CHECK(v->bytes == need[i] && v->bytes > 0);
        FX_CHECK(v->bytes <= s->size && v->offset <= s->size - v->bytes);
        FX_CHECK(reg->map != NULL && v->offset + v->bytes <= reg->map_len);
        FX_CHECK(v->offset % esz == 0);
        if (i == REQ_OUTPUT)
            FX_CHECK(!s->write_sealed && !reg->readonly);
    }
    /* Every region starts at offset 0 of its file, so file offsets are view offsets. */
    const struct fx_region_spec *out = &fx_regions[idx[REQ_OUTPUT]];
    uint64_t out_lo = views[REQ_OUTPUT]->offset, out_hi = out_lo + views[REQ_OUTPUT]->bytes;
    for (int i = 0; i < REQ_OUTPUT; i++) {
        if (idx[i] == FX_N_REGIONS || fx_regions[idx[i]].file != out->file)
            continue;
        uint64_t lo = views[i]->offset, hi = lo + views[i]->bytes;
        FX_CHECK(hi <= out_lo || out_hi <= lo);
    }
    /* The gate: protocol 3, a writable host region, two distinct aligned words outside every
     * tensor, and the pointers the daemon will read and write inside its mapping. */
    if (pb->gate == NULL) {
        FX_CHECK(r->gate_region == NULL);
        return;
    }
    const Convd__Gate *g = pb->gate;
    FX_CHECK(ctx->proto_version >= CONVD_PROTOCOL_GATES);
    const struct region *gr = r->gate_region;
    FX_CHECK(gr != NULL && region_find(ctx->regions, g->region_id) == gr);
    size_t gi = fx_region_index(gr);
    FX_CHECK(gi < FX_N_REGIONS);
    FX_CHECK(gr->mem.kind == CONVD_MEM_HOST && !gr->readonly && !fx_regions[gi].write_sealed);
    const uint64_t words[2] = {g->ready_offset, g->done_offset};
    FX_CHECK(words[0] != words[1]);
    for (int k = 0; k < 2; k++) {
        FX_CHECK(words[k] % 4 == 0 && gr->mem.size >= 4 && words[k] <= gr->mem.size - 4);
        for (int i = 0; i < REQ_TENSORS; i++) {
            if (idx[i] == FX_N_REGIONS || fx_regions[idx[i]].file != fx_regions[gi].file)
                continue;
            uint64_t lo = views[i]->offset, hi = lo + views[i]->bytes;
            FX_CHECK(hi <= words[k] || words[k] + 4 <= lo);
        }
    }
    FX_CHECK((const uint8_t *)r->gate_ready == (const uint8_t *)gr->mem.host + g->ready_offset);
    FX_CHECK((const uint8_t *)r->gate_done == (const uint8_t *)gr->mem.host + g->done_offset);
    FX_CHECK(r->ready_value == g->ready_value && r->done_value == g->done_value);
}

void fx_check_refs(const int *held)
{
    for (size_t i = 0; i < FX_N_REGIONS; i++)
        FX_CHECK(fx_region_refs(i) == (held != NULL ? held[i] : 0));
}

void fx_count_uses(const struct dreq *r, int *uses, int sign)
{
    for (int i = 0; i < REQ_TENSORS; i++)
        if (r->regions[i] != NULL) {
            size_t k = fx_region_index(r->regions[i]);
            FX_CHECK(k < FX_N_REGIONS);
            uses[k] += sign;
        }
    if (r->gate_region != NULL) {
        size_t k = fx_region_index(r->gate_region);
        FX_CHECK(k < FX_N_REGIONS);
        uses[k] += sign;
    }
}

void fx_ref_unref(struct dreq *r)
{
    int uses[FX_N_REGIONS] = {0};
    fx_count_uses(r, uses, 1);
    req_ref_regions(r);
    fx_check_refs(uses);
    req_unref_regions(r);
    fx_check_refs(NULL);
    for (int i = 0; i < REQ_TENSORS; i++)
        FX_CHECK(r->regions[i] == NULL);
    FX_CHECK(r->gate_region == NULL);
}
