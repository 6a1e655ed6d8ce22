/* Config parsing: the file format (good and bad lines), every value type, the command line and its
 * precedence over the file, --check-config's output read back, and the allow-list rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "convd/convd.h"
#include "convd/status.h"
#include "log.h"

static int parse(struct convd_config *c, const char *text, char *why, size_t len)
{
    return config_parse_text(c, text, strlen(text), "test.conf", why, len);
}

/* What config_print writes for c, NUL-terminated, with its length in *len. */
static char *printed(const struct convd_config *c, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    assert_non_null(f);
    config_print(c, f);
    fclose(f);
    return text;
}

static void test_defaults(void **state)
{
    (void)state;
    struct convd_config c;
    unsetenv("CONVD_SOCKET");
    config_defaults(&c);
    assert_string_equal(c.socket_path, CONVD_DEFAULT_SOCKET);
    assert_int_equal(c.backend, CONFIG_BACKEND_AUTO);
    assert_int_equal(c.socket_mode, 0660);
    assert_int_equal(c.device, -1);
    assert_int_equal(c.launch_inline, 1);
    assert_int_equal(c.launch_spinners, 0);
    assert_true(c.max_batch >= 1);
    assert_true(c.max_inflight >= 1);
    assert_int_equal(c.n_allow_uids, 0);
    assert_false(c.socket_group_set);

    setenv("CONVD_SOCKET", "/tmp/from-env.sock", 1);
    config_defaults(&c);
    assert_string_equal(c.socket_path, "/tmp/from-env.sock");
    unsetenv("CONVD_SOCKET");
}

static void test_good_file(void **state)
{
    (void)state;
    struct convd_config c;
    char why[256] = "";
    config_defaults(&c);
    const char *text = "# convd configuration\n"
                       "\n"
                       "   # indented comment\n"
                       "socket = /tmp/a.sock\n"
                       "backend=cpu\n"
                       "log_level = debug   # trailing comment\n"
                       "threads = 3\r\n"
                       "device = -1\n"
                       "max-clients = 7\n" /* dashes work like underscores */
                       "max_inflight = 9\n"
                       "max_regions = 11\n"
                       "max_mapped_bytes = 2G\n"
                       "max_regions_per_user = 33\n"
                       "max_mapped_bytes_per_user = 5G\n"
                       "max_pinned_bytes = 300M\n"
                       "max_batch = 16\n"
                       "slots = 2\n"
                       "launch_threads = 1\n"
                       "launch_ahead = 2\n"
                       "launch_inline = 0\n"
                       "launch_spinners = 1\n"
                       "completion_flags = 0\n"
                       "batch_timing = 1\n"
                       "stream_priority = 1\n"
                       "device_gates = 0\n"
                       "doorbell_spin_us = 20\n"
                       "null_launch_us = 6\n"
                       "null_launch_item_us = 1\n"
                       "null_exec_us = 4\n"
                       "max_queue_delay_us = 250\n"
                       "queue_limit = 100\n"
                       "drain_timeout_ms = 0\n"
                       "socket_mode = 0600\n"
                       "socket_group = 0\n"
                       "allow_uids = 0, 1000,1001\n"
                       "allow_gids = root\n"
                       "max_protocol_errors = 3\n"
                       "max_send_queue_bytes = 64KiB\n"
                       "hello_timeout_ms = 500\n"
                       "\t\n"
                       "socket = \"/tmp/b # not a comment.sock\"  # a comment\n"
                       "max_batch = 8"; /* last line without newline, and a later value wins */
    assert_int_equal(parse(&c, text, why, sizeof(why)), 0);
    assert_string_equal(c.socket_path, "/tmp/b # not a comment.sock");
    assert_int_equal(c.backend, CONFIG_BACKEND_CPU);
    assert_int_equal(c.log_level, LOG_LVL_DEBUG);
    assert_int_equal(c.threads, 3);
    assert_int_equal(c.max_clients, 7);
    assert_int_equal(c.max_inflight, 9);
    assert_int_equal(c.max_regions, 11);
    assert_true(c.max_mapped_bytes == (uint64_t)2 << 30);
    assert_int_equal(c.max_regions_per_user, 33);
    assert_true(c.max_mapped_bytes_per_user == (uint64_t)5 << 30);
    assert_true(c.max_pinned_bytes == (uint64_t)300 << 20);
    assert_int_equal(c.max_batch, 8);
    assert_int_equal(c.slots, 2);
    assert_int_equal(c.launch_threads, 1);
    assert_int_equal(c.launch_ahead, 2);
    assert_int_equal(c.launch_inline, 0);
    assert_int_equal(c.launch_spinners, 1);
    assert_int_equal(c.completion_flags, 0);
    assert_int_equal(c.batch_timing, 1);
    assert_int_equal(c.stream_priority, 1);
    assert_int_equal(c.device_gates, 0);
    assert_int_equal(c.doorbell_spin_us, 20);
    assert_int_equal(c.null_launch_us, 6);
    assert_int_equal(c.null_launch_item_us, 1);
    assert_int_equal(c.null_exec_us, 4);
    assert_int_equal(c.max_queue_delay_us, 250);
    assert_int_equal(c.queue_limit, 100);
    assert_int_equal(c.drain_timeout_ms, 0);
    assert_int_equal(c.socket_mode, 0600);
    assert_true(c.socket_group_set);
    assert_int_equal(c.socket_group, 0);
    assert_int_equal(c.n_allow_uids, 3);
    assert_int_equal(c.allow_uids[0], 0);
    assert_int_equal(c.allow_uids[1], 1000);
    assert_int_equal(c.allow_uids[2], 1001);
    assert_int_equal(c.n_allow_gids, 1);
    assert_int_equal(c.allow_gids[0], 0);
    assert_int_equal(c.max_protocol_errors, 3);
    assert_int_equal(c.max_send_queue_bytes, 65536);
    assert_int_equal(c.hello_timeout_ms, 500);

    /* empty values clear lists and the group */
    assert_int_equal(parse(&c, "allow_uids =\nsocket_group =\n", why, sizeof(why)), 0);
    assert_int_equal(c.n_allow_uids, 0);
    assert_false(c.socket_group_set);
}

