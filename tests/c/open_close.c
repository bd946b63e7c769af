/* Closing frees everything: CYCLES (10,000; BLUERDMA_CYCLES overrides) rounds in one
 * process of open bluerdma0, a PD, a registered buffer, a CQ, two QPs connected to each
 * other on the device and one RDMA WRITE between them (checked), then close. Every 16th
 * round leaves its objects for ibv_close_device to destroy. After the first rounds have
 * warmed the allocator, the process's resident memory, open file descriptors and threads
 * must stay where they were: RSS within 16 MiB, fds and threads exactly. The test harness
 * runs it with a fixed malloc mmap threshold (tests/tests/ibverbs_c.rs), so that the RSS
 * is the driver's and not glibc's cache of freed blocks. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pair.h"
#include "verify.h"

#define CYCLES 10000
#define WARM 50
#define LEN 65536
#define RSS_SLACK (16L << 20)

struct usage {
    long rss, fds, threads;
};

/* The process's threads from /proc/self/status. */
static long threads_now(void)
{
    long threads = 0;
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f, "reading /proc/self/status: %s", strerror(errno));
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %ld", &threads) == 1)
            break;
    fclose(f);
    return threads;
}

/* The fewest threads seen over 20 samples 1 ms apart: a thread that ibv_close_device joined
 * is still counted for a moment after the join returns (the kernel wakes the joiner before
 * the thread leaves its group), and a count taken in that moment made the check fail with
 * "grew from 2 to 1". A thread that stays is seen in every sample. */
static long settled_threads(void)
{
    long least = threads_now();
    for (int i = 0; i < 20; i++) {
        usleep(1000);
        long t = threads_now();
        if (t < least)
            least = t;
    }
    return least;
}

static struct usage usage_now(void)
{
    struct usage u = {0, 0, 0};
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    CHECK(f && fscanf(f, "%ld %ld", &pages, &resident) == 2, "reading /proc/self/statm");
    fclose(f);
    u.rss = resident * sysconf(_SC_PAGESIZE);
    DIR *d = opendir("/proc/self/fd");
    CHECK(d, "opendir(/proc/self/fd): %s", strerror(errno));
    while (readdir(d))
        u.fds++;
    closedir(d);
    u.threads = settled_threads();
    return u;
}

static struct ibv_qp *rc_qp(struct end *e)
{
    struct ibv_qp_init_attr init = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(e->pd, &init);
    CHECK(qp, "ibv_create_qp: %s", strerror(errno));
    return qp;
}

static void cycle(struct ibv_device *dev, uint8_t *buf, unsigned n)
{
    struct end e = {.name = "bluerdma0", .psn = n & 0xFFFF};
    e.ctx = ibv_open_device(dev);
    CHECK(e.ctx, "round %u: ibv_open_device: %s", n, strerror(errno));
    check_rc(ibv_query_gid(e.ctx, 1, 0, &e.gid), "ibv_query_gid");
    e.pd = ibv_alloc_pd(e.ctx);
    CHECK(e.pd, "round %u: ibv_alloc_pd: %s", n, strerror(errno));
    e.cq = ibv_create_cq(e.ctx, 16, NULL, NULL, 0);
    CHECK(e.cq, "round %u: ibv_create_cq: %s", n, strerror(errno));
    struct ibv_mr *mr = reg_mr(&e, buf, 2 * LEN);
    struct ibv_qp *q1 = rc_qp(&e), *q2 = rc_qp(&e);
    struct end peer = e;
    pair_connect(&e, q1, &peer, q2);
    e.qp = q1;
    pattern_fill(buf, LEN, n);
    post_send_wr(&e, IBV_WR_RDMA_WRITE, n, buf, LEN, mr, (uintptr_t)buf + LEN, mr->rkey, 0,
                 IBV_SEND_SIGNALED);
    struct ibv_wc wc;
    expect_wc(&e, &wc, n, IBV_WC_RDMA_WRITE, "the round's WRITE");
    CHECK(pattern_check(buf + LEN, LEN, n, "the round's WRITE") == 0, "round %u: data differs",
          n);
    if (n % 16 != 15) {
        check_rc(ibv_destroy_qp(q1), "ibv_destroy_qp");
        check_rc(ibv_destroy_qp(q2), "ibv_destroy_qp");
        dereg_mr(mr);
        check_rc(ibv_destroy_cq(e.cq), "ibv_destroy_cq");
        check_rc(ibv_dealloc_pd(e.pd), "ibv_dealloc_pd");
    }
    check_rc(ibv_close_device(e.ctx), "ibv_close_device");
}

int main(void)
{
    test_start("open_close");
    alarm(0); /* the rounds bound themselves: each wait is WAIT_MS at most */
    const char *env = getenv("BLUERDMA_CYCLES");
    unsigned cycles = env ? (unsigned)strtoul(env, NULL, 10) : CYCLES;
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n > 0, "ibv_get_device_list: %s", strerror(errno));
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(ibv_get_device_name(list[i]), "bluerdma0") == 0)
            dev = list[i];
    CHECK(dev, "no bluerdma0");
    uint8_t *buf = alloc_buf(2 * LEN, 0);
    struct usage base = {0, 0, 0};
    for (unsigned i = 0; i < cycles; i++) {
        cycle(dev, buf, i);
        if (i + 1 == WARM || (cycles < WARM && i == 0))
            base = usage_now();
        if (i % 1000 == 999) {
            struct usage u = usage_now();
            ok("%u rounds: RSS %ld KiB, %ld fds, %ld threads", i + 1, u.rss >> 10, u.fds,
               u.threads);
        }
    }
    struct usage end = usage_now();
    ibv_free_device_list(list);
    free(buf);
    CHECK(end.fds == base.fds, "open file descriptors grew from %ld to %ld", base.fds, end.fds);
    CHECK(end.threads == base.threads, "threads grew from %ld to %ld", base.threads,
          end.threads);
    CHECK(end.rss - base.rss <= RSS_SLACK, "RSS grew by %ld KiB over %u rounds (from %ld KiB)",
          (end.rss - base.rss) >> 10, cycles, base.rss >> 10);
    printf("PASS open_close: %u rounds; RSS %ld -> %ld KiB, %ld fds, %ld threads\n", cycles,
           base.rss >> 10, end.rss >> 10, end.fds, end.threads);
    return 0;
}
