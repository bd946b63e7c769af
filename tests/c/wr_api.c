/* The extended verbs between bluerdma0 and bluerdma1 in one process, through the inline
 * functions of verbs.h (they jump through the stand-in's verbs_context ops and the
 * ibv_qp_ex / ibv_cq_ex function pointers):
 * - ibv_query_device_ex: phys_port_cnt_ex = phys_port_cnt = 1, no ODP, no completion
 *   timestamps, atomic_cap IBV_ATOMIC_HCA;
 * - what the device lacks is refused at creation with EOPNOTSUPP (a CQ with completion
 *   timestamps, an RC QP with ATOMIC_WRITE, a UD QP with RDMA WRITE), and ibv_qp_to_qp_ex of a
 *   plain QP is NULL;
 * - one ibv_wr_* batch on an RC QP: WRITE from an SGE list, WRITE_WITH_IMM, SEND of inline
 *   data from a buffer list, SEND_WITH_IMM, READ; the bytes land where they should, the
 *   sender's completions (ibv_start_poll / ibv_next_poll / ibv_end_poll) come in order
 *   with the right wr_id, opcode, byte_len and qp_num, unsignaled ones give none; the
 *   receiver's show opcode, byte_len, imm_data and IBV_WC_WITH_IMM;
 * - an extended CQ on a completion channel: ibv_req_notify_cq on ibv_cq_ex_to_cq, then
 *   ibv_get_cq_event gives that CQ; ibv_poll_cq works on it too;
 * - a batch with a mistake (too many SGEs; an atomic on a QP not made for it) posts nothing
 *   and ibv_wr_complete returns the errno; ibv_wr_abort drops a batch;
 * - ibv_wr_bind_mw of a type-2 window, then the peer's ibv_wr_send_inv of its rkey: the
 *   receive shows IBV_WC_WITH_INV and ibv_wc_read_invalidated_rkey gives the rkey;
 * - a UD QP made with ibv_create_qp_ex: ibv_wr_send_imm with ibv_wr_set_ud_addr and inline
 *   data reaches the other side (IBV_WC_GRH, src_qp, imm_data). */
#define _GNU_SOURCE
#include "pair.h"
#include "verify.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUF (256 * 1024)
#define QKEY 0x22222222u

struct xend {
    struct end *e;
    struct ibv_cq_ex *cq;
    struct ibv_qp *qp;
    struct ibv_qp_ex *qpx;
    struct ibv_mr *mr;
    uint8_t *buf;
};

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* One completion of the extended CQ, as the read functions give it. */
struct xwc {
    enum ibv_wc_status status;
    uint64_t wr_id;
    enum ibv_wc_opcode opcode;
    uint32_t byte_len, qp_num, src_qp, imm;
    unsigned wc_flags;
};

static void read_wc(struct ibv_cq_ex *cq, struct xwc *w)
{
    w->status = cq->status;
    w->wr_id = cq->wr_id;
    w->opcode = ibv_wc_read_opcode(cq);
    w->byte_len = ibv_wc_read_byte_len(cq);
    w->qp_num = ibv_wc_read_qp_num(cq);
    w->src_qp = ibv_wc_read_src_qp(cq);
    w->wc_flags = ibv_wc_read_wc_flags(cq);
    w->imm = w->wc_flags & IBV_WC_WITH_INV ? ibv_wc_read_invalidated_rkey(cq)
                                           : ibv_wc_read_imm_data(cq);
    CHECK(ibv_wc_read_vendor_err(cq) == 0, "vendor_err %u", ibv_wc_read_vendor_err(cq));
}

/* Polls `n` completions of `cq` with start_poll / next_poll / end_poll into `out`; fails
 * after WAIT_MS naming `what`. */
