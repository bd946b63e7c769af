/* UC QPs between bluerdma0 and bluerdma1 in one process (carried as RC on the wire: the
 * card reports no UC packet):
 * - ibv_create_qp(IBV_QPT_UC) starts in RESET, ibv_query_qp names the type and the caps;
 * - connected with UC's masks only (INIT: pkey, port, access; RTR: AV, MTU, dest QPN,
 *   rq_psn; RTS: sq_psn); an RC-only attribute (IBV_QP_TIMEOUT at RTS) is refused with
 *   EINVAL and the QP stays in RTR;
 * - SEND, SEND_WITH_IMM, RDMA WRITE and WRITE_WITH_IMM both ways: completions (opcode,
 *   byte_len, imm, qp_num) and bytes;
 * - RDMA READ and atomics are refused at post time with EINVAL and bad_wr. */
#define _GNU_SOURCE
#include "pair.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF 8192

static struct ibv_qp *uc_qp(struct end *e)
{
    struct ibv_qp_init_attr init = {
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .qp_type = IBV_QPT_UC,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
    };
    struct ibv_qp *qp = ibv_create_qp(e->pd, &init);
    CHECK(qp, "ibv_create_qp(%s, UC): %s", e->name, strerror(errno));
    CHECK(qp->qp_type == IBV_QPT_UC && qp->state == IBV_QPS_RESET, "UC QP type %d state %d",
          qp->qp_type, qp->state);
    struct ibv_qp_attr at;
    struct ibv_qp_init_attr got;
    check_rc(ibv_query_qp(qp, &at, IBV_QP_STATE | IBV_QP_CAP, &got), "ibv_query_qp");
    CHECK(at.qp_state == IBV_QPS_RESET && got.qp_type == IBV_QPT_UC &&
              got.cap.max_send_wr >= 16 && got.cap.max_recv_wr >= 16,
          "query: state %d type %d send_wr %u recv_wr %u", at.qp_state, got.qp_type,
          got.cap.max_send_wr, got.cap.max_recv_wr);
    return qp;
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *to)
{
    int rc = ibv_modify_qp(qp, a, mask);
    CHECK(rc == 0, "ibv_modify_qp(UC -> %s): %d (%s)", to, rc, strerror(rc));
}

/* UC's INIT and RTR on `qp` of `e`, towards `peer`'s QP. */
static void to_rtr(struct end *e, struct ibv_qp *qp, struct end *peer, struct ibv_qp *pqp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
    modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = pqp->qp_num;
    a.rq_psn = 77;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
           "RTR");
    (void)e;
}

static void to_rts(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .sq_psn = 77, .timeout = 14};
    errno = 0;
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT);
    CHECK(rc == EINVAL && qp->state == IBV_QPS_RTR, "UC RTS with IBV_QP_TIMEOUT: %d, state %d",
          rc, qp->state);
    modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
}

/* One request `op` from `from` (QP `qf`, buffer `src`) to `to` (QP `qt`, buffer `dst`). */
static void shot(struct end *from, struct ibv_qp *qf, struct ibv_mr *src, struct end *to,
                 struct ibv_qp *qt, struct ibv_mr *dst, enum ibv_wr_opcode op, uint32_t len,
                 size_t off)
{
    uint8_t *s = src->addr, *d = dst->addr;
    for (uint32_t k = 0; k < len; k++)
        s[k] = (uint8_t)(k * 31 + op + off);
    memset(d, 0, BUF);
    struct ibv_qp *sf = from->qp, *st = to->qp;
    from->qp = qf;
    to->qp = qt;
    int recv = op != IBV_WR_RDMA_WRITE;
    int imm = op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (recv)
        post_recv_wr(to, 50 + op, op == IBV_WR_RDMA_WRITE_WITH_IMM ? NULL : d, BUF,
                     op == IBV_WR_RDMA_WRITE_WITH_IMM ? NULL : dst);
    post_send_wr(from, op, 60 + op, s, len, src, (uintptr_t)d + off, dst->rkey, htonl(0xabc0 + op),
                 IBV_SEND_SIGNALED);
    struct ibv_wc wc;
    enum ibv_wc_opcode sop = (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) ? IBV_WC_SEND
                                                                               : IBV_WC_RDMA_WRITE;
    expect_wc(from, &wc, 60 + op, sop, "UC send side");
    if (recv) {
        enum ibv_wc_opcode rop =
            op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
        expect_wc(to, &wc, 50 + op, rop, "UC receive side");
        CHECK(wc.byte_len == len, "UC op %d: byte_len %u, expected %u", op, wc.byte_len, len);
        CHECK(!imm || ((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabc0u + op),
              "UC op %d: imm %#x flags %#x", op, ntohl(wc.imm_data), wc.wc_flags);
    }
    size_t at = (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) ? 0 : off;
    CHECK(memcmp(d + at, s, len) == 0, "UC op %d: bytes differ", op);
    from->qp = sf;
    to->qp = st;
}

int main(void)
{
    test_start("uc");
    struct end a, b;
    pair_open(&a, &b, NULL);
    struct ibv_qp *qa = uc_qp(&a), *qb = uc_qp(&b);
    ok("ibv_create_qp(IBV_QPT_UC): RESET, query names UC and the caps");
    to_rtr(&a, qa, &b, qb);
    to_rtr(&b, qb, &a, qa);
    to_rts(qa);
    to_rts(qb);
    ok("connected with UC's masks; IBV_QP_TIMEOUT at RTS refused (EINVAL)");
    uint8_t *ab = alloc_buf(BUF, 0), *bb = alloc_buf(BUF, 0);
    struct ibv_mr *am = reg_mr(&a, ab, BUF), *bm = reg_mr(&b, bb, BUF);
    enum ibv_wr_opcode ops[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
                                IBV_WR_RDMA_WRITE_WITH_IMM};
    for (size_t k = 0; k < 4; k++) {
        shot(&a, qa, am, &b, qb, bm, ops[k], 4000 + (uint32_t)k, 3 + k);
        shot(&b, qb, bm, &a, qa, am, ops[k], 17 + (uint32_t)k, 100 + k);
    }
    ok("SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM both ways: completions and bytes");

    struct ibv_sge sge = {.addr = (uintptr_t)ab, .length = 8, .lkey = am->lkey};
    enum ibv_wr_opcode bad_ops[] = {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                                    IBV_WR_ATOMIC_CMP_AND_SWP};
    for (size_t k = 0; k < 3; k++) {
        struct ibv_send_wr wr = {.wr_id = 70, .sg_list = &sge, .num_sge = 1, .opcode = bad_ops[k],
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)bb;
        wr.wr.rdma.rkey = bm->rkey;
        struct ibv_send_wr *bad = NULL;
        int rc = ibv_post_send(qa, &wr, &bad);
        CHECK(rc == EINVAL && bad == &wr, "UC post of opcode %d: %d", bad_ops[k], rc);
    }
    expect_no_wc(&a, "after refused UC posts");
    ok("RDMA READ and atomics on a UC QP: EINVAL, bad_wr");
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    dereg_mr(am);
    dereg_mr(bm);
    free(ab);
    free(bb);
    pair_close(&a, &b);
    printf("uc: PASS\n");
    return 0;
}
