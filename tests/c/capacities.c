/* What ibv_query_device says is what the device takes:
 * - the card's tables: max_qp (1023) RC QPs exist at once and one more is refused with
 *   ENOMEM; max_mr (8191) MRs are registered at once and one more is refused; max_pd PDs;
 * - max_mr_size is the card's 32-bit length: one byte more is refused;
 * - queues 4096 deep (max_qp_wr is at least that): a QP of max_send_wr = max_recv_wr =
 *   4096 and a CQ of 8192 take 4096 receive WRs and 4096 WRITEs at once (the next of each
 *   is refused with ENOMEM), and all 4096 + 4096 complete;
 * - several SGEs per receive WR (max_sge). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define DEEP 4096

static void tables(struct end *e, const struct ibv_device_attr *d)
{
    struct ibv_qp_init_attr init = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 1, .max_recv_wr = 1,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    /* The pair already made one QP on this device. */
    int n = d->max_qp - 1;
    struct ibv_qp **qps = calloc(n, sizeof *qps);
    for (int i = 0; i < n; i++) {
        qps[i] = ibv_create_qp(e->pd, &init);
        CHECK(qps[i], "QP %d of max_qp %d: %s", i + 2, d->max_qp, strerror(errno));
    }
    errno = 0;
    CHECK(!ibv_create_qp(e->pd, &init) && errno == ENOMEM, "QP %d beyond max_qp: errno %d",
          d->max_qp + 1, errno);
    for (int i = 0; i < n; i++)
        check_rc(ibv_destroy_qp(qps[i]), "ibv_destroy_qp");
    free(qps);
    ok("max_qp %d RC QPs at once; one more: ENOMEM", d->max_qp);

    /* The pair has no MR on this device: all max_mr are ours, one page each. */
    size_t page = 4096, len = (size_t)d->max_mr * page;
    uint8_t *buf = alloc_buf(len, 0);
    struct ibv_mr **mrs = calloc(d->max_mr, sizeof *mrs);
    for (int i = 0; i < d->max_mr; i++) {
        mrs[i] = ibv_reg_mr(e->pd, buf + i * page, page, IBV_ACCESS_LOCAL_WRITE);
        CHECK(mrs[i], "MR %d of max_mr %d: %s", i + 1, d->max_mr, strerror(errno));
    }
    uint8_t extra[64];
    errno = 0;
    struct ibv_mr *one_more = ibv_reg_mr(e->pd, extra, sizeof extra, 0);
    CHECK(!one_more && errno == ENOMEM, "MR %d beyond max_mr: errno %d", d->max_mr + 1, errno);
    for (int i = 0; i < d->max_mr; i++)
        dereg_mr(mrs[i]);
    free(mrs);
    free(buf);
    ok("max_mr %d MRs at once; one more: ENOMEM", d->max_mr);

    struct ibv_pd **pds = calloc(d->max_pd, sizeof *pds);
    int made = 1; /* the pair's */
    for (int i = 0; made < d->max_pd; i++, made++) {
        pds[i] = ibv_alloc_pd(e->ctx);
        CHECK(pds[i], "PD %d of max_pd %d: %s", made + 1, d->max_pd, strerror(errno));
    }
    errno = 0;
    CHECK(!ibv_alloc_pd(e->ctx) && errno == ENOMEM, "PD beyond max_pd: errno %d", errno);
    for (int i = 0; i + 1 < d->max_pd; i++)
        check_rc(ibv_dealloc_pd(pds[i]), "ibv_dealloc_pd");
    free(pds);
    ok("max_pd %d PDs at once; one more: ENOMEM", d->max_pd);

    errno = 0;
    CHECK(d->max_mr_size == 0xFFFFFFFFull, "max_mr_size %#llx", (unsigned long long)d->max_mr_size);
    CHECK(!ibv_reg_mr(e->pd, extra, d->max_mr_size + 1, 0) && errno == EINVAL,
          "an MR of max_mr_size + 1 bytes: errno %d", errno);
    ok("max_mr_size is 4 GiB - 1; one byte more: EINVAL");
}

