/* Unreliable Datagram QPs between bluerdma0 and bluerdma1: address handles from each
 * other's GID; datagrams of 0 bytes up to the port MTU (4096, in up to three frames) both
 * ways, with and without immediate data, gathered from two SGEs and scattered into two (the
 * GRH area, then the payload); the GRH area holds the IPv4 header (saddr in bytes
 * 32..35, daddr in 36..39); src_qp, qp_num, wc_flags and sl (2: IPv4) are checked. A
 * datagram with the wrong Q_Key, one that finds no receive buffer and an oversized send are
 * refused or dropped without a hang; a reply through ibv_create_ah_from_wc reaches the
 * sender. UD completions share the CQ of the ends' connected RC QPs. */
#define _GNU_SOURCE
#include "pair.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QKEY 0x11111111u
/* The largest UD payload: the port's MTU (datagrams over 1978 bytes, what fits one
 * 2048-byte simple-NIC slot, travel in several frames). */
#define UD_MAX 4096u
#define GRH 40u
/* Receive area: the GRH SGE, then the payload SGE. */
#define RECV_AT 8192u
#define BUF_LEN 16384u

struct ud {
    struct end *e;
    struct ibv_qp *qp;
    struct ibv_ah *ah; /* to the other side */
    struct ibv_mr *mr;
    uint8_t *buf;
};

static void to_state(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
    int rc = ibv_modify_qp(qp, a, mask);
    CHECK(rc == 0, "ibv_modify_qp(UD, %s) returned %d (%s)", what, rc, strerror(rc));
}

static void ud_open(struct ud *u, struct end *e)
{
    u->e = e;
    struct ibv_qp_init_attr ia = {
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2, .max_recv_sge = 2,
                .max_inline_data = 64},
        .qp_type = IBV_QPT_UD,
    };
    u->qp = ibv_create_qp(e->pd, &ia);
    CHECK(u->qp, "ibv_create_qp(UD) on %s: %s", e->name, strerror(errno));
    CHECK(u->qp->qp_type == IBV_QPT_UD, "the QP is of type %d", u->qp->qp_type);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                            .qkey = QKEY};
    to_state(u->qp, &a,
             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "INIT");
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
    to_state(u->qp, &a, IBV_QP_STATE, "RTR");
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .sq_psn = 0x123};
    to_state(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
    struct ibv_qp_init_attr qi;
    check_rc(ibv_query_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_QKEY, &qi), "ibv_query_qp(UD)");
    CHECK(a.qp_state == IBV_QPS_RTS && a.qkey == QKEY && qi.qp_type == IBV_QPT_UD,
          "ibv_query_qp(UD): state %d, qkey %#x, type %d", a.qp_state, a.qkey, qi.qp_type);
    u->buf = alloc_buf(BUF_LEN, 0);
    u->mr = reg_mr(e, u->buf, BUF_LEN);
}

static struct ibv_ah *ah_to(struct end *from, const struct end *to)
{
    struct ibv_ah_attr a = {
        .is_global = 1,
        .port_num = 1,
        .grh = {.dgid = to->gid, .sgid_index = 0, .hop_limit = 64},
    };
    struct ibv_ah *ah = ibv_create_ah(from->pd, &a);
    CHECK(ah, "ibv_create_ah(%s -> %s): %s", from->name, to->name, strerror(errno));
    return ah;
}

static uint8_t pattern(uint32_t seed, uint32_t i)
{
    return (uint8_t)(seed * 31 + i * 7 + (i >> 8));
}

/* Posts a send of `len` pattern bytes from `s` to `d`'s QP, gathered from two SGEs;
 * returns ibv_post_send's result. */
