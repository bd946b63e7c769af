/* A shared receive queue: bluerdma1's two QPs take their receive WRs from one SRQ of 48
 * WRs, fewer than the 300 SENDs bluerdma0 sends over its two QPs (interleaved, sizes 1 B to
 * 8 KiB). The receiver polls, checks each message against the pattern of the SEND it
 * belongs to (wc.qp_num says which QP, the SRQ hands WRs out in posting order across
 * both), and reposts the buffer to the SRQ, as an application does. Every SEND completes
 * (rnr_retry 7: a SEND that finds no WR waits), every byte is checked, no completion is
 * left over, and ibv_post_recv on a QP of the SRQ is refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define SRQ_WR 48
#define SENDS 300
#define SLOT 8192
#define CANARY 0x3C

static uint32_t len_of(uint32_t k) { return 1 + (k * 2654435761u) % SLOT; }

int main(void)
{
    test_start("srq");
    struct end a, b;
    struct pair_opts o = {.srq_wr = SRQ_WR, .max_send_wr = 512};
    pair_open(&a, &b, &o);
    CHECK(b.qp->srq == b.srq, "the QP does not name its SRQ");
    struct ibv_qp *a2, *b2;
    pair_extra_qps(&a, &b, &a2, &b2);
    struct ibv_qp *aq[2] = {a.qp, a2}, *bq[2] = {b.qp, b2};

    uint8_t *sbuf = alloc_buf((size_t)SENDS * SLOT, 0);
    uint8_t *rbuf = alloc_buf((size_t)SRQ_WR * SLOT, CANARY);
    struct ibv_mr *smr = reg_mr(&a, sbuf, (size_t)SENDS * SLOT);
    struct ibv_mr *rmr = reg_mr(&b, rbuf, (size_t)SRQ_WR * SLOT);

    struct ibv_srq_attr sattr;
    check_rc(ibv_query_srq(b.srq, &sattr), "ibv_query_srq");
    CHECK(sattr.max_wr >= SRQ_WR, "ibv_query_srq: max_wr %u < %u", sattr.max_wr, SRQ_WR);

    /* ibv_post_recv on a QP of an SRQ is an error. */
    struct ibv_sge sge = {.addr = (uintptr_t)rbuf, .length = SLOT, .lkey = rmr->lkey};
    struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *rbad = NULL;
    CHECK(ibv_post_recv(b.qp, &rw, &rbad) != 0, "ibv_post_recv on a QP of an SRQ succeeded");

    for (uint32_t i = 0; i < SRQ_WR; i++) {
        struct ibv_sge s = {.addr = (uintptr_t)(rbuf + (size_t)i * SLOT), .length = SLOT,
                            .lkey = rmr->lkey};
        struct ibv_recv_wr w = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad = NULL;
        check_rc(ibv_post_srq_recv(b.srq, &w, &bad), "ibv_post_srq_recv");
    }

    /* All SENDs posted at once, alternating QPs, each from its own source slot. */
    for (uint32_t k = 0; k < SENDS; k++) {
        uint8_t *src = sbuf + (size_t)k * SLOT;
        pattern_fill(src, len_of(k), k);
        struct ibv_sge s = {.addr = (uintptr_t)src, .length = len_of(k), .lkey = smr->lkey};
        struct ibv_send_wr w = {.wr_id = k, .sg_list = &s, .num_sge = 1,
                                .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
        struct ibv_send_wr *bad = NULL;
        int rc = ibv_post_send(aq[k % 2], &w, &bad);
        CHECK(rc == 0, "ibv_post_send SEND #%u: %d (%s)", k, rc, strerror(rc));
    }

    /* Per QP, SENDs arrive in their posting order: k = 0, 2, 4, ... on QP 0. */
    uint32_t next[2] = {0, 1}, received = 0, sent = 0;
    while (received < SENDS || sent < SENDS) {
        struct ibv_wc wc;
        if (received < SENDS) {
            poll_one(&b, &wc, "a receive from the SRQ");
            CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV,
                  "receive #%u: %s", received, wc_str(&wc));
            int q = wc.qp_num == bq[0]->qp_num ? 0 : wc.qp_num == bq[1]->qp_num ? 1 : -1;
            CHECK(q >= 0, "receive on unknown QP %#x", wc.qp_num);
            uint32_t k = next[q];
            next[q] += 2;
            CHECK(wc.wr_id < SRQ_WR, "receive wr_id %llu is not an SRQ WR",
                  (unsigned long long)wc.wr_id);
            CHECK(wc.byte_len == len_of(k), "SEND #%u: byte_len %u, expected %u", k,
                  wc.byte_len, len_of(k));
            uint8_t *dst = rbuf + (size_t)wc.wr_id * SLOT;
            char what[64];
            snprintf(what, sizeof what, "SEND #%u on QP %d into SRQ WR %llu", k, q,
                     (unsigned long long)wc.wr_id);
            CHECK(region_check(dst, 0, len_of(k), k, CANARY, 0, SLOT - len_of(k), what) == 0,
                  "%s: the data differs", what);
            memset(dst, CANARY, SLOT);
            struct ibv_sge s = {.addr = (uintptr_t)dst, .length = SLOT, .lkey = rmr->lkey};
            struct ibv_recv_wr w = {.wr_id = wc.wr_id, .sg_list = &s, .num_sge = 1}, *bad;
            check_rc(ibv_post_srq_recv(b.srq, &w, &bad), "ibv_post_srq_recv (repost)");
            received++;
        }
        while (sent < SENDS && ibv_poll_cq(a.cq, 1, &wc) == 1) {
            CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "SEND: %s",
                  wc_str(&wc));
            sent++;
        }
        if (received == SENDS && sent < SENDS) {
            poll_one(&a, &wc, "a SEND completion");
            CHECK(wc.status == IBV_WC_SUCCESS, "SEND: %s", wc_str(&wc));
            sent++;
        }
    }
    ok("%u SENDs over 2 QPs through an SRQ of %u WRs, every byte checked", SENDS, SRQ_WR);
    expect_no_wc(&a, "after the last SEND");
    expect_no_wc(&b, "after the last receive");

    check_rc(ibv_destroy_qp(a2), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(b2), "ibv_destroy_qp");
    dereg_mr(smr);
    dereg_mr(rmr);
    free(sbuf);
    free(rbuf);
    pair_close(&a, &b);
    printf("PASS srq: %u SENDs\n", SENDS);
    return 0;
}
