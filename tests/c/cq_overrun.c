/* Queue sizes are what was asked for, and a full CQ is never silent:
 * - a QP made with max_send_wr 12 and max_recv_wr 4 reports exactly those in ibv_query_qp
 *   and in its init attributes, and its CQ of 8 reports cqe 8;
 * - 12 signaled WRITEs into that CQ of 8, not polled: the CQ overruns, the context's async
 *   fd reports IBV_EVENT_CQ_ERR naming the CQ and IBV_EVENT_QP_FATAL naming the QP, the QP
 *   is in ERR, and the completions that fitted are still there to poll;
 * - a 13th send request posted into a queue of 12 outstanding is refused with ENOMEM. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define CQE 8
#define SENDS 12

static void next_event(struct end *e, struct ibv_async_event *ev, const char *what)
{
    struct pollfd p = {.fd = e->ctx->async_fd, .events = POLLIN};
    int n = poll(&p, 1, WAIT_MS);
    CHECK(n == 1, "no async event on %s within %d ms (%s)", e->name, WAIT_MS, what);
    check_rc(ibv_get_async_event(e->ctx, ev), "ibv_get_async_event");
}

int main(void)
{
    test_start("cq_overrun");
    struct end a, b;
    struct ibv_mr *amr, *bmr;
    pair_open_mrs(&a, &b, NULL, 1 << 16, &amr, &bmr);

    struct ibv_cq *cq = ibv_create_cq(a.ctx, CQE, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq(%d): %s", CQE, strerror(errno));
    CHECK(cq->cqe == CQE, "cq->cqe %d, asked for %d", cq->cqe, CQE);
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = SENDS, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
    };
    struct ibv_qp *qa = ibv_create_qp(a.pd, &init);
    CHECK(qa, "ibv_create_qp: %s", strerror(errno));
    CHECK(init.cap.max_send_wr == SENDS && init.cap.max_recv_wr == 4,
          "ibv_create_qp gave max_send_wr %u, max_recv_wr %u: asked for %u and 4",
          init.cap.max_send_wr, init.cap.max_recv_wr, SENDS);
    init.cap.max_send_wr = 64;
    struct ibv_qp *qb = ibv_create_qp(b.pd, &(struct ibv_qp_init_attr){
        .send_cq = b.cq, .recv_cq = b.cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}});
    CHECK(qb, "ibv_create_qp: %s", strerror(errno));
    pair_connect(&a, qa, &b, qb);

    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr qi;
    check_rc(ibv_query_qp(qa, &attr, IBV_QP_CAP | IBV_QP_STATE, &qi), "ibv_query_qp");
    CHECK(attr.cap.max_send_wr == SENDS && attr.cap.max_recv_wr == 4 &&
              qi.cap.max_send_wr == SENDS && qi.cap.max_recv_wr == 4,
          "ibv_query_qp: max_send_wr %u/%u, max_recv_wr %u/%u, asked for %u and 4",
          attr.cap.max_send_wr, qi.cap.max_send_wr, attr.cap.max_recv_wr, qi.cap.max_recv_wr,
          SENDS);
    ok("the QP's queues are the %u send and 4 receive WRs asked for; the CQ holds %d", SENDS,
       CQE);

    struct ibv_send_wr wrs[SENDS + 1], *bad = NULL;
    struct ibv_sge sg = {(uintptr_t)amr->addr, 256, amr->lkey};
    for (int i = 0; i <= SENDS; i++) {
        wrs[i] = (struct ibv_send_wr){.wr_id = i, .sg_list = &sg, .num_sge = 1,
                                      .opcode = IBV_WR_RDMA_WRITE,
                                      .send_flags = IBV_SEND_SIGNALED,
                                      .next = i < SENDS ? &wrs[i + 1] : NULL};
        wrs[i].wr.rdma.remote_addr = (uintptr_t)bmr->addr;
        wrs[i].wr.rdma.rkey = bmr->rkey;
    }
    int rc = ibv_post_send(qa, &wrs[0], &bad);
    CHECK(rc == ENOMEM && bad == &wrs[SENDS],
          "posting %d requests into a queue of %d: returned %d, bad_wr #%ld", SENDS + 1, SENDS,
          rc, bad ? (long)(bad - wrs) : -1L);
    ok("the %dth outstanding send request is refused with ENOMEM", SENDS + 1);

    struct ibv_async_event ev;
    next_event(&a, &ev, "the CQ overrun");
    CHECK(ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == cq,
          "first async event: type %d (%s) for %p, expected IBV_EVENT_CQ_ERR for the CQ %p",
          ev.event_type, ibv_event_type_str(ev.event_type), (void *)ev.element.cq, (void *)cq);
    ibv_ack_async_event(&ev);
    next_event(&a, &ev, "the QP failing");
    CHECK(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qa,
          "second async event: type %d (%s), expected IBV_EVENT_QP_FATAL for the QP",
          ev.event_type, ibv_event_type_str(ev.event_type));
    ibv_ack_async_event(&ev);
    check_rc(ibv_query_qp(qa, &attr, IBV_QP_STATE, &qi), "ibv_query_qp");
    CHECK(attr.qp_state == IBV_QPS_ERR, "the QP is in state %d after its CQ overran",
          attr.qp_state);
    ok("the overrun raised CQ_ERR and QP_FATAL; the QP is in ERR");

    struct ibv_wc wc[SENDS];
    int n = ibv_poll_cq(cq, SENDS, wc);
    CHECK(n == CQE, "the CQ gave %d completions, it held %d", n, CQE);
    for (int i = 0; i < n; i++)
        CHECK(wc[i].wr_id == (uint64_t)i, "completion %d is wr_id %llu", i,
              (unsigned long long)wc[i].wr_id);
    ok("the %d completions that fitted are there, in order", n);

    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    check_rc(ibv_destroy_cq(cq), "ibv_destroy_cq");
    pair_finish(&a, &b, amr, bmr);
    printf("PASS cq_overrun\n");
    return 0;
}