static int ud_send(struct ud *s, struct ud *d, struct ibv_ah *ah, uint32_t len, int imm,
                   uint32_t qkey, uint32_t seed, uint64_t wr_id)
{
    for (uint32_t i = 0; i < len; i++)
        s->buf[i] = pattern(seed, i);
    uint32_t first = len / 3;
    struct ibv_sge sge[2] = {
        {.addr = (uintptr_t)s->buf, .length = first, .lkey = s->mr->lkey},
        {.addr = (uintptr_t)s->buf + first, .length = len - first, .lkey = s->mr->lkey},
    };
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .sg_list = sge,
        .num_sge = len ? 2 : 0,
        .opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = htonl(0xC0DE0000u | seed),
    };
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = d->qp->qp_num;
    wr.wr.ud.remote_qkey = qkey;
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(s->qp, &wr, &bad);
}

static void ud_recv(struct ud *d, uint64_t wr_id)
{
    memset(d->buf + RECV_AT, 0xEE, BUF_LEN - RECV_AT);
    struct ibv_sge sge[2] = {
        {.addr = (uintptr_t)d->buf + RECV_AT, .length = GRH, .lkey = d->mr->lkey},
        {.addr = (uintptr_t)d->buf + RECV_AT + 64, .length = UD_MAX, .lkey = d->mr->lkey},
    };
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = sge, .num_sge = 2};
    struct ibv_recv_wr *bad = NULL;
    check_rc(ibv_post_recv(d->qp, &wr, &bad), "ibv_post_recv(UD)");
}

/* poll_one, then fails unless the completion succeeded on `qp` with `wr_id` and `opcode`
 * (expect_wc checks the pair's RC QP). */
static void expect_ud(struct end *e, struct ibv_qp *qp, struct ibv_wc *wc, uint64_t wr_id,
                      enum ibv_wc_opcode opcode, const char *what)
{
    poll_one(e, wc, what);
    CHECK(wc->status == IBV_WC_SUCCESS && wc->wr_id == wr_id && wc->opcode == opcode &&
              wc->qp_num == qp->qp_num,
          "%s on %s: expected wr_id %#llx, opcode %d on QP %#x, got %s", what, e->name,
          (unsigned long long)wr_id, opcode, qp->qp_num, wc_str(wc));
}

/* Fails unless no completion shows up on `e`'s CQ for `ms` milliseconds. */
static void quiet_for(struct end *e, int ms, const char *what)
{
    struct timespec t = {.tv_nsec = 1000000};
    for (int i = 0; i < ms; i++) {
        expect_no_wc(e, what);
        nanosleep(&t, NULL);
    }
}

/* Checks the receive completion and bytes of datagram `seed` of `len` bytes s -> d. */
static void check_recv(struct ud *s, struct ud *d, uint32_t len, int imm, uint32_t seed,
                       uint64_t wr_id, struct ibv_wc *wc)
{
    char what[96];
    snprintf(what, sizeof what, "%u-byte datagram %s -> %s%s", len, s->e->name, d->e->name,
             imm ? " with immediate" : "");
    expect_ud(d->e, d->qp, wc, wr_id, IBV_WC_RECV, what);
    CHECK(wc->byte_len == GRH + len, "%s: byte_len %u, expected %u", what, wc->byte_len,
          GRH + len);
    unsigned want_flags = IBV_WC_GRH | (imm ? IBV_WC_WITH_IMM : 0);
    CHECK((wc->wc_flags & (IBV_WC_GRH | IBV_WC_WITH_IMM)) == want_flags,
          "%s: wc_flags %#x, expected %#x", what, wc->wc_flags, want_flags);
    CHECK(!imm || wc->imm_data == htonl(0xC0DE0000u | seed), "%s: imm_data %#x", what,
          ntohl(wc->imm_data));
    CHECK(wc->src_qp == s->qp->qp_num, "%s: src_qp %#x, expected %#x", what, wc->src_qp,
          s->qp->qp_num);
    CHECK(wc->qp_num == d->qp->qp_num, "%s: qp_num %#x, expected %#x", what, wc->qp_num,
          d->qp->qp_num);
    CHECK(wc->sl == 2, "%s: sl %u, expected 2 (RoCE v2 over IPv4)", what, wc->sl);
    const uint8_t *g = d->buf + RECV_AT;
    for (int i = 0; i < 20; i++)
        CHECK(g[i] == 0, "%s: GRH byte %d is %#x, expected 0", what, i, g[i]);
    CHECK(g[20] == 0x45, "%s: GRH byte 20 is %#x, expected an IPv4 header (0x45)", what, g[20]);
    CHECK(memcmp(g + 32, s->e->gid.raw + 12, 4) == 0, "%s: GRH bytes 32..35 are not %s's IP",
          what, s->e->name);
    CHECK(memcmp(g + 36, d->e->gid.raw + 12, 4) == 0, "%s: GRH bytes 36..39 are not %s's IP",
          what, d->e->name);
    const uint8_t *p = g + 64;
    for (uint32_t i = 0; i < len; i++)
        CHECK(p[i] == pattern(seed, i), "%s: payload byte %u is %#x, expected %#x", what, i,
              p[i], pattern(seed, i));
    CHECK(len == 2048 || p[len] == 0xEE, "%s: a byte after the payload was written", what);
}

