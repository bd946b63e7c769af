/* The shared setup of the C ibverbs tests (see pair.h). */
#define _GNU_SOURCE
#include "pair.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *test_name = "test";
/* The options of the last pair_open (pair_extra_qps makes its QPs the same way). */
static struct pair_opts pair_options;

static void watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: the watchdog expired: the test is stuck (WATCHDOG_S)\n";
    ssize_t n = write(2, msg, sizeof msg - 1);
    (void)n;
    _exit(3);
}

void test_start(const char *name)
{
    test_name = name;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, watchdog);
    alarm(WATCHDOG_S);
}

void fail(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s: FAIL: ", test_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

void ok(const char *fmt, ...)
{
    va_list ap;
    printf("ok   ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

void check_rc(int rc, const char *verb)
{
    CHECK(rc == 0, "%s returned %d (%s)", verb, rc, strerror(rc > 0 ? rc : errno));
}

const char *wc_str(const struct ibv_wc *wc)
{
    static char s[256];
    snprintf(s, sizeof s,
             "status %s (%d), opcode %d, wr_id %#llx, byte_len %u, wc_flags %#x, imm_data %#x, "
             "qp_num %#x, vendor_err %#x",
             ibv_wc_status_str(wc->status), wc->status, wc->opcode,
             (unsigned long long)wc->wr_id, wc->byte_len, wc->wc_flags, wc->imm_data,
             wc->qp_num, wc->vendor_err);
    return s;
}

static struct ibv_device *find_device(struct ibv_device **list, int n, const char *name)
{
    char names[256] = "";
    for (int i = 0; i < n; i++) {
        const char *d = ibv_get_device_name(list[i]);
        if (d && strcmp(d, name) == 0)
            return list[i];
        if (d && strlen(names) + strlen(d) + 3 < sizeof names) {
            strcat(names, " ");
            strcat(names, d);
        }
    }
    fail("ibv_get_device_list: no device %s among the %d listed:%s", name, n, names);
}

/* Opens `e->name` and makes its PD, channel, CQ and QP. */
static struct ibv_qp *new_qp(struct end *e, const struct pair_opts *o);

static void end_open(struct end *e, struct ibv_device *dev, const struct pair_opts *o)
{
    e->ctx = ibv_open_device(dev);
    CHECK(e->ctx, "ibv_open_device(%s): %s", e->name, strerror(errno));

    struct ibv_port_attr port;
    check_rc(ibv_query_port(e->ctx, 1, &port), "ibv_query_port(port 1)");
    CHECK(port.state == IBV_PORT_ACTIVE, "%s port 1 is %s, not ACTIVE", e->name,
          ibv_port_state_str(port.state));
    CHECK(port.link_layer == IBV_LINK_LAYER_ETHERNET, "%s port 1: link layer %d, not Ethernet",
          e->name, port.link_layer);

    check_rc(ibv_query_gid(e->ctx, 1, 0, &e->gid), "ibv_query_gid(port 1, index 0)");
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    CHECK(memcmp(e->gid.raw, v4_mapped, sizeof v4_mapped) == 0,
          "%s GID 0 is not an IPv4-mapped address (::ffff:a.b.c.d)", e->name);

    e->pd = ibv_alloc_pd(e->ctx);
    CHECK(e->pd, "ibv_alloc_pd(%s): %s", e->name, strerror(errno));
    if (o->channel) {
        e->channel = ibv_create_comp_channel(e->ctx);
        CHECK(e->channel, "ibv_create_comp_channel(%s): %s", e->name, strerror(errno));
    }
    e->cq = ibv_create_cq(e->ctx, 1024, e, e->channel, 0);
    CHECK(e->cq, "ibv_create_cq(%s, 1024): %s", e->name, strerror(errno));

    if (o->srq_wr && e->name[8] == '1') {
        struct ibv_srq_init_attr sa = {.attr = {.max_wr = o->srq_wr, .max_sge = 1}};
        e->srq = ibv_create_srq(e->pd, &sa);
        CHECK(e->srq, "ibv_create_srq(%s, %u WRs): %s", e->name, o->srq_wr, strerror(errno));
    }
    e->qp = new_qp(e, o);
}

static struct ibv_qp *new_qp(struct end *e, const struct pair_opts *o)
{
    struct ibv_qp_init_attr init = {
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .srq = e->srq,
        .qp_type = IBV_QPT_RC,
        .cap =
            {
                .max_send_wr = o->max_send_wr ? o->max_send_wr : 64,
                .max_recv_wr = o->max_recv_wr ? o->max_recv_wr : 64,
                .max_send_sge = o->max_send_sge ? o->max_send_sge : 1,
                .max_recv_sge = o->max_recv_sge && !e->srq ? o->max_recv_sge : 1,
            },
    };
    struct ibv_qp *qp = ibv_create_qp(e->pd, &init);
    CHECK(qp, "ibv_create_qp(%s, RC): %s", e->name, strerror(errno));
    return qp;
}

static void modify(struct end *e, struct ibv_qp_attr *attr, int mask, const char *to)
{
    int rc = ibv_modify_qp(e->qp, attr, mask);
    CHECK(rc == 0, "ibv_modify_qp(%s QP %#x -> %s) returned %d (%s)", e->name, e->qp->qp_num,
          to, rc, strerror(rc > 0 ? rc : errno));
    CHECK(e->qp->state == attr->qp_state, "%s QP state %d after ibv_modify_qp to %s", e->name,
          e->qp->state, to);
}

/* Moves `e`'s QP through INIT and RTR to RTS, connected to `peer`'s QP. */
static void connect_to(struct end *e, const struct end *peer)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = 1,
        .qp_access_flags =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
    };
    modify(e, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer->qp->qp_num;
    a.rq_psn = peer->psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    modify(e, &a,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
           "RTR");

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    /* 537 ms, eight tries: no program here loses packets on purpose, and a busy machine
     * (ci --stress) can keep the card's threads from a CPU for longer than 67 ms x 8. */
    a.timeout = 17;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = e->psn;
    a.max_rd_atomic = 16;
    modify(e, &a,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
}

void pair_open(struct end *a, struct end *b, const struct pair_opts *opts)
{
    static const struct pair_opts none;
    const struct pair_opts *o = opts ? opts : &none;
    pair_options = *o;
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list, "ibv_get_device_list: %s", strerror(errno));
    memset(a, 0, sizeof *a);
    memset(b, 0, sizeof *b);
    a->name = "bluerdma0";
    b->name = "bluerdma1";
    /* PSNs far apart, one near the 24-bit wrap. */
    a->psn = 0x123456;
    b->psn = 0xFFFFF0;
    end_open(a, find_device(list, n, a->name), o);
    end_open(b, find_device(list, n, b->name), o);
    ibv_free_device_list(list);
    CHECK(memcmp(&a->gid, &b->gid, sizeof a->gid) != 0, "both devices have the same GID 0");
    connect_to(a, b);
    connect_to(b, a);
    ok("%s QP %#x <-> %s QP %#x connected (RC, GID index 0)", a->name, a->qp->qp_num,
       b->name, b->qp->qp_num);
}

void pair_extra_qps(struct end *a, struct end *b, struct ibv_qp **aqp, struct ibv_qp **bqp)
{
    struct ibv_qp *qa = a->qp, *qb = b->qp;
    a->qp = new_qp(a, &pair_options);
    b->qp = new_qp(b, &pair_options);
    connect_to(a, b);
    connect_to(b, a);
    *aqp = a->qp;
    *bqp = b->qp;
    a->qp = qa;
    b->qp = qb;
}

void pair_connect(struct end *a, struct ibv_qp *qa, struct end *b, struct ibv_qp *qb)
{
    struct ibv_qp *sa = a->qp, *sb = b->qp;
    a->qp = qa;
    b->qp = qb;
    connect_to(a, b);
    connect_to(b, a);
    a->qp = sa;
    b->qp = sb;
}

void expect_errno(int rc, int want, const char *what)
{
    int e = errno;
    CHECK(rc == want || (rc == -1 && e == want), "%s: returned %d, expected %d (%s)", what, rc,
          want, strerror(want));
    CHECK(e == want, "%s: errno %d (%s), expected %d (%s)", what, e, strerror(e), want,
          strerror(want));
}

static void end_close(struct end *e)
{
    check_rc(ibv_destroy_qp(e->qp), "ibv_destroy_qp");
    if (e->srq)
        check_rc(ibv_destroy_srq(e->srq), "ibv_destroy_srq");
    check_rc(ibv_destroy_cq(e->cq), "ibv_destroy_cq");
    if (e->channel)
        check_rc(ibv_destroy_comp_channel(e->channel), "ibv_destroy_comp_channel");
    check_rc(ibv_dealloc_pd(e->pd), "ibv_dealloc_pd");
    check_rc(ibv_close_device(e->ctx), "ibv_close_device");
}

void pair_close(struct end *a, struct end *b)
{
    end_close(a);
    end_close(b);
}

void *alloc_buf(size_t len, uint8_t fill)
{
    void *p = NULL;
    int rc = posix_memalign(&p, 4096, len);
    CHECK(rc == 0, "posix_memalign(%zu): %s", len, strerror(rc));
    memset(p, fill, len);
    return p;
}

struct ibv_mr *reg_mr(struct end *e, void *buf, size_t len)
{
    struct ibv_mr *mr = ibv_reg_mr(
        e->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    CHECK(mr, "ibv_reg_mr(%s, %zu bytes): %s", e->name, len, strerror(errno));
    CHECK(mr->addr == buf && mr->length == len, "ibv_reg_mr(%s): the MR is %p+%zu, not %p+%zu",
          e->name, mr->addr, mr->length, buf, len);
    return mr;
}

void dereg_mr(struct ibv_mr *mr)
{
    check_rc(ibv_dereg_mr(mr), "ibv_dereg_mr");
}

void pair_open_mrs(struct end *a, struct end *b, const struct pair_opts *opts, size_t len,
                   struct ibv_mr **amr, struct ibv_mr **bmr)
{
    pair_open(a, b, opts);
    *amr = reg_mr(a, alloc_buf(len, 0), len);
    *bmr = reg_mr(b, alloc_buf(len, 0), len);
}

void pair_finish(struct end *a, struct end *b, struct ibv_mr *amr, struct ibv_mr *bmr)
{
    void *abuf = amr->addr, *bbuf = bmr->addr;
    dereg_mr(amr);
    dereg_mr(bmr);
    free(abuf);
    free(bbuf);
    pair_close(a, b);
}

int shots_test(const char *name, size_t buf_len, const struct shot *shots, size_t count,
               shot_fn *one)
{
    struct end a, b;
    struct ibv_mr *amr, *bmr;
    test_start(name);
    pair_open_mrs(&a, &b, NULL, buf_len, &amr, &bmr);
    uint32_t n = 0;
    for (size_t i = 0; i < count; i++) {
        one(&a, amr, &b, bmr, &shots[i], ++n);
        one(&b, bmr, &a, amr, &shots[i], ++n);
    }
    expect_no_wc(&a, "after the last shot");
    expect_no_wc(&b, "after the last shot");
    pair_finish(&a, &b, amr, bmr);
    printf("PASS %s: %u transfers\n", name, n);
    return 0;
}

void post_send_wr(struct end *e, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr,
                  uint32_t len, const struct ibv_mr *mr, uint64_t raddr, uint32_t rkey,
                  uint32_t imm, unsigned flags)
{
    struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = mr ? mr->lkey : 0};
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .sg_list = mr ? &sge : NULL,
        .num_sge = mr ? 1 : 0,
        .opcode = op,
        .send_flags = flags,
        .imm_data = imm,
    };
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(e->qp, &wr, &bad);
    CHECK(rc == 0, "ibv_post_send(%s, opcode %d, wr_id %#llx, %u bytes) returned %d (%s)",
          e->name, op, (unsigned long long)wr_id, len, rc, strerror(rc));
}

void post_recv_wr(struct end *e, uint64_t wr_id, void *addr, uint32_t len,
                  const struct ibv_mr *mr)
{
    struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = mr ? mr->lkey : 0};
    struct ibv_recv_wr wr = {
        .wr_id = wr_id,
        .sg_list = mr ? &sge : NULL,
        .num_sge = mr ? 1 : 0,
    };
    struct ibv_recv_wr *bad = NULL;
    int rc = ibv_post_recv(e->qp, &wr, &bad);
    CHECK(rc == 0, "ibv_post_recv(%s, wr_id %#llx, %u bytes) returned %d (%s)", e->name,
          (unsigned long long)wr_id, len, rc, strerror(rc));
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void poll_one(struct end *e, struct ibv_wc *wc, const char *what)
{
    long long deadline = now_ms() + WAIT_MS;
    for (unsigned spins = 0;; spins++) {
        int n = ibv_poll_cq(e->cq, 1, wc);
        CHECK(n >= 0, "ibv_poll_cq(%s) returned %d while waiting for %s", e->name, n, what);
        if (n == 1)
            return;
        if (spins % 1024 == 1023) {
            CHECK(now_ms() < deadline, "no completion on %s's CQ within %d ms for %s", e->name,
                  WAIT_MS, what);
            /* Leave the CPU to the emulated NIC's threads now and then. */
            struct timespec pause = {.tv_nsec = 20000};
            nanosleep(&pause, NULL);
        }
    }
}

void expect_wc(struct end *e, struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_opcode opcode,
               const char *what)
{
    poll_one(e, wc, what);
    CHECK(wc->status == IBV_WC_SUCCESS, "%s on %s: completion failed: %s", what, e->name,
          wc_str(wc));
    CHECK(wc->wr_id == wr_id, "%s on %s: completion for wr_id %#llx, expected %#llx: %s", what,
          e->name, (unsigned long long)wc->wr_id, (unsigned long long)wr_id, wc_str(wc));
    CHECK(wc->opcode == opcode, "%s on %s: completion opcode %d, expected %d: %s", what,
          e->name, wc->opcode, opcode, wc_str(wc));
    CHECK(wc->qp_num == e->qp->qp_num, "%s on %s: completion for QP %#x, expected %#x: %s",
          what, e->name, wc->qp_num, e->qp->qp_num, wc_str(wc));
}

void expect_no_wc(struct end *e, const char *what)
{
    struct ibv_wc wc;
    int n = ibv_poll_cq(e->cq, 1, &wc);
    CHECK(n == 0, "%s: %s's CQ has an unexpected completion (ibv_poll_cq returned %d): %s", what,
          e->name, n, n > 0 ? wc_str(&wc) : "-");
}
