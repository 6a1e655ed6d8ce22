/* Regions on real memfds with the real CPU backend: seals, sizes, descriptor counts, ids, limits,
 * read-only regions, GPU handles the CPU refuses, deferred release while requests hold a
 * reference, releases queued while lanes have work, and a failing mmap (injected with
 * -Wl,--wrap=mmap). Every test checks that no mapping and no descriptor is left behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "regions.h"
#include "testutil.h"

/* --- fault injection ---------------------------------------------------------------------- */

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

static int mmap_fail_errno; /* != 0: the next MAP_SHARED mapping fails with it */

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (mmap_fail_errno != 0 && (flags & MAP_SHARED)) {
        errno = mmap_fail_errno;
        mmap_fail_errno = 0;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

/* --- fixtures ----------------------------------------------------------------------------- */

struct fixture {
    struct convd_backend be;
    struct region_limits limits;
    struct region_stats stats;
    struct region_table t;
    int base_fds;
    int base_maps;
};

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static int count_memfd_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strstr(line, "/memfd:convd-unit") != NULL)
            n++;
    fclose(f);
    return n;
}

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    struct convd_backend_config cfg = {.threads = 1, .device = -1, .max_batch = 8};
    char why[256];
    fx->be.ops = &convd_cpu_backend_ops;
    assert_int_equal(convd_cpu_backend_ops.init(&cfg, &fx->be.ctx, &fx->be.info, why, sizeof(why)),
                     0);
    fx->limits.max_regions = 4;
    fx->limits.max_mapped_bytes = 1 << 20;
    region_table_init(&fx->t, &fx->be, &fx->limits, &fx->stats);
    fx->base_fds = count_fds();
    fx->base_maps = count_memfd_maps();
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    region_table_release_all(&fx->t);
    assert_true(region_table_empty(&fx->t));
    region_table_destroy(&fx->t);
    assert_int_equal(fx->stats.regions, 0);
    assert_int_equal(fx->stats.mapped_bytes, 0);
    assert_int_equal(count_memfd_maps(), fx->base_maps);
    assert_int_equal(count_fds(), fx->base_fds);
    fx->be.ops->destroy(fx->be.ctx);
    free(fx);
    return 0;
}

#define SEALED (F_SEAL_SHRINK | F_SEAL_GROW)

static void expect(int rc, int want, const char *why, const char *word)
{
    if (rc != want)
        fail_msg("got %s (%s), want %s", convd_status_name(rc), why, convd_status_name(want));
    if (word != NULL && strstr(why, word) == NULL)
        fail_msg("\"%s\" does not mention \"%s\"", why, word);
}

/* --- tests -------------------------------------------------------------------------------- */