static void datagram(struct ud *s, struct ud *d, uint32_t len, int imm, uint32_t seed)
{
    struct ibv_wc wc;
    ud_recv(d, 0x100 + seed);
    check_rc(ud_send(s, d, s->ah, len, imm, QKEY, seed, 0x200 + seed), "ibv_post_send(UD)");
    expect_ud(s->e, s->qp, &wc, 0x200 + seed, IBV_WC_SEND, "UD send");
    check_recv(s, d, len, imm, seed, 0x100 + seed, &wc);
}

int main(void)
{
    test_start("ud");
    struct end a = {.name = "bluerdma0", .psn = 0x10};
    struct end b = {.name = "bluerdma1", .psn = 0x20};
    struct pair_opts opts = {.channel = 1};
    pair_open(&a, &b, &opts);
    struct ibv_device_attr da;
    check_rc(ibv_query_device(a.ctx, &da), "ibv_query_device");
    CHECK(da.max_ah > 0, "max_ah is %d", da.max_ah);

    struct ud ua, ub;
    ud_open(&ua, &a);
    ud_open(&ub, &b);
    CHECK(ua.qp->qp_num != ub.qp->qp_num && ua.qp->qp_num != a.qp->qp_num,
          "QP numbers collide: %#x %#x %#x", ua.qp->qp_num, ub.qp->qp_num, a.qp->qp_num);
    ua.ah = ah_to(&a, &b);
    ub.ah = ah_to(&b, &a);
    struct ibv_ah_attr no_grh = {.port_num = 1};
    errno = 0;
    CHECK(!ibv_create_ah(a.pd, &no_grh) && errno == EINVAL,
          "ibv_create_ah without a GRH did not fail with EINVAL");
    ok("UD QPs %#x and %#x in RTS, address handles made", ua.qp->qp_num, ub.qp->qp_num);

    static const uint32_t sizes[] = {0, 1, 1000, 1978, 1979, 2048, 3957, 3958, UD_MAX};
    uint32_t seed = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int imm = 0; imm <= 1; imm++) {
            datagram(&ua, &ub, sizes[i], imm, seed++);
            datagram(&ub, &ua, sizes[i], imm, seed++);
        }
    ok("datagrams of 0 to %u bytes (one, two and three frames) both ways, with and without "
       "immediate", UD_MAX);

    int rc = ud_send(&ua, &ub, ua.ah, UD_MAX + 1, 0, QKEY, 90, 0x390);
    CHECK(rc == EINVAL, "a %u-byte UD send returned %d, expected EINVAL", UD_MAX + 1, rc);
    ok("a %u-byte send is refused with EINVAL", UD_MAX + 1);

    struct ibv_wc wc;
    ud_recv(&ub, 0x300);
    check_rc(ud_send(&ua, &ub, ua.ah, 100, 0, QKEY + 1, 91, 0x391), "ibv_post_send(bad qkey)");
    expect_ud(&a, ua.qp, &wc, 0x391, IBV_WC_SEND, "UD send with a wrong Q_Key");
    quiet_for(&b, 200, "a datagram with the wrong Q_Key");
    check_rc(ud_send(&ua, &ub, ua.ah, 100, 1, QKEY, 92, 0x392), "ibv_post_send(good qkey)");
    expect_ud(&a, ua.qp, &wc, 0x392, IBV_WC_SEND, "UD send after the wrong Q_Key");
    check_recv(&ua, &ub, 100, 1, 92, 0x300, &wc);
    ok("a datagram with the wrong Q_Key is dropped; the buffer takes the next one");

    check_rc(ud_send(&ub, &ua, ub.ah, 50, 0, QKEY, 93, 0x393), "ibv_post_send(no buffer)");
    expect_ud(&b, ub.qp, &wc, 0x393, IBV_WC_SEND, "UD send to a QP without receive buffers");
    quiet_for(&a, 200, "a datagram without a receive buffer");
    ud_recv(&ua, 0x301);
    check_rc(ud_send(&ub, &ua, ub.ah, 60, 0, QKEY, 94, 0x394), "ibv_post_send(after drop)");
    expect_ud(&b, ub.qp, &wc, 0x394, IBV_WC_SEND, "UD send after a drop");
    check_recv(&ub, &ua, 60, 0, 94, 0x301, &wc);
    ok("a datagram without a receive buffer is dropped without a hang");

    /* A reply to the sender of the last datagram, addressed from its completion. */
    struct ibv_ah *reply = ibv_create_ah_from_wc(a.pd, &wc, (struct ibv_grh *)(ua.buf + RECV_AT), 1);
    CHECK(reply, "ibv_create_ah_from_wc: %s", strerror(errno));
    ud_recv(&ub, 0x302);
    check_rc(ud_send(&ua, &ub, reply, 33, 1, QKEY, 95, 0x395), "ibv_post_send(reply)");
    expect_ud(&a, ua.qp, &wc, 0x395, IBV_WC_SEND, "UD reply");
    check_recv(&ua, &ub, 33, 1, 95, 0x302, &wc);
    check_rc(ibv_destroy_ah(reply), "ibv_destroy_ah(reply)");
    ok("a reply through ibv_create_ah_from_wc arrives");

    /* An armed CQ fires for a UD receive. */
    check_rc(ibv_req_notify_cq(b.cq, 0), "ibv_req_notify_cq");
    ud_recv(&ub, 0x303);
    check_rc(ud_send(&ua, &ub, ua.ah, 10, 0, QKEY, 96, 0x396), "ibv_post_send(event)");
    struct pollfd pfd = {.fd = b.channel->fd, .events = POLLIN};
    CHECK(poll(&pfd, 1, WAIT_MS) == 1, "no completion event on %s within %d ms", b.name,
          WAIT_MS);
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    check_rc(ibv_get_cq_event(b.channel, &ev_cq, &ev_ctx), "ibv_get_cq_event");
    CHECK(ev_cq == b.cq, "the event names another CQ");
    ibv_ack_cq_events(ev_cq, 1);
    check_recv(&ua, &ub, 10, 0, 96, 0x303, &wc);
    expect_ud(&a, ua.qp, &wc, 0x396, IBV_WC_SEND, "UD send with an event");
    ok("an armed CQ fires for a UD receive");

    expect_no_wc(&a, "the end");
    expect_no_wc(&b, "the end");
    struct ud *both[] = {&ua, &ub};
    for (int i = 0; i < 2; i++) {
        check_rc(ibv_destroy_ah(both[i]->ah), "ibv_destroy_ah");
        check_rc(ibv_destroy_qp(both[i]->qp), "ibv_destroy_qp(UD)");
        dereg_mr(both[i]->mr);
        free(both[i]->buf);
    }
    pair_close(&a, &b);
    printf("PASS\n");
    return 0;
}