static void poll_ex(struct ibv_cq_ex *cq, struct xwc *out, int n, const char *what)
{
    long long deadline = now_ms() + WAIT_MS;
    struct ibv_poll_cq_attr attr = {.comp_mask = 0};
    int rc;
    while ((rc = ibv_start_poll(cq, &attr)) == ENOENT)
        CHECK(now_ms() < deadline, "%s: no completion within %d ms", what, WAIT_MS);
    CHECK(rc == 0, "%s: ibv_start_poll returned %d (%s)", what, rc, strerror(rc));
    read_wc(cq, &out[0]);
    for (int k = 1; k < n; k++) {
        while ((rc = ibv_next_poll(cq)) == ENOENT)
            CHECK(now_ms() < deadline, "%s: %d of %d completions within %d ms", what, k, n,
                  WAIT_MS);
        CHECK(rc == 0, "%s: ibv_next_poll returned %d (%s)", what, rc, strerror(rc));
        read_wc(cq, &out[k]);
    }
    ibv_end_poll(cq);
}

/* byte_len means nothing in the sender's completion of a SEND or WRITE (verbs.h): ANY. */
#define ANY UINT32_MAX

static void expect_xwc(const struct xwc *w, uint64_t wr_id, enum ibv_wc_opcode op,
                       uint32_t byte_len, uint32_t qp_num, const char *what)
{
    CHECK(w->status == IBV_WC_SUCCESS, "%s: status %s (%d)", what, ibv_wc_status_str(w->status),
          w->status);
    CHECK(w->wr_id == wr_id, "%s: wr_id %#llx, expected %#llx", what,
          (unsigned long long)w->wr_id, (unsigned long long)wr_id);
    CHECK(w->opcode == op, "%s: opcode %d, expected %d", what, w->opcode, op);
    CHECK(byte_len == ANY || w->byte_len == byte_len, "%s: byte_len %u, expected %u", what, w->byte_len, byte_len);
    CHECK(w->qp_num == qp_num, "%s: qp_num %#x, expected %#x", what, w->qp_num, qp_num);
}

static void expect_empty(struct ibv_cq_ex *cq, const char *what)
{
    struct ibv_poll_cq_attr attr = {.comp_mask = 0};
    int rc = ibv_start_poll(cq, &attr);
    if (rc == 0) {
        struct xwc w;
        read_wc(cq, &w);
        ibv_end_poll(cq);
        fail("%s: an unexpected completion (wr_id %#llx, opcode %d, status %d)", what,
             (unsigned long long)w.wr_id, w.opcode, w.status);
    }
    CHECK(rc == ENOENT, "%s: ibv_start_poll returned %d, expected ENOENT", what, rc);
}

static struct ibv_cq_ex *new_cq_ex(struct end *e, struct ibv_comp_channel *ch)
{
    struct ibv_cq_init_attr_ex ca = {
        .cqe = 256, .cq_context = e, .channel = ch, .wc_flags = IBV_WC_STANDARD_FLAGS};
    struct ibv_cq_ex *cq = ibv_create_cq_ex(e->ctx, &ca);
    CHECK(cq, "ibv_create_cq_ex(%s, IBV_WC_STANDARD_FLAGS): %s", e->name, strerror(errno));
    return cq;
}

static struct ibv_qp *new_qp_ex(struct end *e, struct ibv_cq_ex *cq, enum ibv_qp_type type,
                                uint64_t ops)
{
    struct ibv_qp_init_attr_ex ia = {
        .send_cq = ibv_cq_ex_to_cq(cq),
        .recv_cq = ibv_cq_ex_to_cq(cq),
        .qp_type = type,
        .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2, .max_recv_sge = 1,
                .max_inline_data = 64},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = e->pd,
        .send_ops_flags = ops,
    };
    return ibv_create_qp_ex(e->ctx, &ia);
}

static void xend_open(struct xend *x, struct end *e, struct ibv_comp_channel *ch)
{
    x->e = e;
    x->cq = new_cq_ex(e, ch);
    x->qp = new_qp_ex(e, x->cq, IBV_QPT_RC,
                      IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                          IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                          IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_BIND_MW |
                          IBV_QP_EX_WITH_SEND_WITH_INV);
    CHECK(x->qp, "ibv_create_qp_ex(%s, RC, seven send ops): %s", e->name, strerror(errno));
    x->qpx = ibv_qp_to_qp_ex(x->qp);
    CHECK(x->qpx && (void *)x->qpx == (void *)x->qp, "ibv_qp_to_qp_ex(%s) gave %p for %p",
          e->name, (void *)x->qpx, (void *)x->qp);
    x->buf = alloc_buf(BUF, 0);
    x->mr = reg_mr(e, x->buf, BUF);
}

