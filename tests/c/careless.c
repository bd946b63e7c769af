/* What a careless program meets, answered as rdma-core answers it, never with a crash:
 * - ibv_reg_mr of unmapped memory, of read-only memory with a write access, or of a range
 *   that runs into a guard page fails with EFAULT (read-only memory for REMOTE_READ only is
 *   fine); REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE fails with EINVAL, a
 *   zero-based or on-demand region with EOPNOTSUPP;
 * - ibv_destroy_cq of a CQ a QP uses, ibv_dealloc_pd of a PD with a QP or an MR, and
 *   ibv_destroy_comp_channel of a channel with a CQ fail with EBUSY and leave the objects
 *   working; a second destroy of the same object fails with EINVAL;
 * - every failing verb sets errno to what it returns (modify_qp to an impossible state,
 *   an sgid_index outside the GID table);
 * - ibv_query_qp_data_in_order answers 0; ibv_resize_cq below the completions a CQ holds
 *   fails with EINVAL and keeps them;
 * - ibv_close_device of a context that still holds a QP, a CQ, an MR and a PD succeeds and
 *   frees the device: the next open in this process works (its ports were given back), and
 *   ibv_dereg_mr of the leftover MR afterwards fails with EINVAL instead of touching freed
 *   memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pair.h"
#include "verify.h"

#define PAGE 4096
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_context *open_named(const char *name)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list, "ibv_get_device_list: %s", strerror(errno));
    struct ibv_context *ctx = NULL;
    for (int i = 0; i < n && !ctx; i++)
        if (strcmp(ibv_get_device_name(list[i]), name) == 0)
            ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    CHECK(ctx, "ibv_open_device(%s): %s", name, strerror(errno));
    return ctx;
}

static void expect_mr_fails(struct ibv_pd *pd, void *addr, size_t len, int access, int want,
                            const char *what)
{
    errno = 0;
    struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
    if (mr)
        ibv_dereg_mr(mr);
    CHECK(!mr, "ibv_reg_mr(%s) succeeded", what);
    expect_errno(-1, want, what);
    ok("ibv_reg_mr(%s): %s", what, strerror(want));
}

static void registrations(void)
{
    struct ibv_context *ctx = open_named("bluerdma0");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd: %s", strerror(errno));

    uint8_t *gone = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(gone != MAP_FAILED, "mmap: %s", strerror(errno));
    CHECK(munmap(gone, 2 * PAGE) == 0, "munmap: %s", strerror(errno));
    expect_mr_fails(pd, gone, 2 * PAGE, RW, EFAULT, "unmapped memory");

    uint8_t *ro = mmap(NULL, 2 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED, "mmap: %s", strerror(errno));
    expect_mr_fails(pd, ro, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE, EFAULT, "read-only, LOCAL_WRITE");
    expect_mr_fails(pd, ro, 2 * PAGE, RW, EFAULT, "read-only, REMOTE_WRITE");
    struct ibv_mr *rmr = ibv_reg_mr(pd, ro, 2 * PAGE, IBV_ACCESS_REMOTE_READ);
    CHECK(rmr, "ibv_reg_mr(read-only memory, REMOTE_READ only): %s", strerror(errno));
    check_rc(ibv_dereg_mr(rmr), "ibv_dereg_mr");
    ok("ibv_reg_mr(read-only memory, REMOTE_READ only) works");

    uint8_t *guarded = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
    CHECK(guarded != MAP_FAILED, "mmap: %s", strerror(errno));
    CHECK(mprotect(guarded + PAGE, PAGE, PROT_NONE) == 0, "mprotect: %s", strerror(errno));
    expect_mr_fails(pd, guarded + 100, PAGE, RW, EFAULT, "a range into a guard page");

    uint8_t *good = alloc_buf(2 * PAGE, 0);
    expect_mr_fails(pd, good, PAGE, IBV_ACCESS_REMOTE_WRITE, EINVAL, "REMOTE_WRITE alone");
    expect_mr_fails(pd, good, PAGE, IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ, EINVAL,
                    "REMOTE_ATOMIC without LOCAL_WRITE");
    expect_mr_fails(pd, good, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED, EOPNOTSUPP,
                    "ZERO_BASED");
    expect_mr_fails(pd, good, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND, EOPNOTSUPP,
                    "ON_DEMAND");
    struct ibv_mr *mr = ibv_reg_mr(pd, good, PAGE, RW);
    CHECK(mr, "ibv_reg_mr(heap memory): %s", strerror(errno));

    /* Destroy order. */
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch, "ibv_create_comp_channel: %s", strerror(errno));
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
    CHECK(cq, "ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    CHECK(qp, "ibv_create_qp: %s", strerror(errno));
    expect_errno(ibv_destroy_cq(cq), EBUSY, "ibv_destroy_cq with a QP on it");
    expect_errno(ibv_dealloc_pd(pd), EBUSY, "ibv_dealloc_pd with a QP and an MR");
    expect_errno(ibv_destroy_comp_channel(ch), EBUSY, "ibv_destroy_comp_channel with a CQ");
    ok("destroying a CQ, a PD or a channel still in use: EBUSY");

    /* Still working after the refusals: the QP moves to INIT. */
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    check_rc(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      IBV_QP_ACCESS_FLAGS),
             "ibv_modify_qp(INIT) after the refusals");
    /* INIT -> RTS skips RTR: refused, with errno. */
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    errno = 0;
    expect_errno(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL, "ibv_modify_qp(INIT -> RTS)");
    ok("a failing ibv_modify_qp returns and sets EINVAL");

    check_rc(ibv_destroy_qp(qp), "ibv_destroy_qp");
    expect_errno(ibv_destroy_qp(qp), EINVAL, "a second ibv_destroy_qp");
    expect_errno(ibv_dealloc_pd(pd), EBUSY, "ibv_dealloc_pd with an MR");
    check_rc(ibv_dereg_mr(mr), "ibv_dereg_mr");
    check_rc(ibv_destroy_cq(cq), "ibv_destroy_cq once its QP is gone");
    check_rc(ibv_destroy_comp_channel(ch), "ibv_destroy_comp_channel once its CQ is gone");
    check_rc(ibv_dealloc_pd(pd), "ibv_dealloc_pd once its MR and QP are gone");
    ok("destroyed in order, each once");
    check_rc(ibv_close_device(ctx), "ibv_close_device");
    munmap(ro, 2 * PAGE);
    munmap(guarded, 2 * PAGE);
    free(good);
}

