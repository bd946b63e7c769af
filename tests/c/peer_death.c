/* A passive receiver learns that its peer is gone. bluerdma0 posts receive WRs (announced
 * to bluerdma1 over the out-of-band channel) and only waits, as ib_send_bw's server does;
 * bluerdma1's side then goes away (it closes its device with everything still open, as a
 * process that exits does). The receive WRs complete with IBV_WC_WR_FLUSH_ERR, the QP is in
 * ERR, and the async fd reports IBV_EVENT_QP_FATAL for it: nothing waits forever. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define RECVS 4
#define LEN 4096

int main(void)
{
    test_start("peer_death");
    struct end a, b;
    pair_open(&a, &b, NULL);
    uint8_t *buf = alloc_buf(RECVS * LEN, 0);
    struct ibv_mr *mr = reg_mr(&a, buf, RECVS * LEN);
    for (uint32_t i = 0; i < RECVS; i++)
        post_recv_wr(&a, i, buf + i * LEN, LEN, mr);
    /* One SEND arrives first: the channel and the receive WRs are in use. */
    uint8_t *sbuf = alloc_buf(LEN, 0x5A);
    struct ibv_mr *smr = reg_mr(&b, sbuf, LEN);
    post_send_wr(&b, IBV_WR_SEND, 100, sbuf, 10, smr, 0, 0, 0, IBV_SEND_SIGNALED);
    struct ibv_wc wc;
    expect_wc(&a, &wc, 0, IBV_WC_RECV, "the SEND before the peer goes");
    ok("a receive completed; %d more are posted", RECVS - 1);

    /* bluerdma1 goes away with everything open. */
    check_rc(ibv_close_device(b.ctx), "ibv_close_device(bluerdma1) with its objects open");
    for (uint32_t i = 1; i < RECVS; i++) {
        poll_one(&a, &wc, "a receive WR flushed after the peer went");
        CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == i,
              "receive %u after the peer went: %s", i, wc_str(&wc));
    }
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    check_rc(ibv_query_qp(a.qp, &attr, IBV_QP_STATE, &init), "ibv_query_qp");
    CHECK(attr.qp_state == IBV_QPS_ERR, "the receiver's QP is in state %d, not ERR",
          attr.qp_state);
    struct pollfd p = {.fd = a.ctx->async_fd, .events = POLLIN};
    CHECK(poll(&p, 1, WAIT_MS) == 1, "no async event within %d ms", WAIT_MS);
    struct ibv_async_event ev;
    check_rc(ibv_get_async_event(a.ctx, &ev), "ibv_get_async_event");
    CHECK(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == a.qp,
          "async event %s, expected IBV_EVENT_QP_FATAL for the QP",
          ibv_event_type_str(ev.event_type));
    ibv_ack_async_event(&ev);
    ok("the %d receive WRs left were flushed, the QP is in ERR, QP_FATAL was raised",
       RECVS - 1);

    dereg_mr(mr);
    check_rc(ibv_destroy_qp(a.qp), "ibv_destroy_qp");
    check_rc(ibv_destroy_cq(a.cq), "ibv_destroy_cq");
    check_rc(ibv_dealloc_pd(a.pd), "ibv_dealloc_pd");
    check_rc(ibv_close_device(a.ctx), "ibv_close_device");
    free(buf);
    free(sbuf);
    printf("PASS peer_death\n");
    return 0;
}