static void device_ex(struct end *e)
{
    struct ibv_device_attr_ex ax;
    memset(&ax, 0xAB, sizeof ax);
    check_rc(ibv_query_device_ex(e->ctx, NULL, &ax), "ibv_query_device_ex");
    CHECK(ax.orig_attr.phys_port_cnt == 1 && ax.phys_port_cnt_ex == 1,
          "phys_port_cnt %u, phys_port_cnt_ex %u (expected 1 and 1)", ax.orig_attr.phys_port_cnt,
          ax.phys_port_cnt_ex);
    CHECK(ax.odp_caps.general_caps == 0 && ax.completion_timestamp_mask == 0 &&
              ax.tso_caps.max_tso == 0 && ax.max_dm_size == 0,
          "extended caps the device lacks are not zero");
    CHECK(ax.orig_attr.atomic_cap == IBV_ATOMIC_HCA, "atomic_cap %d", ax.orig_attr.atomic_cap);
    CHECK(ax.device_cap_flags_ex == ax.orig_attr.device_cap_flags,
          "device_cap_flags_ex %#llx, device_cap_flags %#x",
          (unsigned long long)ax.device_cap_flags_ex, ax.orig_attr.device_cap_flags);
    struct ibv_query_device_ex_input in = {.comp_mask = 1};
    CHECK(ibv_query_device_ex(e->ctx, &in, &ax) == EINVAL, "an input comp_mask is refused");
    ok("ibv_query_device_ex(%s): 1 port, no ODP, no timestamps, atomics HCA", e->name);
}

