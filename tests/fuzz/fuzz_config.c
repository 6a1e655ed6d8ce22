/*
 * libFuzzer target: the bytes as a configuration file. config_parse_text() applies them over the
 * defaults (stopping at the first bad line with "source:line: sentence"); whatever it applied,
 * config_print() (what --check-config shows) must give a file that parses without error and
 * prints again byte for byte the same.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "convd/status.h"
#include "fixture.h"

static char *print_config(const struct convd_config *c, size_t *ret_len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, ret_len);
    FX_CHECK(f != NULL);
    config_print(c, f);
    FX_CHECK(fclose(f) == 0);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct convd_config c;
    char why[512];
    config_defaults(&c);
    int rc = config_parse_text(&c, (const char *)data, size, "fuzz.conf", why, sizeof(why));
    if (rc != 0) {
        FX_CHECK(rc == CONVD_EINVAL);
        fx_check_sentence(rc, why, sizeof(why));
        FX_CHECK(strncmp(why, "fuzz.conf:", 10) == 0);
    }

    size_t n1, n2;
    char *first = print_config(&c, &n1);
    struct convd_config again;
    config_defaults(&again);
    rc = config_parse_text(&again, first, n1, "printed", why, sizeof(why));
    if (rc != 0) {
        fprintf(stderr, "config_print wrote what config_parse_text refuses: %s\n%s", why, first);
        abort();
    }
    char *second = print_config(&again, &n2);
    if (n1 != n2 || memcmp(first, second, n1) != 0) {
        fprintf(stderr, "printed configuration changed when read back:\n%s---\n%s", first, second);
        abort();
    }
    free(second);
    free(first);
    return 0;
}