static void deep_queues(struct end *a, struct end *b)
{
    struct ibv_cq *cqa = ibv_create_cq(a->ctx, 2 * DEEP, NULL, NULL, 0);
    struct ibv_cq *cqb = ibv_create_cq(b->ctx, 2 * DEEP, NULL, NULL, 0);
    CHECK(cqa && cqb, "ibv_create_cq(%d): %s", 2 * DEEP, strerror(errno));
    struct ibv_qp_init_attr init = {.qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = DEEP, .max_recv_wr = DEEP,
                                            .max_send_sge = 1, .max_recv_sge = 3}};
    init.send_cq = init.recv_cq = cqa;
    struct ibv_qp *qa = ibv_create_qp(a->pd, &init);
    init.send_cq = init.recv_cq = cqb;
    struct ibv_qp *qb = ibv_create_qp(b->pd, &init);
    CHECK(qa && qb, "ibv_create_qp(%d deep): %s", DEEP, strerror(errno));
    pair_connect(a, qa, b, qb);
    uint8_t *abuf = alloc_buf(1 << 16, 1), *bbuf = alloc_buf(1 << 16, 0);
    struct ibv_mr *amr = reg_mr(a, abuf, 1 << 16), *bmr = reg_mr(b, bbuf, 1 << 16);

    struct ibv_sge rs[3];
    for (int k = 0; k < 3; k++)
        rs[k] = (struct ibv_sge){(uintptr_t)(bbuf + k * 100), 10, bmr->lkey};
    struct ibv_recv_wr rw = {.sg_list = rs, .num_sge = 3}, *rbad;
    for (int i = 0; i < DEEP; i++) {
        rw.wr_id = i;
        check_rc(ibv_post_recv(qb, &rw, &rbad), "ibv_post_recv (4096 deep, 3 SGEs)");
    }
    CHECK(ibv_post_recv(qb, &rw, &rbad) == ENOMEM, "receive WR %d was not refused", DEEP + 1);
    struct ibv_sge s = {(uintptr_t)abuf, 64, amr->lkey};
    struct ibv_send_wr w = {.sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                            .send_flags = IBV_SEND_SIGNALED}, *bad;
    w.wr.rdma.remote_addr = (uintptr_t)bbuf + 4096;
    w.wr.rdma.rkey = bmr->rkey;
    for (int i = 0; i < DEEP; i++) {
        w.wr_id = i;
        check_rc(ibv_post_send(qa, &w, &bad), "ibv_post_send (4096 outstanding)");
    }
    CHECK(ibv_post_send(qa, &w, &bad) == ENOMEM, "send request %d was not refused", DEEP + 1);
    ok("a QP holds %d receive WRs (3 SGEs each) and %d send requests at once", DEEP, DEEP);
    struct end ea = *a;
    ea.cq = cqa;
    ea.qp = qa;
    struct ibv_wc wc;
    for (int i = 0; i < DEEP; i++)
        expect_wc(&ea, &wc, i, IBV_WC_RDMA_WRITE, "one of 4096 outstanding WRITEs");
    /* The receive WRs are still posted: 4096 SENDs of 30 bytes use them. */
    w.opcode = IBV_WR_SEND;
    s.length = 30;
    pattern_fill(abuf, 30, 7);
    struct end eb = *b;
    eb.cq = cqb;
    eb.qp = qb;
    for (int i = 0; i < DEEP; i++) {
        w.wr_id = i;
        check_rc(ibv_post_send(qa, &w, &bad), "ibv_post_send (SEND)");
        if (i % 256 == 255)
            for (int j = i - 255; j <= i; j++)
                expect_wc(&ea, &wc, j, IBV_WC_SEND, "a SEND");
    }
    for (int i = 0; i < DEEP; i++)
        expect_wc(&eb, &wc, i, IBV_WC_RECV, "a receive of 4096");
    uint8_t want[30];
    pattern_fill(want, 30, 7);
    for (int k = 0; k < 3; k++)
        CHECK(hexdiff(want + 10 * k, bbuf + k * 100, 10, "a receive's piece") == 0,
              "piece %d of the last receive differs", k);
    ok("all %d WRITEs and %d SENDs completed", DEEP, DEEP);
    dereg_mr(amr);
    dereg_mr(bmr);
    free(abuf);
    free(bbuf);
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    check_rc(ibv_destroy_cq(cqa), "ibv_destroy_cq");
    check_rc(ibv_destroy_cq(cqb), "ibv_destroy_cq");
}

int main(void)
{
    test_start("capacities");
    struct end a, b;
    pair_open(&a, &b, NULL);
    struct ibv_device_attr d;
    check_rc(ibv_query_device(a.ctx, &d), "ibv_query_device");
    printf("max_qp %d max_qp_wr %d max_sge %d max_cq %d max_cqe %d max_mr %d max_pd %d "
           "max_srq %d max_srq_wr %d max_ah %d\n",
           d.max_qp, d.max_qp_wr, d.max_sge, d.max_cq, d.max_cqe, d.max_mr, d.max_pd,
           d.max_srq, d.max_srq_wr, d.max_ah);
    CHECK(d.max_qp == 1023 && d.max_mr == 8191, "max_qp %d, max_mr %d: not the card's tables",
          d.max_qp, d.max_mr);
    CHECK(d.max_qp_wr >= DEEP && d.max_cqe >= 2 * DEEP && d.max_sge >= 3,
          "max_qp_wr %d, max_cqe %d, max_sge %d", d.max_qp_wr, d.max_cqe, d.max_sge);
    deep_queues(&a, &b);
    tables(&b, &d);
    pair_close(&a, &b);
    printf("PASS capacities\n");
    return 0;
}