static void refusals(struct end *e)
{
    struct ibv_cq_init_attr_ex ca = {
        .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
    errno = 0;
    expect_errno(ibv_create_cq_ex(e->ctx, &ca) ? 0 : -1, EOPNOTSUPP,
                 "ibv_create_cq_ex with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP");
    struct ibv_cq_ex *cq = new_cq_ex(e, NULL);
    errno = 0;
    struct ibv_qp *qp = new_qp_ex(e, cq, IBV_QPT_RC,
                                  IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE);
    expect_errno(qp ? 0 : -1, EOPNOTSUPP, "ibv_create_qp_ex(RC) with ATOMIC_WRITE");
    errno = 0;
    qp = new_qp_ex(e, cq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
    expect_errno(qp ? 0 : -1, EOPNOTSUPP, "ibv_create_qp_ex(UD) with RDMA_WRITE");
    CHECK(ibv_qp_to_qp_ex(e->qp) == NULL, "ibv_qp_to_qp_ex of an ibv_create_qp QP is not NULL");
    check_rc(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), "ibv_destroy_cq(extended)");
    ok("refused at creation: timestamps, ATOMIC_WRITE, WRITE on UD; plain QPs have no ibv_qp_ex");
}

static void post_recv(struct xend *x, uint64_t wr_id, size_t off, uint32_t len)
{
    struct ibv_sge s = {.addr = (uintptr_t)x->buf + off, .length = len, .lkey = x->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = len ? &s : NULL, .num_sge = len ? 1 : 0};
    struct ibv_recv_wr *bad;
    check_rc(ibv_post_recv(x->qp, &wr, &bad), "ibv_post_recv");
}

/* Offsets in each buffer. */
#define W_SRC 0           /* WRITE: two SGEs of 3000 and 5000 bytes from here */
#define W_DST 16384       /* ... to here on the target */
#define WI_SRC 32768      /* WRITE_WITH_IMM: 4096 bytes */
#define WI_DST 40960
#define S_DST 65536       /* SEND (inline) lands here */
#define SI_SRC 69632      /* SEND_WITH_IMM: 4096 bytes */
#define SI_DST 73728
#define R_SRC 98304       /* READ: 65536 bytes from the target's R_SRC to our R_DST */
#define R_DST 163840

static void one_batch(struct xend *a, struct xend *b)
{
    pattern_fill(a->buf + W_SRC, 8000, 1);
    pattern_fill(a->buf + WI_SRC, 4096, 2);
    pattern_fill(a->buf + SI_SRC, 4096, 4);
    pattern_fill(b->buf + R_SRC, 65536, 5);
    post_recv(b, 0xB1, WI_DST, 0); /* WRITE_WITH_IMM takes a receive, no buffer */
    post_recv(b, 0xB2, S_DST, 4096);
    post_recv(b, 0xB3, SI_DST, 4096);

    struct ibv_qp_ex *q = a->qpx;
    uint64_t raddr = (uintptr_t)b->buf;
    uint32_t rkey = b->mr->rkey, lkey = a->mr->lkey;
    const char inline_a[] = "inline ", inline_b[] = "data, two buffers";
    ibv_wr_start(q);
    q->wr_id = 0xA1;
    q->wr_flags = 0; /* unsignaled: no completion */
    ibv_wr_rdma_write(q, rkey, raddr + W_DST);
    struct ibv_sge two[2] = {{(uintptr_t)a->buf + W_SRC, 3000, lkey},
                             {(uintptr_t)a->buf + W_SRC + 3000, 5000, lkey}};
    ibv_wr_set_sge_list(q, 2, two);
    memset(two, 0, sizeof two); /* the list was copied */
    q->wr_id = 0xA2;
    q->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write_imm(q, rkey, raddr + WI_DST, htonl(0xC0FFEE01));
    ibv_wr_set_sge(q, lkey, (uintptr_t)a->buf + WI_SRC, 4096);
    q->wr_id = 0xA3;
    ibv_wr_send(q);
    struct ibv_data_buf bufs[2] = {{(void *)inline_a, strlen(inline_a)},
                                   {(void *)inline_b, strlen(inline_b)}};
    ibv_wr_set_inline_data_list(q, 2, bufs);
    q->wr_id = 0xA4;
    ibv_wr_send_imm(q, htonl(0xC0FFEE02));
    ibv_wr_set_sge(q, lkey, (uintptr_t)a->buf + SI_SRC, 4096);
    q->wr_id = 0xA5;
    ibv_wr_rdma_read(q, rkey, raddr + R_SRC);
    ibv_wr_set_sge(q, lkey, (uintptr_t)a->buf + R_DST, 65536);
    check_rc(ibv_wr_complete(q), "ibv_wr_complete(5 requests)");

    struct xwc w[4];
    uint32_t an = a->qp->qp_num, bn = b->qp->qp_num;
    poll_ex(a->cq, w, 4, "the sender's completions");
    expect_xwc(&w[0], 0xA2, IBV_WC_RDMA_WRITE, ANY, an, "WRITE_WITH_IMM (sender)");
    expect_xwc(&w[1], 0xA3, IBV_WC_SEND, ANY, an, "inline SEND (sender)");
    expect_xwc(&w[2], 0xA4, IBV_WC_SEND, ANY, an, "SEND_WITH_IMM (sender)");
    expect_xwc(&w[3], 0xA5, IBV_WC_RDMA_READ, 65536, an, "READ (sender)");
    expect_empty(a->cq, "after the sender's four signaled requests");

    poll_ex(b->cq, w, 3, "the receiver's completions");
    expect_xwc(&w[0], 0xB1, IBV_WC_RECV_RDMA_WITH_IMM, 4096, bn, "WRITE_WITH_IMM (receiver)");
    CHECK((w[0].wc_flags & IBV_WC_WITH_IMM) && w[0].imm == htonl(0xC0FFEE01),
          "WRITE_WITH_IMM: wc_flags %#x, imm %#x", w[0].wc_flags, ntohl(w[0].imm));
    expect_xwc(&w[1], 0xB2, IBV_WC_RECV, 24, bn, "inline SEND (receiver)");
    CHECK(!(w[1].wc_flags & IBV_WC_WITH_IMM), "SEND: IBV_WC_WITH_IMM is set");
    expect_xwc(&w[2], 0xB3, IBV_WC_RECV, 4096, bn, "SEND_WITH_IMM (receiver)");
    CHECK((w[2].wc_flags & IBV_WC_WITH_IMM) && w[2].imm == htonl(0xC0FFEE02),
          "SEND_WITH_IMM: wc_flags %#x, imm %#x", w[2].wc_flags, ntohl(w[2].imm));

    size_t bad = pattern_check(b->buf + W_DST, 8000, 1, "WRITE from two SGEs") +
                 pattern_check(b->buf + WI_DST, 4096, 2, "WRITE_WITH_IMM") +
                 hexdiff("inline data, two buffers", b->buf + S_DST, 24, "inline SEND") +
                 pattern_check(b->buf + SI_DST, 4096, 4, "SEND_WITH_IMM") +
                 pattern_check(a->buf + R_DST, 65536, 5, "READ");
    CHECK(bad == 0, "%zu bytes differ after the batch", bad);
    ok("one ibv_wr_* batch: WRITE (SGE list, unsignaled), WRITE_WITH_IMM, inline SEND, "
       "SEND_WITH_IMM, READ; completions and bytes as posted");
}

static void events(struct xend *a, struct xend *b)
{
    struct ibv_cq *cq = ibv_cq_ex_to_cq(b->cq);
    check_rc(ibv_req_notify_cq(cq, 0), "ibv_req_notify_cq(extended CQ)");
    post_recv(b, 0xB4, S_DST, 64);
    ibv_wr_start(a->qpx);
    a->qpx->wr_id = 0xA6;
    a->qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(a->qpx);
    ibv_wr_set_inline_data(a->qpx, "event", 5);
    check_rc(ibv_wr_complete(a->qpx), "ibv_wr_complete(SEND)");
    struct ibv_cq *got;
    void *cq_ctx;
    check_rc(ibv_get_cq_event(b->e->channel, &got, &cq_ctx), "ibv_get_cq_event");
    CHECK(got == cq && cq_ctx == b->e, "the event names CQ %p (context %p), expected %p (%p)",
          (void *)got, cq_ctx, (void *)cq, (void *)b->e);
    ibv_ack_cq_events(got, 1);
    /* ibv_poll_cq works on an extended CQ too. */
    struct ibv_wc wc;
    long long deadline = now_ms() + WAIT_MS;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
        CHECK(now_ms() < deadline, "no completion after the event");
    CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 0xB4 && wc.byte_len == 5,
          "ibv_poll_cq on the extended CQ: %d, %s", n, wc_str(&wc));
    struct xwc w;
    poll_ex(a->cq, &w, 1, "the SEND's completion");
    expect_xwc(&w, 0xA6, IBV_WC_SEND, ANY, a->qp->qp_num, "SEND after ibv_req_notify_cq");
    ok("an extended CQ on a channel: ibv_req_notify_cq, ibv_get_cq_event, ibv_poll_cq");
}

