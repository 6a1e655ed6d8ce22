/*
 * The smallest complete convd client: one 3x3 grouped convolution through shared memory.
 *
 *   cc minimal.c $(pkg-config --cflags --libs convd) -o minimal && ./minimal
 */
#include <stdio.h>
#include <string.h>

#include <convd/convd.h>

int main(void)
{
    /* n=1, 8x8 image, 4 -> 4 channels, 3x3 filter, 2 groups, padding 1: output 8x8. */
    struct convd_problem p;
    convd_problem_init(&p, 1, 8, 8, 4, 4, 3, 3, 2);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    struct convd_problem_sizes z;
    char why[256];
    if (convd_problem_sizes(&p, &z, why, sizeof(why)) != 0) {
        fprintf(stderr, "bad problem: %s\n", why);
        return 1;
    }

    convd_client *c;
    int rc = convd_connect(NULL, &c); /* $CONVD_SOCKET or /run/convd/convd.sock */
    if (rc != 0) {
        fprintf(stderr, "connect: %s\n", convd_last_connect_error());
        return 1;
    }

    /* One region holds all three tensors: input, weight, output. */
    convd_region *r;
    rc = convd_region_create(c, z.input_bytes + z.weight_bytes + z.output_bytes, &r);
    if (rc != 0) {
        fprintf(stderr, "region: %s\n", convd_errstr(c));
        convd_close(c);
        return 1;
    }
    float *x = convd_region_data(r);
    float *w = x + z.input_elems;
    float *y = w + z.weight_elems;
    for (uint64_t i = 0; i < z.input_elems; i++)
        x[i] = 1.0f;
    for (uint64_t i = 0; i < z.weight_elems; i++)
        w[i] = 0.5f;

    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    a.problem = p;
    a.input = (struct convd_tensor){r, 0, z.input_bytes};
    a.weight = (struct convd_tensor){r, z.input_bytes, z.weight_bytes};
    a.output = (struct convd_tensor){r, z.input_bytes + z.weight_bytes, z.output_bytes};
    uint64_t id;
    struct convd_completion done;
    rc = convd_conv_submit(c, &a, &id);
    if (rc == 0)
        rc = convd_wait(c, id, -1, &done);
    if (rc != 0 || done.status != 0) {
        fprintf(stderr, "conv: %s\n", rc != 0 ? convd_errstr(c) : done.error);
        convd_region_free(r);
        convd_close(c);
        return 1;
    }
    /* Interior pixels see 3x3 taps of 2 channels: 18 * 0.5 = 9; corners see 2x2: 4. */
    printf("y[0][0][0][0] = %g, y[0][0][4][4] = %g (daemon: queue %llu us, exec %llu us)\n", y[0],
           y[4 * 8 + 4], (unsigned long long)done.queue_us, (unsigned long long)done.exec_us);

    convd_region_free(r);
    convd_close(c);
    return 0;
}
