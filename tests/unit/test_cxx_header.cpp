/*
 * The public headers from C++: convd.h (with conv.h and status.h) compiles with -Wall -Wextra
 * -Werror -pedantic, every *_INIT macro gives the values the C side documents, and the library
 * links and answers through its extern "C" declarations. No cmocka: a C++ program of a user's
 * kind, which exits non-zero and says why on the first wrong value.
 */
#include <convd/convd.h>

#include <cstdio>
#include <cstring>

static int failures = 0;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::fprintf(stderr, "%s:%d: %s is false\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

int main()
{
    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    CHECK(a.struct_size == sizeof(struct convd_conv_args));
    CHECK(a.problem.n == 0 && a.problem.dtype == 0 && !a.problem.has_bias);
    CHECK(a.input.region == NULL && a.output.bytes == 0);
    CHECK(a.priority == 0 && a.timeout_us == 0);

    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    CHECK(o.struct_size == sizeof(struct convd_connect_options));
    CHECK(o.socket_path == NULL && o.client_name == NULL && o.timeout_ms == 0);
    CHECK(o.use_rings == -1 && o.spin_us == -1 && o.device == -1);

    /* The same objects as a C program makes: C++ const arrays of them, value-initialised. */
    const struct convd_conv_args many[2] = {CONVD_CONV_ARGS_INIT, CONVD_CONV_ARGS_INIT};
    CHECK(many[1].struct_size == sizeof(struct convd_conv_args));

    /* The library, through the header's declarations. */
    CHECK(convd_version() == CONVD_VERSION_NUMBER);
    CHECK(std::strcmp(convd_version_string(), CONVD_VERSION_STRING) == 0);
    CHECK(std::strcmp(convd_status_name(CONVD_EVERSION), "EVERSION") == 0);
    struct convd_problem p;
    convd_problem_init(&p, 1, 8, 8, 4, 4, 3, 3, 2);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    struct convd_problem_sizes z;
    char why[128];
    CHECK(convd_problem_sizes(&p, &z, why, sizeof(why)) == 0);
    CHECK(z.out_h == 8 && z.output_elems == 4 * 8 * 8);
    char path[128];
    CHECK(convd_socket_path(-2, path, sizeof(path)) == CONVD_EINVAL);

    if (failures != 0)
        return 1;
    std::printf("ok: the headers compile as C++ and the library answers (convd %s)\n",
                convd_version_string());
    return 0;
}