static void mistakes(struct xend *a, struct xend *b)
{
    struct ibv_qp_ex *q = a->qpx;
    struct ibv_sge three[3] = {{(uintptr_t)a->buf, 8, a->mr->lkey},
                               {(uintptr_t)a->buf + 8, 8, a->mr->lkey},
                               {(uintptr_t)a->buf + 16, 8, a->mr->lkey}};
    ibv_wr_start(q);
    q->wr_id = 0xE1;
    q->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(q, b->mr->rkey, (uintptr_t)b->buf);
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 8);
    q->wr_id = 0xE2;
    ibv_wr_rdma_write(q, b->mr->rkey, (uintptr_t)b->buf);
    ibv_wr_set_sge_list(q, 3, three); /* the QP was made for 2 */
    int rc = ibv_wr_complete(q);
    CHECK(rc == EINVAL, "ibv_wr_complete after 3 SGEs on a 2-SGE QP returned %d", rc);

    ibv_wr_start(q);
    q->wr_id = 0xE3;
    ibv_wr_atomic_fetch_add(q, b->mr->rkey, (uintptr_t)b->buf, 1);
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 8);
    rc = ibv_wr_complete(q);
    CHECK(rc == EOPNOTSUPP, "ibv_wr_complete after an atomic the QP was not made for returned %d",
          rc);

    ibv_wr_start(q);
    q->wr_id = 0xE4;
    ibv_wr_rdma_write(q, b->mr->rkey, (uintptr_t)b->buf);
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 8);
    ibv_wr_abort(q);
    /* Nothing of the three batches was posted: a signaled WRITE now completes first. */
    ibv_wr_start(q);
    q->wr_id = 0xE5;
    ibv_wr_rdma_write(q, b->mr->rkey, (uintptr_t)b->buf);
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 8);
    check_rc(ibv_wr_complete(q), "ibv_wr_complete(WRITE)");
    struct xwc w;
    poll_ex(a->cq, &w, 1, "the WRITE after the refused batches");
    expect_xwc(&w, 0xE5, IBV_WC_RDMA_WRITE, ANY, a->qp->qp_num, "WRITE after refused batches");
    expect_empty(a->cq, "after the refused batches");
    ok("a batch with too many SGEs or an atomic posts nothing (EINVAL, EOPNOTSUPP); "
       "ibv_wr_abort drops one");
}

