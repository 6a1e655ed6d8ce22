/*
 * A program built against convd 0.1's header, which laid struct convd_problem out with `bool
 * relu` and no activation: its references are bound to the CONVD_0 versions of the functions
 * that take the struct, as the dynamic linker binds such a program, and the library's
 * client/compat.c must serve it with the old layout. Runs real convolutions on a daemon it
 * starts, relu on and off, and checks them against a reference written here.
 *
 *   test_abi_v0 (CONVD_DAEMON_PATH is compiled in)
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "convd/convd.h"

/* convd 0.1's struct convd_problem and struct convd_conv_args. */
struct problem_v0 {
    int32_t n, h, w, c, k, r, s, groups;
    int32_t stride_h, stride_w;
    int32_t pad_top, pad_bottom, pad_left, pad_right;
    int32_t dil_h, dil_w;
    enum convd_dtype dtype;
    enum convd_layout layout;
    bool has_bias;
    bool relu;
    bool allow_tf32;
};

struct conv_args_v0 {
    size_t struct_size;
    struct problem_v0 problem;
    struct convd_tensor input, weight, bias, output;
    unsigned priority;
    uint64_t timeout_us;
};

/* The old functions, bound by version as a program linked against 0.1 is. */
void v0_problem_init(struct problem_v0 *p, int32_t n, int32_t h, int32_t w, int32_t c, int32_t k,
                     int32_t r, int32_t s, int32_t groups);
int v0_problem_check(const struct problem_v0 *p, char *why, size_t why_len);
int v0_problem_sizes(const struct problem_v0 *p, struct convd_problem_sizes *ret, char *why,
                     size_t why_len);
bool v0_problem_same(const struct problem_v0 *a, const struct problem_v0 *b);
char *v0_problem_str(const struct problem_v0 *p, char *buf, size_t len);
int v0_conv(convd_client *c, const struct problem_v0 *p, const void *input, const void *weight,
            const void *bias, void *output);
int v0_conv_submit(convd_client *c, const struct conv_args_v0 *args, uint64_t *ret_id);
__asm__(".symver v0_problem_init, convd_problem_init@CONVD_0");
__asm__(".symver v0_problem_check, convd_problem_check@CONVD_0");
__asm__(".symver v0_problem_sizes, convd_problem_sizes@CONVD_0");
__asm__(".symver v0_problem_same, convd_problem_same@CONVD_0");
__asm__(".symver v0_problem_str, convd_problem_str@CONVD_0");
__asm__(".symver v0_conv, convd_conv@CONVD_0");
__asm__(".symver v0_conv_submit, convd_conv_submit@CONVD_0");

static char g_dir[64], g_sock[96];
static pid_t g_pid;
static convd_client *g_c;

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/convd-abi-XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    snprintf(g_sock, sizeof(g_sock), "%s/convd.sock", g_dir);
    fflush(NULL);
    g_pid = fork();
    if (g_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(CONVD_DAEMON_PATH, CONVD_DAEMON_PATH, "--socket", g_sock, "--backend", "cpu",
              "--threads", "1", "--log-level", "warning", (char *)NULL);
        _exit(127);
    }
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = g_sock;
    o.client_name = "abi-v0";
    for (int i = 0; i < 500; i++) {
        if (convd_connect(&o, &g_c) == 0)
            return 0;
        usleep(20000);
    }
    return -1;
}

static int teardown(void **state)
{
    (void)state;
    convd_close(g_c);
    kill(g_pid, SIGTERM);
    waitpid(g_pid, NULL, 0);
    unlink(g_sock);
    rmdir(g_dir);
    return 0;
}

static void test_problem_helpers(void **state)
{
    (void)state;
    struct problem_v0 p;
    memset(&p, 0x5a, sizeof(p));
    v0_problem_init(&p, 2, 9, 7, 6, 4, 3, 3, 2);
    assert_int_equal(p.n, 2);
    assert_int_equal(p.groups, 2);
    assert_int_equal(p.dtype, CONVD_DTYPE_FP32);
    assert_false(p.has_bias || p.relu || p.allow_tf32);
    assert_int_equal(v0_problem_check(&p, NULL, 0), 0);
    struct convd_problem_sizes z;
    assert_int_equal(v0_problem_sizes(&p, &z, NULL, 0), 0);
    assert_int_equal(z.out_h, 7);
    assert_int_equal(z.out_w, 5);
    p.relu = true;
    char buf[160];
    assert_non_null(strstr(v0_problem_str(&p, buf, sizeof(buf)), " relu"));
    struct problem_v0 q = p;
    assert_true(v0_problem_same(&p, &q));
    q.relu = false;
    assert_false(v0_problem_same(&p, &q));
    char why[200];
    q.groups = 4; /* 6 channels in 4 groups */
    assert_int_equal(v0_problem_check(&q, why, sizeof(why)), CONVD_EGROUPS);
    assert_non_null(strstr(why, "groups"));
}

