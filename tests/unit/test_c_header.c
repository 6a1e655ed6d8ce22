/*
 * The public headers from strict C99, with the warnings the project itself turns off
 * (-Wmissing-field-initializers) and -pedantic: what a user's build may use. The *_INIT macros
 * must compile there too. Compiling is the test; running checks the macros' values.
 */
#include <convd/convd.h>

#include <stdio.h>

int main(void)
{
    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    if (a.struct_size != sizeof(a) || a.priority != 0 || a.problem.n != 0 ||
        o.struct_size != sizeof(o) || o.device != -1 || o.use_rings != -1 || o.spin_us != -1) {
        fprintf(stderr, "an INIT macro gives an unexpected value\n");
        return 1;
    }
    printf("ok: the headers compile as C99 with -Wextra -pedantic\n");
    return 0;
}