static struct ibv_qp *ud_qp(struct end *e, struct ibv_cq_ex *cq)
{
    struct ibv_qp *qp = new_qp_ex(e, cq, IBV_QPT_UD,
                                  IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
    CHECK(qp, "ibv_create_qp_ex(%s, UD): %s", e->name, strerror(errno));
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
    check_rc(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
             "ibv_modify_qp(UD, INIT)");
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
    check_rc(ibv_modify_qp(qp, &a, IBV_QP_STATE), "ibv_modify_qp(UD, RTR)");
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .sq_psn = 7};
    check_rc(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "ibv_modify_qp(UD, RTS)");
    return qp;
}

static void ud(struct xend *a, struct xend *b)
{
    struct ibv_qp *qa = ud_qp(a->e, a->cq), *qb = ud_qp(b->e, b->cq);
    struct ibv_ah_attr ah_attr = {.is_global = 1, .port_num = 1,
                                  .grh = {.dgid = b->e->gid, .hop_limit = 1}};
    struct ibv_ah *ah = ibv_create_ah(a->e->pd, &ah_attr);
    CHECK(ah, "ibv_create_ah: %s", strerror(errno));
    struct ibv_sge s = {(uintptr_t)b->buf, 40 + 64, b->mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 0xD1, .sg_list = &s, .num_sge = 1}, *bad;
    check_rc(ibv_post_recv(qb, &rwr, &bad), "ibv_post_recv(UD)");

    struct ibv_qp_ex *q = ibv_qp_to_qp_ex(qa);
    CHECK(q, "ibv_qp_to_qp_ex(UD): NULL");
    ibv_wr_start(q);
    q->wr_id = 0xD0;
    q->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_read(q, 0, 0); /* a UD QP does not read */
    ibv_wr_set_ud_addr(q, ah, qb->qp_num, QKEY);
    CHECK(ibv_wr_complete(q) == EOPNOTSUPP, "a READ on a UD QP is not refused");
    ibv_wr_start(q);
    ibv_wr_send_imm(q, htonl(0xDA7A));
    ibv_wr_set_inline_data(q, "a datagram", 10);
    ibv_wr_set_ud_addr(q, ah, qb->qp_num, QKEY);
    check_rc(ibv_wr_complete(q), "ibv_wr_complete(UD SEND_WITH_IMM)");
    struct xwc w;
    poll_ex(a->cq, &w, 1, "the datagram's send");
    expect_xwc(&w, 0xD0, IBV_WC_SEND, ANY, qa->qp_num, "UD SEND_WITH_IMM (sender)");
    poll_ex(b->cq, &w, 1, "the datagram");
    expect_xwc(&w, 0xD1, IBV_WC_RECV, 40 + 10, qb->qp_num, "UD SEND_WITH_IMM (receiver)");
    CHECK((w.wc_flags & IBV_WC_GRH) && (w.wc_flags & IBV_WC_WITH_IMM) &&
              w.imm == htonl(0xDA7A) && w.src_qp == qa->qp_num,
          "UD receive: wc_flags %#x, imm %#x, src_qp %#x (expected %#x)", w.wc_flags,
          ntohl(w.imm), w.src_qp, qa->qp_num);
    CHECK(hexdiff("a datagram", b->buf + 40, 10, "UD payload") == 0, "the datagram differs");
    check_rc(ibv_destroy_ah(ah), "ibv_destroy_ah");
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp(UD)");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp(UD)");
    ok("UD over ibv_wr_*: SEND_WITH_IMM of inline data with ibv_wr_set_ud_addr");
}