static void connected(void)
{
    struct end a, b;
    struct ibv_mr *amr, *bmr;
    pair_open_mrs(&a, &b, NULL, 8 * PAGE, &amr, &bmr);
    CHECK(ibv_query_qp_data_in_order(a.qp, IBV_WR_RDMA_WRITE, 0) == 0,
          "ibv_query_qp_data_in_order did not answer 0");

    /* An sgid_index outside the GID table (index 1 is empty) is refused. */
    struct ibv_qp_init_attr init = {.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *q = ibv_create_qp(a.pd, &init);
    CHECK(q, "ibv_create_qp: %s", strerror(errno));
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    check_rc(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS),
             "ibv_modify_qp(INIT)");
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = b.qp->qp_num;
    at.ah_attr.is_global = 1;
    at.ah_attr.grh.dgid = b.gid;
    at.ah_attr.grh.sgid_index = 1;
    at.ah_attr.port_num = 1;
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    expect_errno(ibv_modify_qp(q, &at, mask), EINVAL, "RTR with sgid_index 1");
    at.ah_attr.grh.sgid_index = 7;
    expect_errno(ibv_modify_qp(q, &at, mask), EINVAL, "RTR with sgid_index 7");
    check_rc(ibv_destroy_qp(q), "ibv_destroy_qp");
    ok("sgid_index outside the GID table: EINVAL");

    /* resize_cq keeps what a CQ holds and refuses to shrink below it. UD sends complete
     * when posted, so the CQ holds exactly what was sent. */
    struct ibv_cq *ucq = ibv_create_cq(a.ctx, 8, NULL, NULL, 0);
    CHECK(ucq, "ibv_create_cq: %s", strerror(errno));
    CHECK(ucq->cqe == 8, "cq->cqe %d for a CQ of 8", ucq->cqe);
    struct ibv_qp_init_attr ui = {.send_cq = ucq, .recv_cq = ucq, .qp_type = IBV_QPT_UD,
                                  .cap = {.max_send_wr = 8, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *uqp = ibv_create_qp(a.pd, &ui);
    CHECK(uqp, "ibv_create_qp(UD): %s", strerror(errno));
    struct ibv_qp_attr ua = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 7};
    check_rc(ibv_modify_qp(uqp, &ua, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_QKEY),
             "ibv_modify_qp(UD INIT)");
    ua = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
    check_rc(ibv_modify_qp(uqp, &ua, IBV_QP_STATE), "ibv_modify_qp(UD RTR)");
    ua = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
    check_rc(ibv_modify_qp(uqp, &ua, IBV_QP_STATE | IBV_QP_SQ_PSN), "ibv_modify_qp(UD RTS)");
    struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1,
                             .grh = {.dgid = b.gid, .sgid_index = 0, .hop_limit = 64}};
    struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
    CHECK(ah, "ibv_create_ah: %s", strerror(errno));
    for (uint32_t i = 0; i < 5; i++) {
        struct ibv_sge sg = {(uintptr_t)amr->addr, 16, amr->lkey};
        struct ibv_send_wr w = {.wr_id = 100 + i, .sg_list = &sg, .num_sge = 1,
                                .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
        w.wr.ud.ah = ah;
        w.wr.ud.remote_qpn = 0x800000;
        w.wr.ud.remote_qkey = 7;
        check_rc(ibv_post_send(uqp, &w, &bad), "ibv_post_send(UD)");
    }
    expect_errno(ibv_resize_cq(ucq, 4), EINVAL, "ibv_resize_cq(4) holding 5 completions");
    check_rc(ibv_resize_cq(ucq, 2048), "ibv_resize_cq(2048)");
    CHECK(ucq->cqe >= 2048, "cq->cqe %d after a resize to 2048", ucq->cqe);
    struct ibv_wc wc;
    for (uint32_t i = 0; i < 5; i++) {
        CHECK(ibv_poll_cq(ucq, 1, &wc) == 1, "completion %u lost across resizes", i);
        CHECK(wc.wr_id == 100 + i && wc.status == IBV_WC_SUCCESS, "after resizes: %s",
              wc_str(&wc));
    }
    check_rc(ibv_resize_cq(ucq, 5), "ibv_resize_cq(5) once polled");
    check_rc(ibv_destroy_ah(ah), "ibv_destroy_ah");
    check_rc(ibv_destroy_qp(uqp), "ibv_destroy_qp(UD)");
    check_rc(ibv_destroy_cq(ucq), "ibv_destroy_cq");
    ok("ibv_resize_cq: below the queued completions EINVAL, growing keeps them in order");
    pair_finish(&a, &b, amr, bmr);
}

static void leftovers(void)
{
    struct ibv_context *ctx = open_named("bluerdma1");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd: %s", strerror(errno));
    uint8_t *buf = alloc_buf(PAGE, 0);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, PAGE, RW);
    CHECK(mr, "ibv_reg_mr: %s", strerror(errno));
    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    CHECK(cq, "ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 1, .max_recv_wr = 1,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    CHECK(ibv_create_qp(pd, &init), "ibv_create_qp: %s", strerror(errno));
    check_rc(ibv_close_device(ctx), "ibv_close_device with a QP, a CQ, an MR and a PD left");
    expect_errno(ibv_dereg_mr(mr), EINVAL, "ibv_dereg_mr after ibv_close_device");

    /* The device is free again: a new context starts its card on the same ports. */
    ctx = open_named("bluerdma1");
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd after closing a context with leftovers: %s", strerror(errno));
    check_rc(ibv_dealloc_pd(pd), "ibv_dealloc_pd");
    check_rc(ibv_close_device(ctx), "ibv_close_device");
    free(buf);
    ok("ibv_close_device with objects left frees them and the device");
}

int main(void)
{
    test_start("careless");
    registrations();
    connected();
    leftovers();
    printf("PASS careless\n");
    return 0;
}
