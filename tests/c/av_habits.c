/* The address-vector habits of the programs written for the seed driver, which this
 * library accepts by default:
 * (a) modify_qp to RTR with ah_attr.is_global = 0 and the peer's IPv4-mapped GID in
 *     ah_attr.grh.dgid (the GID is used);
 * (b) IBV_QP_AV in the RTR -> RTS mask with an all-zero address vector (it is ignored).
 * QPs connected that way carry WRITEs both ways, every byte checked. With
 * BLUERDMA_STRICT_AV=1 both habits fail with EINVAL, as on rdma-core's RoCE devices, and a
 * QP without a GID in its address vector is refused as before. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define LEN 10000

static struct ibv_qp *new_rc(struct end *e)
{
    struct ibv_qp_init_attr init = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 8, .max_recv_wr = 8,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(e->pd, &init);
    CHECK(qp, "ibv_create_qp: %s", strerror(errno));
    return qp;
}

static void to_init(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_REMOTE_READ};
    check_rc(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS),
             "ibv_modify_qp(INIT)");
}

/* RTR the seed's way: no GRH flag, the GID filled in anyway. */
static int rtr_not_global(struct ibv_qp *qp, const struct end *peer, struct ibv_qp *pqp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                            .dest_qp_num = pqp->qp_num, .rq_psn = 0, .max_dest_rd_atomic = 1,
                            .min_rnr_timer = 12};
    a.ah_attr.is_global = 0;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.port_num = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

/* RTS the seed's way: IBV_QP_AV in the mask, the address vector all zero. */
static int rts_with_zero_av(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                            .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1};
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_TIMEOUT |
                                     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                     IBV_QP_MAX_QP_RD_ATOMIC);
}

static void write_and_check(struct end *from, struct ibv_qp *qp, struct ibv_mr *src,
                            struct ibv_mr *dst, uint32_t seed)
{
    pattern_fill(src->addr, LEN, seed);
    memset(dst->addr, 0, LEN);
    struct ibv_qp *saved = from->qp;
    from->qp = qp;
    post_send_wr(from, IBV_WR_RDMA_WRITE, seed, src->addr, LEN, src, (uintptr_t)dst->addr,
                 dst->rkey, 0, IBV_SEND_SIGNALED);
    struct ibv_wc wc;
    expect_wc(from, &wc, seed, IBV_WC_RDMA_WRITE, "a WRITE on QPs connected the seed's way");
    from->qp = saved;
    CHECK(pattern_check(dst->addr, LEN, seed, "the WRITE's target") == 0, "the data differs");
}

int main(void)
{
    test_start("av_habits");
    struct end a, b;
    struct ibv_mr *amr, *bmr;
    pair_open_mrs(&a, &b, NULL, LEN, &amr, &bmr);

    struct ibv_qp *qa = new_rc(&a), *qb = new_rc(&b);
    to_init(qa);
    to_init(qb);
    check_rc(rtr_not_global(qa, &b, qb), "RTR with is_global = 0 and an IPv4-mapped GID");
    check_rc(rtr_not_global(qb, &a, qa), "RTR with is_global = 0 and an IPv4-mapped GID");
    check_rc(rts_with_zero_av(qa), "RTS with IBV_QP_AV and an all-zero GID");
    check_rc(rts_with_zero_av(qb), "RTS with IBV_QP_AV and an all-zero GID");
    ok("QPs connected with is_global = 0 and a zero AV on RTR -> RTS");
    write_and_check(&a, qa, amr, bmr, 1);
    write_and_check(&b, qb, bmr, amr, 2);
    ok("WRITEs both ways over them, every byte checked");
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");

    setenv("BLUERDMA_STRICT_AV", "1", 1);
    qa = new_rc(&a);
    qb = new_rc(&b);
    to_init(qa);
    expect_errno(rtr_not_global(qa, &b, qb), EINVAL, "strict: RTR with is_global = 0");
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                             .dest_qp_num = qb->qp_num, .max_dest_rd_atomic = 1,
                             .min_rnr_timer = 12};
    at.ah_attr.is_global = 1;
    at.ah_attr.grh.dgid = b.gid;
    at.ah_attr.port_num = 1;
    check_rc(ibv_modify_qp(qa, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                        IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
             "strict: RTR with a GRH");
    expect_errno(rts_with_zero_av(qa), EINVAL, "strict: RTS with IBV_QP_AV and a zero GID");
    ok("BLUERDMA_STRICT_AV=1 refuses both habits with EINVAL");
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    unsetenv("BLUERDMA_STRICT_AV");

    pair_finish(&a, &b, amr, bmr);
    printf("PASS av_habits\n");
    return 0;
}