static void send_inv(struct xend *a, struct xend *b)
{
    uint8_t *t = alloc_buf(4096, 0);
    struct ibv_mr *mr =
        ibv_reg_mr(b->e->pd, t, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(mr, "ibv_reg_mr(MW_BIND): %s", strerror(errno));
    struct ibv_mw *mw = ibv_alloc_mw(b->e->pd, IBV_MW_TYPE_2);
    CHECK(mw, "ibv_alloc_mw(type 2): %s", strerror(errno));
    uint32_t rkey = ibv_inc_rkey(mw->rkey);
    struct ibv_mw_bind_info info = {.mr = mr, .addr = (uintptr_t)t, .length = 4096,
                                    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
    struct xwc w;
    ibv_wr_start(b->qpx);
    b->qpx->wr_id = 0xB8;
    b->qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_bind_mw(b->qpx, mw, rkey, &info);
    check_rc(ibv_wr_complete(b->qpx), "ibv_wr_complete(bind_mw)");
    poll_ex(b->cq, &w, 1, "ibv_wr_bind_mw");
    expect_xwc(&w, 0xB8, IBV_WC_BIND_MW, ANY, b->qp->qp_num, "ibv_wr_bind_mw");

    post_recv(b, 0xB9, S_DST, 64);
    ibv_wr_start(a->qpx);
    a->qpx->wr_id = 0xA9;
    a->qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_inv(a->qpx, rkey);
    ibv_wr_set_inline_data(a->qpx, "invalidate", 10);
    check_rc(ibv_wr_complete(a->qpx), "ibv_wr_complete(send_inv)");
    poll_ex(a->cq, &w, 1, "ibv_wr_send_inv (sender)");
    expect_xwc(&w, 0xA9, IBV_WC_SEND, ANY, a->qp->qp_num, "ibv_wr_send_inv (sender)");
    poll_ex(b->cq, &w, 1, "ibv_wr_send_inv (receiver)");
    expect_xwc(&w, 0xB9, IBV_WC_RECV, 10, b->qp->qp_num, "ibv_wr_send_inv (receiver)");
    CHECK((w.wc_flags & IBV_WC_WITH_INV) && !(w.wc_flags & IBV_WC_WITH_IMM) && w.imm == rkey,
          "ibv_wr_send_inv: wc_flags %#x, invalidated rkey %#x (expected %#x)", w.wc_flags,
          w.imm, rkey);
    CHECK(memcmp(b->buf + S_DST, "invalidate", 10) == 0, "ibv_wr_send_inv: bytes");
    check_rc(ibv_dealloc_mw(mw), "ibv_dealloc_mw");
    dereg_mr(mr);
    free(t);
    ok("ibv_wr_bind_mw, then the peer's ibv_wr_send_inv: IBV_WC_WITH_INV, "
       "ibv_wc_read_invalidated_rkey %#x",
       rkey);
}

static void xend_close(struct xend *x)
{
    check_rc(ibv_destroy_qp(x->qp), "ibv_destroy_qp(extended)");
    check_rc(ibv_destroy_cq(ibv_cq_ex_to_cq(x->cq)), "ibv_destroy_cq(extended)");
    dereg_mr(x->mr);
    free(x->buf);
}

int main(void)
{
    test_start("wr_api");
    struct end ea, eb;
    struct pair_opts o = {.channel = 1};
    pair_open(&ea, &eb, &o);
    device_ex(&ea);
    refusals(&ea);
    struct xend a, b;
    xend_open(&a, &ea, NULL);
    xend_open(&b, &eb, eb.channel);
    pair_connect(&ea, a.qp, &eb, b.qp);
    one_batch(&a, &b);
    events(&a, &b);
    send_inv(&a, &b);
    mistakes(&a, &b);
    ud(&a, &b);
    xend_close(&a);
    xend_close(&b);
    pair_close(&ea, &eb);
    printf("PASS wr_api\n");
    return 0;
}
