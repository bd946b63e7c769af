/* No QP of a shared receive queue starves while the pool has WRs. bluerdma1 has four QPs
 * on one SRQ of 8 WRs (fewer than the 16 a QP may hold); bluerdma0 sends 40 messages on
 * the last of the four only, and the receiver reposts each buffer to the SRQ as it
 * completes. Every SEND completes and arrives intact: the WRs go to the QP that needs them,
 * not to the first QP attached (which used to take all 8 while the last one's sender waited
 * for a receive WR forever, as ibv_srq_pingpong -q 64 did). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define SRQ_WR 8
#define QPS 4
#define SENDS 40
#define SLOT 1024

int main(void)
{
    test_start("srq_starve");
    struct end a, b;
    struct pair_opts o = {.srq_wr = SRQ_WR, .max_send_wr = 64};
    pair_open(&a, &b, &o);
    struct ibv_qp *aq[QPS], *bq[QPS];
    aq[0] = a.qp;
    bq[0] = b.qp;
    for (int i = 1; i < QPS; i++)
        pair_extra_qps(&a, &b, &aq[i], &bq[i]);

    uint8_t *sbuf = alloc_buf(SENDS * SLOT, 0), *rbuf = alloc_buf(SRQ_WR * SLOT, 0);
    struct ibv_mr *smr = reg_mr(&a, sbuf, SENDS * SLOT), *rmr = reg_mr(&b, rbuf, SRQ_WR * SLOT);
    for (uint32_t i = 0; i < SRQ_WR; i++) {
        struct ibv_sge s = {(uintptr_t)(rbuf + i * SLOT), SLOT, rmr->lkey};
        struct ibv_recv_wr w = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad;
        check_rc(ibv_post_srq_recv(b.srq, &w, &bad), "ibv_post_srq_recv");
    }
    struct ibv_qp *last = aq[QPS - 1];
    for (uint32_t k = 0; k < SENDS; k++) {
        pattern_fill(sbuf + k * SLOT, 100 + k, k);
        struct ibv_sge s = {(uintptr_t)(sbuf + k * SLOT), 100 + k, smr->lkey};
        struct ibv_send_wr w = {.wr_id = k, .sg_list = &s, .num_sge = 1,
                                .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
        check_rc(ibv_post_send(last, &w, &bad), "ibv_post_send on the last QP");
    }
    struct ibv_wc wc;
    for (uint32_t k = 0; k < SENDS; k++) {
        poll_one(&b, &wc, "a receive on the last QP");
        CHECK(wc.status == IBV_WC_SUCCESS && wc.qp_num == bq[QPS - 1]->qp_num,
              "receive #%u: %s", k, wc_str(&wc));
        uint8_t *dst = rbuf + wc.wr_id * SLOT;
        CHECK(wc.byte_len == 100 + k && pattern_check(dst, 100 + k, k, "a SEND") == 0,
              "receive #%u: byte_len %u or data wrong", k, wc.byte_len);
        struct ibv_sge s = {(uintptr_t)dst, SLOT, rmr->lkey};
        struct ibv_recv_wr w = {.wr_id = wc.wr_id, .sg_list = &s, .num_sge = 1}, *bad;
        check_rc(ibv_post_srq_recv(b.srq, &w, &bad), "ibv_post_srq_recv (repost)");
    }
    for (uint32_t k = 0; k < SENDS; k++) {
        poll_one(&a, &wc, "a SEND completion");
        CHECK(wc.status == IBV_WC_SUCCESS, "SEND: %s", wc_str(&wc));
    }
    ok("%d SENDs on the last of %d QPs through an SRQ of %d WRs", SENDS, QPS, SRQ_WR);
    for (int i = 1; i < QPS; i++) {
        check_rc(ibv_destroy_qp(aq[i]), "ibv_destroy_qp");
        check_rc(ibv_destroy_qp(bq[i]), "ibv_destroy_qp");
    }
    dereg_mr(smr);
    dereg_mr(rmr);
    free(sbuf);
    free(rbuf);
    pair_close(&a, &b);
    printf("PASS srq_starve\n");
    return 0;
}