static void test_sealed_memfd(void **state)
{
    struct fixture *fx = *state;
    char why[256] = "";
    int fd = tu_memfd("convd-unit", 65536, SEALED);
    expect(region_register_memfd(&fx->t, 7, 65536, &fd, 1, why, sizeof(why)), 0, why, NULL);
    struct region *r = region_find(&fx->t, 7);
    assert_non_null(r);
    assert_int_equal(r->mem.kind, CONVD_MEM_HOST);
    assert_int_equal(r->mem.size, 65536);
    assert_false(r->readonly);
    assert_int_equal(fx->stats.regions, 1);
    assert_int_equal(fx->stats.mapped_bytes, 65536);
    assert_int_equal(count_memfd_maps(), fx->base_maps + 1);
    /* the daemon's mapping and the client's share the memory */
    uint8_t *mine = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(mine != MAP_FAILED);
    mine[100] = 0x5a;
    assert_int_equal(((uint8_t *)r->mem.host)[100], 0x5a);
    ((uint8_t *)r->mem.host)[65535] = 0xa5;
    assert_int_equal(mine[65535], 0xa5);
    munmap(mine, 65536);
    /* the region does not keep the descriptor */
    close(fd);
    assert_int_equal(count_fds(), fx->base_fds);
    /* a region may cover only the start of a larger file */
    fd = tu_memfd("convd-unit", 65536, SEALED);
    expect(region_register_memfd(&fx->t, 8, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
    assert_int_equal(fx->stats.mapped_bytes, 65536 + 4096);
    expect(region_unregister(&fx->t, 7, why, sizeof(why)), 0, why, NULL);
    assert_null(region_find(&fx->t, 7));
    assert_int_equal(fx->stats.regions, 1);
    assert_int_equal(count_memfd_maps(), fx->base_maps + 1);
    expect(region_unregister(&fx->t, 7, why, sizeof(why)), CONVD_ENOREGION, why, "region 7");
}

static void test_refused_memfds(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    static const struct {
        unsigned seals;
        size_t file;
        uint64_t size;
        int rc;
        const char *word;
    } cases[] = {
        {0, 8192, 8192, CONVD_ESEAL, "memfd is not sealed against shrinking (F_SEAL_SHRINK)"},
        {F_SEAL_GROW, 8192, 8192, CONVD_ESEAL, "F_SEAL_SHRINK"},
        {F_SEAL_SHRINK, 8192, 8192, CONVD_ESEAL, "not sealed against growing (F_SEAL_GROW)"},
        {F_SEAL_SEAL, 8192, 8192, CONVD_ESEAL, "F_SEAL_SHRINK"},
        {SEALED, 4096, 8192, CONVD_EBOUNDS, "size 8192 is larger than the memfd (4096 bytes)"},
        {SEALED, 4096, 0, CONVD_EINVAL, "size is 0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = tu_memfd("convd-unit", cases[i].file, cases[i].seals);
        why[0] = '\0';
        expect(region_register_memfd(&fx->t, 1, cases[i].size, &fd, 1, why, sizeof(why)),
               cases[i].rc, why, cases[i].word);
        close(fd);
        assert_null(region_find(&fx->t, 1));
    }
    /* a descriptor that is not a memfd */
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    expect(region_register_memfd(&fx->t, 1, 4096, &p[0], 1, why, sizeof(why)), CONVD_ESEAL, why,
           "not a memfd");
    close(p[0]);
    close(p[1]);
    /* no descriptor, and two */
    int fds[2] = {tu_memfd("convd-unit", 4096, SEALED), tu_memfd("convd-unit", 4096, SEALED)};
    expect(region_register_memfd(&fx->t, 1, 4096, fds, 0, why, sizeof(why)), CONVD_EINVAL, why,
           "exactly one file descriptor");
    expect(region_register_memfd(&fx->t, 1, 4096, fds, 2, why, sizeof(why)), CONVD_EINVAL, why,
           "carried 2");
    close(fds[0]);
    close(fds[1]);
    assert_int_equal(fx->stats.regions, 0);
}

static void test_ids_and_limits(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    int fd = tu_memfd("convd-unit", 1 << 20, SEALED);
    expect(region_register_memfd(&fx->t, 1, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&fx->t, 1, 4096, &fd, 1, why, sizeof(why)), CONVD_EEXIST, why,
           "region id 1 is already registered");
    /* bytes: 4096 in use, 1 MiB allowed */
    expect(region_register_memfd(&fx->t, 2, (1 << 20) - 4095, &fd, 1, why, sizeof(why)),
           CONVD_ELIMIT, why, "max_mapped_bytes");
    expect(region_register_memfd(&fx->t, 2, (1 << 20) - 4096, &fd, 1, why, sizeof(why)), 0, why,
           NULL);
    /* an absurd size fails the limit before anything is mapped */
    expect(region_register_memfd(&fx->t, 9, UINT64_MAX, &fd, 1, why, sizeof(why)), CONVD_ELIMIT,
           why, "max_mapped_bytes");
    expect(region_unregister(&fx->t, 2, why, sizeof(why)), 0, why, NULL);
    /* count: 4 regions */
    for (uint64_t id = 2; id <= 4; id++)
        expect(region_register_memfd(&fx->t, id, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&fx->t, 5, 4096, &fd, 1, why, sizeof(why)), CONVD_ELIMIT, why,
           "max_regions");
    expect(region_unregister(&fx->t, 3, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&fx->t, 5, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    assert_int_equal(fx->stats.regions, 4);
    close(fd);
}

/* A region a request still uses is unmapped only after the last reference goes, even if it was
 * unregistered (or its client went away) long before. */
/* Two connections of one user share an account: the per-user limits bind their sum, the
 * daemon-wide pinned cap binds every table with the same stats, and releases give it all back. */
static void test_user_and_pinned_limits(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    struct region_account acct = {0};
    struct region_table t2;
    fx->limits.max_regions_per_user = 3;
    fx->limits.max_mapped_bytes_per_user = 3 * 4096;
    fx->limits.max_pinned_bytes = 5 * 4096;
    region_table_set_account(&fx->t, &acct);
    region_table_init(&t2, &fx->be, &fx->limits, &fx->stats);
    region_table_set_account(&t2, &acct);
    int fd = tu_memfd("convd-unit", 1 << 20, SEALED);

    expect(region_register_memfd(&fx->t, 1, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&t2, 1, 8192, &fd, 1, why, sizeof(why)), 0, why, NULL);
    assert_int_equal(acct.regions, 2);
    assert_int_equal(acct.bytes, 3 * 4096);
    assert_int_equal(acct.host_bytes, 3 * 4096);
    assert_int_equal(fx->stats.host_bytes, 3 * 4096);
    /* bytes: the user's 12 KiB are used up over both connections, each far under its own 1 MiB */
    expect(region_register_memfd(&fx->t, 2, 1, &fd, 1, why, sizeof(why)), CONVD_ELIMIT, why,
           "max_mapped_bytes_per_user");
    expect(region_unregister(&t2, 1, why, sizeof(why)), 0, why, NULL);
    assert_int_equal(acct.bytes, 4096);
    expect(region_register_memfd(&fx->t, 2, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&t2, 2, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    /* count: three regions over two connections */
    fx->limits.max_mapped_bytes_per_user = 1 << 20;
    expect(region_register_memfd(&t2, 3, 4096, &fd, 1, why, sizeof(why)), CONVD_ELIMIT, why,
           "max_regions_per_user");

    /* Another user's table: its own account, the same daemon-wide pinned cap (5 pages, 3 in
     * use). */
    struct region_account other = {0};
    struct region_table t3;
    region_table_init(&t3, &fx->be, &fx->limits, &fx->stats);
    region_table_set_account(&t3, &other);
    expect(region_register_memfd(&t3, 1, 8192, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&t3, 2, 4096, &fd, 1, why, sizeof(why)), CONVD_ELIMIT, why,
           "max_pinned_bytes");
    expect(region_register_memfd(&t3, 2, UINT64_MAX / 2, &fd, 1, why, sizeof(why)), CONVD_ELIMIT,
           why, NULL);
    assert_int_equal(other.regions, 1);
    assert_int_equal(fx->stats.host_bytes, 5 * 4096);

    region_table_release_all(&t2);
    region_table_release_all(&t3);
    region_table_destroy(&t2);
    region_table_destroy(&t3);
    assert_int_equal(acct.regions, 2);
    assert_int_equal(other.regions, 0);
    assert_int_equal(other.bytes, 0);
    region_table_release_all(&fx->t);
    assert_int_equal(acct.regions, 0);
    assert_int_equal(acct.bytes, 0);
    assert_int_equal(acct.host_bytes, 0);
    assert_int_equal(fx->stats.host_bytes, 0);
    close(fd);
}

static bool lanes_busy_flag;

static bool lanes_busy(void *arg)
{
    (void)arg;
    return lanes_busy_flag;
}

/* With a release queue (device_waits): while it says the lanes are busy, a region nothing uses
 * leaves its table and user at once but stays mapped, imported and in the daemon's totals until
 * region_releases_run; when idle, it is released at once as without a queue. */
static void test_release_queue(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    struct region_releases q;
    struct region_account acct = {0};
    fx->limits.max_regions_per_user = 3;
    fx->limits.max_mapped_bytes_per_user = 3 * 4096;
    region_releases_init(&q, lanes_busy, NULL);
    region_table_set_account(&fx->t, &acct);
    region_table_set_releases(&fx->t, &q);
    for (uint64_t id = 1; id <= 3; id++) {
        int fd = tu_memfd("convd-unit", 4096, SEALED);
        expect(region_register_memfd(&fx->t, id, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
        close(fd);
    }
    lanes_busy_flag = true;
    expect(region_unregister(&fx->t, 1, why, sizeof(why)), 0, why, NULL);
    struct region *r = region_find(&fx->t, 2);
    region_ref(r);
    expect(region_unregister(&fx->t, 2, why, sizeof(why)), 0, why, NULL);
    assert_int_equal(q.count, 1); /* 2 is still in use */
    region_unref(r);
    assert_int_equal(q.count, 2);
    assert_int_equal(acct.regions, 1);
    assert_int_equal(acct.bytes, 4096);
    assert_int_equal(fx->stats.regions, 3);
    assert_int_equal(fx->stats.host_bytes, 3 * 4096);
    assert_int_equal(count_memfd_maps(), fx->base_maps + 3);
    lanes_busy_flag = false;
    region_releases_run(&q);
    assert_int_equal(q.count, 0);
    assert_int_equal(fx->stats.regions, 1);
    assert_int_equal(count_memfd_maps(), fx->base_maps + 1);
    /* idle: at once */
    expect(region_unregister(&fx->t, 3, why, sizeof(why)), 0, why, NULL);
    assert_int_equal(q.count, 0);
    assert_int_equal(fx->stats.regions, 0);
    assert_int_equal(acct.regions, 0);
    assert_true(region_table_empty(&fx->t));
    assert_int_equal(count_memfd_maps(), fx->base_maps);
}

static void test_deferred_release(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    int fd = tu_memfd("convd-unit", 8192, SEALED);
    expect(region_register_memfd(&fx->t, 1, 8192, &fd, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
    struct region *r = region_find(&fx->t, 1);
    region_ref(r);
    region_ref(r);
    volatile uint8_t *p = r->mem.host;
    expect(region_unregister(&fx->t, 1, why, sizeof(why)), 0, why, NULL);
    /* gone by id, still mapped and counted */
    assert_null(region_find(&fx->t, 1));
    assert_int_equal(count_memfd_maps(), fx->base_maps + 1);
    assert_int_equal(fx->stats.regions, 1);
    assert_false(region_table_empty(&fx->t));
    p[8191] = 1; /* still writable: a running request may write its output here */
    /* the id may be used again meanwhile */
    fd = tu_memfd("convd-unit", 4096, SEALED);
    expect(region_register_memfd(&fx->t, 1, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
    assert_int_equal(fx->stats.regions, 2);
    region_unref(r);
    assert_int_equal(fx->stats.regions, 2);
    region_unref(r);
    assert_int_equal(fx->stats.regions, 1);
    assert_int_equal(count_memfd_maps(), fx->base_maps + 1);

    /* release_all (a disconnect) with a reference outstanding */
    struct region *r2 = region_find(&fx->t, 1);
    region_ref(r2);
    region_table_release_all(&fx->t);
    assert_null(region_find(&fx->t, 1));
    assert_false(region_table_empty(&fx->t));
    assert_int_equal(count_memfd_maps(), fx->base_maps + 1);
    region_unref(r2);
    assert_true(region_table_empty(&fx->t));
    assert_int_equal(count_memfd_maps(), fx->base_maps);
    /* a referenced region that stays registered is not released by unref */
    fd = tu_memfd("convd-unit", 4096, SEALED);
    expect(region_register_memfd(&fx->t, 3, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
    struct region *r3 = region_find(&fx->t, 3);
    region_ref(r3);
    region_unref(r3);
    assert_ptr_equal(region_find(&fx->t, 3), r3);
}

static void test_write_sealed_is_readonly(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    int fd = tu_memfd("convd-unit", 4096, SEALED | F_SEAL_WRITE);
    expect(region_register_memfd(&fx->t, 1, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
    assert_true(region_find(&fx->t, 1)->readonly);
}

static void test_gpu_handles(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    uint8_t handle[CONVD_IPC_HANDLE_SIZE] = {1, 2, 3};
    expect(region_register_gpu(&fx->t, 1, 4096, handle, sizeof(handle), 0, why, sizeof(why)),
           CONVD_EUNSUPPORTED, why, "cpu backend");
    expect(region_register_gpu(&fx->t, 1, 4096, handle, 63, 0, why, sizeof(why)), CONVD_EINVAL, why,
           "63 bytes");
    expect(region_register_gpu(&fx->t, 1, 4096, handle, sizeof(handle), UINT64_MAX - 100, why,
                               sizeof(why)),
           CONVD_EBOUNDS, why, "overflows");
    assert_int_equal(fx->stats.regions, 0);
    assert_null(region_find(&fx->t, 1));
}

static void test_mmap_failure(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    int fd = tu_memfd("convd-unit", 8192, SEALED);
    mmap_fail_errno = ENOMEM;
    expect(region_register_memfd(&fx->t, 1, 8192, &fd, 1, why, sizeof(why)), CONVD_ENOMEM, why,
           "cannot map 8192 bytes");
    assert_null(region_find(&fx->t, 1));
    assert_int_equal(fx->stats.regions, 0);
    mmap_fail_errno = EACCES;
    expect(region_register_memfd(&fx->t, 1, 8192, &fd, 1, why, sizeof(why)), CONVD_EPERM, why,
           "cannot map");
    /* and it works once mmap does */
    expect(region_register_memfd(&fx->t, 1, 8192, &fd, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
}

static void test_overlap(void **state)
{
    struct fixture *fx = *state;
    char why[256];
    int fd = tu_memfd("convd-unit", 8192, SEALED);
    int other = tu_memfd("convd-unit", 8192, SEALED);
    /* the same memfd twice: two ids, one memory */
    expect(region_register_memfd(&fx->t, 1, 8192, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&fx->t, 2, 4096, &fd, 1, why, sizeof(why)), 0, why, NULL);
    expect(region_register_memfd(&fx->t, 3, 8192, &other, 1, why, sizeof(why)), 0, why, NULL);
    close(fd);
    close(other);
    struct region *a = region_find(&fx->t, 1), *b = region_find(&fx->t, 2),
                  *c = region_find(&fx->t, 3);
    assert_true(region_ranges_overlap(a, 0, 100, a, 99, 10));
    assert_false(region_ranges_overlap(a, 0, 100, a, 100, 10));
    assert_true(region_ranges_overlap(a, 4000, 200, b, 4095, 1));
    assert_false(region_ranges_overlap(a, 4096, 200, b, 0, 4096));
    assert_false(region_ranges_overlap(a, 0, 8192, c, 0, 8192));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sealed_memfd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_memfds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ids_and_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_user_and_pinned_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_sealed_is_readonly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_handles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mmap_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
    };
    return cmocka_run_group_tests_name("daemon regions", tests, NULL, NULL);
}