/* Each bad line fails with CONVD_EINVAL, names the source and line, says what is wrong, and
 * leaves the earlier lines applied. */
static void test_bad_lines(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *words[2];
    } cases[] = {
        {"max_batch = 4\nthis is not an assignment\n", {"test.conf:2", "key = value"}},
        {"max_batchh = 4\n",
         {"test.conf:1", "unknown key 'max_batchh'; did you mean 'max_batch'?"}},
        {"max_inflght = 4\n", {"unknown key 'max_inflght'", "did you mean 'max_inflight'?"}},
        {"max-inflight-per-usr = 4\n", {"unknown key", "did you mean 'max_inflight_per_user'?"}},
        {"frobnicate = 4\n", {"unknown key 'frobnicate'", "test.conf:1"}},
        {"metrics_textfile = convd.prom\n", {"metrics_textfile", "not an absolute path"}},
        {"metrics_textfile_interval_ms = 10\n", {"metrics_textfile_interval_ms", "out of range"}},
        {"= 4\n", {"test.conf:1", "missing key"}},
        {"max batch = 4\n", {"test.conf:1", "character"}},
        {"max_batch = four\n", {"max_batch", "'four'"}},
        {"max_batch = -1\n", {"max_batch", "'-1'"}},
        {"max_batch = 0\n", {"max_batch", "out of range"}},
        {"max_batch = 100000\n", {"max_batch", "out of range"}},
        {"max_batch = 4x\n", {"max_batch", "'4x'"}},
        {"max_batch =\n", {"max_batch", "not a non-negative number"}},
        {"threads = 99999999999\n", {"threads", "not a number"}},
        {"device = -2\n", {"device", "out of range"}},
        {"backend = tpu\n", {"backend", "auto, cpu, gpu or null"}},
        {"log_level = loud\n", {"log_level", "'loud'"}},
        {"socket_mode = 0999\n", {"socket_mode", "octal"}},
        {"socket_mode = 01777\n", {"socket_mode", "out of range"}},
        {"max_mapped_bytes = 12Q\n", {"max_mapped_bytes", "byte count"}},
        {"max_mapped_bytes = 99999999999T\n", {"max_mapped_bytes", "byte count"}},
        {"max_send_queue_bytes = 10\n", {"max_send_queue_bytes", "out of range"}},
        {"socket = \"/tmp/x.sock\n", {"test.conf:1", "unterminated quote"}},
        {"socket = \"/tmp/x.sock\" extra\n", {"test.conf:1", "after the closing quote"}},
        {"socket = \n", {"socket", "empty path"}},
        {"socket = /tmp/"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock\n",
         {"socket", "longer than"}},
        {"allow_uids = 0, no-such-user-convd-test\n", {"allow_uids", "no-such-user-convd-test"}},
        {"allow_gids = 4294967295\n", {"allow_gids", "4294967295"}},
        {"socket_group = no-such-group-convd-test\n", {"socket_group", "no-such-group"}},
        {"config = /etc/other.conf\n", {"test.conf:1", "command-line option only"}},
        {"max_batch = 4\n\x01\n", {"test.conf:2", "control character"}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct convd_config c;
        char why[512] = "";
        config_defaults(&c);
        int rc = parse(&c, cases[i].text, why, sizeof(why));
        if (rc != CONVD_EINVAL)
            fail_msg("case %zu (%s): rc %d, want EINVAL", i, cases[i].text, rc);
        for (int k = 0; k < 2; k++)
            if (strstr(why, cases[i].words[k]) == NULL)
                fail_msg("case %zu: \"%s\" does not mention \"%s\"", i, why, cases[i].words[k]);
    }
    /* lines before the bad one stay applied */
    struct convd_config c;
    char why[256];
    config_defaults(&c);
    assert_int_equal(parse(&c, "max_batch = 5\nnope\n", why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(c.max_batch, 5);
    /* a failed config_set leaves the value as it was */
    assert_int_equal(config_set(&c, "max_batch", "0", why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(c.max_batch, 5);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_command_line(void **state)
{
    (void)state;
    char path[] = "/tmp/convd-cfg-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "max_batch = 8\nqueue_limit = 50\nsocket = /tmp/file.sock\n");

    struct convd_config c;
    enum config_action act;
    char why[512] = "";
    {
        /* the command line wins over the file, whatever the order of --config */
        char *argv[] = {"convd",       "--max-batch", "16",
                        "--config",    path,          "--socket=/tmp/cli.sock",
                        "--log-level", "err",         NULL};
        assert_int_equal(config_from_args(8, argv, &c, &act, why, sizeof(why)), 0);
        assert_int_equal(act, CONFIG_RUN);
        assert_int_equal(c.max_batch, 16);
        assert_int_equal(c.queue_limit, 50);
        assert_string_equal(c.socket_path, "/tmp/cli.sock");
        assert_int_equal(c.log_level, LOG_LVL_ERR);
    }
    {
        char *argv[] = {"convd", "--check-config", "--config", path, NULL};
        assert_int_equal(config_from_args(4, argv, &c, &act, why, sizeof(why)), 0);
        assert_int_equal(act, CONFIG_CHECK);
        assert_int_equal(c.max_batch, 8);
    }
    {
        char *argv[] = {"convd", "--version", NULL};
        assert_int_equal(config_from_args(2, argv, &c, &act, why, sizeof(why)), 0);
        assert_int_equal(act, CONFIG_VERSION);
        char *argv3[] = {"convd", "--help", NULL};
        assert_int_equal(config_from_args(2, argv3, &c, &act, why, sizeof(why)), 0);
        assert_int_equal(act, CONFIG_HELP);
    }
    static const struct {
        char *argv[4];
        int argc;
        int rc;
        const char *word;
    } bad[] = {
        {{"convd", "--max-batchh", "3"}, 3, CONVD_EINVAL, "--max-batchh"},
        {{"convd", "--max-inflght", "3"}, 3, CONVD_EINVAL, "did you mean --max-inflight?"},
        {{"convd", "--confg", "/x.conf"}, 3, CONVD_EINVAL, "did you mean --config?"},
        {{"convd", "--frobnicate", "3"}, 3, CONVD_EINVAL, "unknown option --frobnicate (see"},
        {{"convd", "--max-batch"}, 2, CONVD_EINVAL, "needs a value"},
        {{"convd", "--max-batch", "0"}, 3, CONVD_EINVAL, "out of range"},
        {{"convd", "stray"}, 2, CONVD_EINVAL, "unexpected argument 'stray'"},
        {{"convd", "--config", "/nonexistent/convd.conf"}, 3, CONVD_EIO, "/nonexistent"},
        {{"convd", "--backend", "quantum"}, 3, CONVD_EINVAL, "--backend"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        int rc = config_from_args(bad[i].argc, bad[i].argv, &c, &act, why, sizeof(why));
        if (rc != bad[i].rc || strstr(why, bad[i].word) == NULL)
            fail_msg("bad case %zu: rc %d \"%s\", want %d mentioning \"%s\"", i, rc, why, bad[i].rc,
                     bad[i].word);
    }
    /* an error in the file names the file and the line */
    write_file(path, "max_batch = 8\nmax_batch = 0\n");
    char *argv[] = {"convd", "--config", path, NULL};
    assert_int_equal(config_from_args(3, argv, &c, &act, why, sizeof(why)), CONVD_EINVAL);
    char where[128];
    snprintf(where, sizeof(where), "%s:2", path);
    assert_non_null(strstr(why, where));
    unlink(path);
}

/* config_print writes what config_parse_text reads back to the same configuration. */
static void test_print_round_trip(void **state)
{
    (void)state;
    struct convd_config a, b;
    char why[256];
    config_defaults(&a);
    assert_int_equal(parse(&a,
                           "socket = /tmp/rt.sock\nbackend = gpu\nthreads = 5\ndevice = 2\n"
                           "max_mapped_bytes = 3M\nsocket_mode = 0640\nsocket_group = 0\n"
                           "allow_uids = 1,2,3\nallow_gids = 4\nlog_level = notice\n"
                           "max_queue_delay_us = 77\n",
                           why, sizeof(why)),
                     0);
    size_t len = 0;
    char *text = printed(&a, &len);
    config_defaults(&b);
    if (config_parse_text(&b, text, len, "printed", why, sizeof(why)) != 0)
        fail_msg("printed configuration does not parse: %s\n%s", why, text);
    assert_memory_equal(&a, &b, sizeof(a));
    free(text);

    /* A path with a '"' (an unquoted value) must not be printed inside quotes, where it would
     * end the value early (found by tests/fuzz/fuzz_config). */
    config_defaults(&a);
    assert_int_equal(parse(&a, "socket = /tmp/a\"b # c.sock\n", why, sizeof(why)), 0);
    assert_string_equal(a.socket_path, "/tmp/a\"b");
    text = printed(&a, &len);
    config_defaults(&b);
    if (config_parse_text(&b, text, len, "printed", why, sizeof(why)) != 0)
        fail_msg("printed configuration does not parse: %s\n%s", why, text);
    assert_string_equal(b.socket_path, "/tmp/a\"b");
    free(text);

    /* --help names every key with dashes */
    FILE *f = open_memstream(&text, &len);
    config_usage(f, "convd");
    fclose(f);
    const char *flags[] = {
        "--socket",      "--backend",          "--config",      "--log-level",
        "--threads",     "--device",           "--max-clients", "--max-inflight",
        "--max-regions", "--max-mapped-bytes", "--max-batch",   "--max-queue-delay-us",
        "--queue-limit", "--drain-timeout-ms", "--socket-mode", "--socket-group",
        "--allow-uids",  "--allow-gids",       "--help",        "--version"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
        if (strstr(text, flags[i]) == NULL)
            fail_msg("--help does not mention %s", flags[i]);
    free(text);
}

/* A case with no hint must not get one: "unknown option --frobnicate (see --help)". The
 * metrics textfile: an absolute path, or empty for none. */
static void test_textfile_keys(void **state)
{
    (void)state;
    struct convd_config c;
    char why[256];
    config_defaults(&c);
    assert_string_equal(c.metrics_textfile, "");
    assert_int_equal(c.metrics_textfile_interval_ms, 15000);
    assert_int_equal(parse(&c,
                           "metrics_textfile = /var/lib/prometheus/node-exporter/convd.prom\n"
                           "metrics_textfile_interval_ms = 5000\n",
                           why, sizeof(why)),
                     0);
    assert_string_equal(c.metrics_textfile, "/var/lib/prometheus/node-exporter/convd.prom");
    assert_int_equal(c.metrics_textfile_interval_ms, 5000);
    assert_int_equal(parse(&c, "metrics_textfile =\n", why, sizeof(why)), 0);
    assert_string_equal(c.metrics_textfile, "");
    char longpath[CONFIG_FILE_BYTES + 10];
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    assert_int_equal(config_set(&c, "metrics_textfile", longpath, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "too long"));
    assert_string_equal(c.metrics_textfile, "");

    /* {device}: the device option's value once file and command line are applied, so that the
     * per-GPU daemons that share a configuration file write a file each. */
    enum config_action act;
    char *per_gpu[] = {
        "convd",    "--config", "/dev/null", "--metrics-textfile", "/prom/convd-gpu{device}.prom",
        "--device", "3",        NULL};
    assert_int_equal(config_from_args(7, per_gpu, &c, &act, why, sizeof(why)), 0);
    assert_string_equal(c.metrics_textfile, "/prom/convd-gpu3.prom");
    char *single[] = {
        "convd", "--config", "/dev/null", "--metrics-textfile", "/prom/{device}/x{device}.prom",
        NULL};
    assert_int_equal(config_from_args(5, single, &c, &act, why, sizeof(why)), 0);
    assert_string_equal(c.metrics_textfile, "/prom/any/xany.prom");
}

/* config_diff names every option that differs, with both values, and whether SIGHUP can apply
 * it; the split between live and restart keys is the one docs/operations.md documents. */
static void test_diff_and_live_keys(void **state)
{
    (void)state;
    struct convd_config a, b;
    char why[256];
    config_defaults(&a);
    config_defaults(&b);
    struct config_change ch[CONFIG_MAX_OPTIONS];
    assert_int_equal(config_diff(&a, &b, ch, CONFIG_MAX_OPTIONS), 0);

    assert_int_equal(parse(&b,
                           "max_inflight = 12\nlog_level = debug\nallow_uids = 0,7\n"
                           "socket = /tmp/other.sock\nmax_batch = 4\n"
                           "metrics_textfile = /tmp/m.prom\n",
                           why, sizeof(why)),
                     0);
    size_t n = config_diff(&a, &b, ch, CONFIG_MAX_OPTIONS);
    assert_int_equal(n, 6);
    /* the table's order: socket, log_level, max_inflight, max_batch, allow_uids, textfile */
    const struct {
        const char *key, *before, *after;
        bool live;
    } want[] = {
        {"socket", "\"" CONVD_DEFAULT_SOCKET "\"", "\"/tmp/other.sock\"", false},
        {"log_level", "info", "debug", true},
        {"max_inflight", "256", "12", true},
        {"max_batch", "32", "4", false},
        {"allow_uids", "", "0,7", true},
        {"metrics_textfile", "\"\"", "\"/tmp/m.prom\"", true},
    };
    if (getenv("CONVD_SOCKET") != NULL)
        skip(); /* the default socket is then the environment's */
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(ch[i].key, want[i].key);
        assert_string_equal(ch[i].before, want[i].before);
        assert_string_equal(ch[i].after, want[i].after);
        assert_int_equal(ch[i].live, want[i].live);
    }
    /* a smaller buffer still counts them all */
    assert_int_equal(config_diff(&a, &b, ch, 2), 6);
    /* a long value is cut to fit, visibly */
    config_defaults(&b);
    char longpath[300];
    memset(longpath, 'p', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    assert_int_equal(config_set(&b, "metrics_textfile", longpath, why, sizeof(why)), 0);
    assert_int_equal(config_diff(&a, &b, ch, CONFIG_MAX_OPTIONS), 1);
    assert_true(strlen(ch[0].after) < sizeof(ch[0].after));
    assert_non_null(strstr(ch[0].after, "..."));

    /* What SIGHUP applies, and what takes a restart. */
    static const char *const live[] = {"log_level",
                                       "max_clients",
                                       "max_clients_per_user",
                                       "max_inflight_per_user",
                                       "idle_timeout_ms",
                                       "max_inflight",
                                       "max_regions",
                                       "max_mapped_bytes",
                                       "max_queue_delay_us",
                                       "queue_limit",
                                       "drain_timeout_ms",
                                       "allow_uids",
                                       "allow_gids",
                                       "max_protocol_errors",
                                       "max_send_queue_bytes",
                                       "hello_timeout_ms",
                                       "ring_stall_timeout_ms",
                                       "gate_timeout_ms",
                                       "gate_poll_us",
                                       "gate_spin_clients",
                                       "metrics_textfile",
                                       "metrics_textfile_interval_ms"};
    static const char *const restart[] = {"socket",    "socket_mode", "socket_group",
                                          "backend",   "device",      "threads",
                                          "max_batch", "spin_us",     "doorbell_threads"};
    for (size_t i = 0; i < sizeof(live) / sizeof(live[0]); i++)
        if (!config_key_live(live[i]))
            fail_msg("%s should be reloadable", live[i]);
    for (size_t i = 0; i < sizeof(restart) / sizeof(restart[0]); i++)
        if (config_key_live(restart[i]))
            fail_msg("%s should take a restart", restart[i]);
    assert_false(config_key_live("no_such_key"));
    assert_false(config_key_live(NULL));
}

/* The file at CONVD_SOURCE_DIR/rel, whole and NUL-terminated. */
static char *read_source(const char *rel)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", CONVD_SOURCE_DIR, rel);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("cannot read %s", path);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    int ch;
    while ((ch = fgetc(f)) != EOF)
        fputc(ch, m);
    fclose(f);
    fclose(m);
    return buf;
}

/* The text of doc from the end of the first `from` to the next `to`, copied; fails without. */
static char *doc_span(const char *doc, const char *from, const char *to, const char *what)
{
    const char *a = strstr(doc, from);
    const char *b = a != NULL ? strstr(a + strlen(from), to) : NULL;
    if (b == NULL)
        fail_msg("%s: no text between '%s' and '%s'", what, from, to);
    a += strlen(from);
    char *span = strndup(a, (size_t)(b - a));
    assert_non_null(span);
    return span;
}

/* Whether the span names key between two q's ("*key*", "`key`"). */
static bool span_names(const char *span, char q, const char *key)
{
    char tok[80];
    snprintf(tok, sizeof(tok), "%c%s%c", q, key, q);
    return strstr(span, tok) != NULL;
}

/* How many names the span quotes with q. */
static size_t span_count(const char *span, char q)
{
    size_t n = 0;
    for (const char *p = span; *p != '\0'; p++)
        n += *p == q;
    return n / 2;
}

/* What the docs say SIGHUP applies and what takes a restart is what config_key_live says, for
 * every key --check-config prints: the list of restart keys in convd.conf(5), and both lists in
 * docs/operations.md, name each key on its side and nothing else. */
static void test_reload_docs(void **state)
{
    (void)state;
    struct convd_config c;
    config_defaults(&c);
    size_t plen = 0;
    char *keys = printed(&c, &plen);
    char *man = read_source("man/convd.conf.5.scd"), *ops = read_source("docs/operations.md");
    char *man_restart = doc_span(man, "These keys take a restart:", ". If", "convd.conf.5");
    char *ops_live = doc_span(ops, "). Live:", ". They count", "operations.md");
    char *ops_restart =
        doc_span(ops, "takes a restart differs (", ": they shaped", "operations.md");
    size_t n_live = 0, n_restart = 0;
    for (char *line = strtok(keys, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char key[64];
        if (sscanf(line, "%63[a-z_] =", key) != 1)
            continue;
        const bool live = config_key_live(key);
        n_live += live;
        n_restart += !live;
        if (span_names(man_restart, '*', key) == live)
            fail_msg("convd.conf.5 %s %s among the keys that take a restart",
                     live ? "lists" : "omits", key);
        if (span_names(ops_restart, '`', key) == live)
            fail_msg("operations.md %s %s among the keys that take a restart",
                     live ? "lists" : "omits", key);
        if (span_names(ops_live, '`', key) != live)
            fail_msg("operations.md %s %s among the live keys", live ? "omits" : "lists", key);
    }
    assert_true(n_live >= 10 && n_restart >= 10);
    /* and no name that is not a key of its side */
    assert_int_equal(span_count(man_restart, '*'), n_restart);
    assert_int_equal(span_count(ops_restart, '`'), n_restart);
    assert_int_equal(span_count(ops_live, '`'), n_live);
    free(man_restart);
    free(ops_live);
    free(ops_restart);
    free(man);
    free(ops);
    free(keys);
}

static void test_allow_list(void **state)
{
    (void)state;
    struct convd_config c;
    char why[256];
    config_defaults(&c);
    gid_t gids[] = {100, 27, 1000};
    /* empty lists: the socket's permissions are the only gate */
    assert_true(config_peer_allowed(&c, 1234, gids, 3));
    assert_int_equal(parse(&c, "allow_uids = 1000\n", why, sizeof(why)), 0);
    assert_true(config_peer_allowed(&c, 1000, gids, 1));
    assert_false(config_peer_allowed(&c, 1234, gids, 3));
    assert_false(config_peer_allowed(&c, 0, gids, 1)); /* root is not implied */
    /* a supplementary group is enough */
    assert_int_equal(parse(&c, "allow_gids = 27\n", why, sizeof(why)), 0);
    assert_true(config_peer_allowed(&c, 1234, gids, 3));
    assert_false(config_peer_allowed(&c, 1234, gids, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),         cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_bad_lines),        cmocka_unit_test(test_command_line),
        cmocka_unit_test(test_print_round_trip), cmocka_unit_test(test_allow_list),
        cmocka_unit_test(test_textfile_keys),    cmocka_unit_test(test_diff_and_live_keys),
        cmocka_unit_test(test_reload_docs),
    };
    return cmocka_run_group_tests_name("daemon config", tests, NULL, NULL);
}