/* The problem in fp32 NCHW, directly. */
static void reference(const struct problem_v0 *p, const float *x, const float *w, const float *b,
                      float *y, int ho, int wo)
{
    const int cpg = p->c / p->groups, kpg = p->k / p->groups;
    for (int n = 0; n < p->n; n++)
        for (int k = 0; k < p->k; k++)
            for (int oh = 0; oh < ho; oh++)
                for (int ow = 0; ow < wo; ow++) {
                    double acc = p->has_bias ? b[k] : 0.0;
                    for (int c = 0; c < cpg; c++)
                        for (int r = 0; r < p->r; r++)
                            for (int s = 0; s < p->s; s++) {
                                int ih = oh - p->pad_top + r, iw = ow - p->pad_left + s;
                                if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w)
                                    continue;
                                int ci = k / kpg * cpg + c;
                                acc += (double)x[((n * p->c + ci) * p->h + ih) * p->w + iw] *
                                       w[((k * cpg + c) * p->r + r) * p->s + s];
                            }
                    if (p->relu && acc < 0.0)
                        acc = 0.0;
                    y[((n * p->k + k) * ho + oh) * wo + ow] = (float)acc;
                }
}

static void check_close(const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(got[i] - want[i] <= 1e-4f && want[i] - got[i] <= 1e-4f))
            fail_msg("element %zu of %zu: got %g, want %g", i, n, (double)got[i], (double)want[i]);
}

/* convd_conv and convd_conv_submit with the old structs, relu off and on: relu reaches the
 * daemon (the outputs are clamped exactly when it is set), nothing else is misread. */
static void test_conv_old_layout(void **state)
{
    (void)state;
    struct problem_v0 p;
    v0_problem_init(&p, 1, 6, 5, 4, 6, 3, 3, 2);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    p.has_bias = true;
    struct convd_problem_sizes z;
    assert_int_equal(v0_problem_sizes(&p, &z, NULL, 0), 0);
    float x[120], w[108], b[6], y[180], want[180];
    assert_true(z.input_elems == 120 && z.weight_elems == 108 && z.output_elems == 180);
    unsigned seed = 12345;
    for (size_t i = 0; i < 120; i++)
        x[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0xff) / 128.0f - 1.0f;
    for (size_t i = 0; i < 108; i++)
        w[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0xff) / 128.0f - 1.0f;
    for (size_t i = 0; i < 6; i++)
        b[i] = (float)i * 0.25f - 0.75f;
    for (int relu = 0; relu < 2; relu++) {
        p.relu = relu;
        memset(y, 0xff, sizeof(y));
        assert_int_equal(v0_conv(g_c, &p, x, w, b, y), 0);
        reference(&p, x, w, b, want, z.out_h, z.out_w);
        check_close(y, want, 180);
        int negative = 0;
        for (size_t i = 0; i < 180; i++)
            negative += y[i] < 0.0f;
        assert_true(relu ? negative == 0 : negative > 0);
    }

    /* The same through a region and the old convd_conv_args. */
    convd_region *r;
    assert_int_equal(convd_region_create(g_c, 4096, &r), 0);
    uint8_t *mem = convd_region_data(r);
    memcpy(mem, x, sizeof(x));
    memcpy(mem + 512, w, sizeof(w));
    memcpy(mem + 1024, b, sizeof(b));
    memset(mem + 1536, 0xff, sizeof(y));
    struct conv_args_v0 a;
    memset(&a, 0, sizeof(a));
    a.struct_size = sizeof(a);
    a.problem = p; /* relu on */
    a.input = (struct convd_tensor){r, 0, sizeof(x)};
    a.weight = (struct convd_tensor){r, 512, sizeof(w)};
    a.bias = (struct convd_tensor){r, 1024, sizeof(b)};
    a.output = (struct convd_tensor){r, 1536, sizeof(y)};
    uint64_t id;
    assert_int_equal(v0_conv_submit(g_c, &a, &id), 0);
    struct convd_completion done;
    assert_int_equal(convd_wait(g_c, id, 10000, &done), 0);
    assert_int_equal(done.status, 0);
    check_close((const float *)(mem + 1536), want, 180);
    a.struct_size = 16;
    assert_int_equal(v0_conv_submit(g_c, &a, &id), CONVD_EINVAL);
    assert_non_null(strstr(convd_errstr(g_c), "struct_size"));
    assert_int_equal(convd_region_free(r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_problem_helpers),
        cmocka_unit_test(test_conv_old_layout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
