/* ibv_rereg_mr, memory windows and the remote errors the card never reports, between
 * bluerdma0 and bluerdma1 in one process:
 * - a WRITE into an MR without REMOTE_WRITE completes with IBV_WC_REM_ACCESS_ERR (the
 *   requester's access check after its first timeout), its QP in ERR, not a byte written;
 *   a READ from an MR without REMOTE_READ too; a SEND into a receive WR whose MR is in
 *   another PD than the QP completes with IBV_WC_REM_OP_ERR, the receive WR with
 *   IBV_WC_LOC_PROT_ERR;
 * - ibv_rereg_mr CHANGE_ACCESS adds REMOTE_WRITE under the same rkey: the WRITE lands;
 *   CHANGE_TRANSLATION moves it to another buffer under the same rkey: the next WRITE lands
 *   there and not in the old one; CHANGE_PD gives new keys and the old rkey is refused;
 *   refusals (flags 0, an unknown flag, a translation without an address, a NULL PD)
 *   return IBV_REREG_MR_ERR_INPUT with EINVAL and leave the MR working;
 * - ibv_query_device reports MEM_WINDOW, MEM_WINDOW_TYPE_2B and max_mw;
 * - type 1: ibv_bind_mw over bytes 256..1280 of an MR with MW_BIND completes with
 *   IBV_WC_BIND_MW and a new rkey; a WRITE through it lands in the window, one past its end
 *   is REM_ACCESS_ERR; ibv_dereg_mr of its MR is EBUSY while it is bound; a zero-length
 *   bind unbinds it and its rkey is refused;
 * - type 2: IBV_WR_BIND_MW with rkey ibv_inc_rkey(mw->rkey), a WRITE through it lands,
 *   IBV_WR_LOCAL_INV completes with IBV_WC_LOCAL_INV and the rkey is refused; rebound,
 *   then ibv_dealloc_mw: refused again;
 * - IBV_WR_SEND_WITH_INV from the peer: the bytes arrive, the receive completion has
 *   IBV_WC_WITH_INV and invalidated_rkey, the SEND IBV_WC_SUCCESS, and a WRITE through
 *   the window is then REM_ACCESS_ERR (and its MR takes ibv_rereg_mr again); one naming an MR's rkey completes with
 *   IBV_WC_REM_OP_ERR, its receive WR with IBV_WC_LOC_PROT_ERR, nothing written, the
 *   window left bound;
 * - ibv_alloc_mw of type 3 is EINVAL; a bind to an MR without MW_BIND completes with
 *   IBV_WC_MW_BIND_ERR and the QP goes to ERR. */
#define _GNU_SOURCE
#include "pair.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF 4096

/* A fresh connected QP pair replaces the ends' own (after an error put one in ERR). */
static void fresh(struct end *a, struct end *b)
{
    struct ibv_qp *qa, *qb;
    pair_extra_qps(a, b, &qa, &qb);
    check_rc(ibv_destroy_qp(a->qp), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(b->qp), "ibv_destroy_qp");
    a->qp = qa;
    b->qp = qb;
}

/* A request `op` of `len` bytes at `src` to raddr/rkey that must complete with `status`. */
static void op_expect(struct end *a, enum ibv_wr_opcode op, struct ibv_mr *src, uint32_t len,
                      uint64_t raddr, uint32_t rkey, enum ibv_wc_status status, const char *what)
{
    struct ibv_wc wc;
    post_send_wr(a, op, 7, src->addr, len, src, raddr, rkey, 0, IBV_SEND_SIGNALED);
    poll_one(a, &wc, what);
    CHECK(wc.wr_id == 7 && wc.status == status, "%s: %s (expected status %s)", what, wc_str(&wc),
          ibv_wc_status_str(status));
    if (status != IBV_WC_SUCCESS) {
        struct ibv_qp_attr at;
        struct ibv_qp_init_attr init;
        check_rc(ibv_query_qp(a->qp, &at, IBV_QP_STATE, &init), "ibv_query_qp");
        CHECK(at.qp_state == IBV_QPS_ERR, "%s: the requester's QP is in state %d, not ERR", what,
              at.qp_state);
    }
}

static void write_expect(struct end *a, struct ibv_mr *src, uint32_t len, uint64_t raddr,
                         uint32_t rkey, enum ibv_wc_status status, const char *what)
{
    op_expect(a, IBV_WR_RDMA_WRITE, src, len, raddr, rkey, status, what);
}

static int all(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t k = 0; k < n; k++)
        if (p[k] != v)
            return 0;
    return 1;
}

static void rereg(struct end *a, struct end *b, struct ibv_mr *src)
{
    uint8_t *t1 = alloc_buf(BUF, 0), *t2 = alloc_buf(BUF, 0);
    struct ibv_mr *mr = ibv_reg_mr(b->pd, t1, BUF, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr: %s", strerror(errno));
    uint32_t rkey = mr->rkey;
    write_expect(a, src, 100, (uintptr_t)t1, rkey, IBV_WC_REM_ACCESS_ERR,
                 "WRITE into an MR without REMOTE_WRITE");
    CHECK(all(t1, BUF, 0), "the refused WRITE wrote bytes");
    ok("WRITE into an MR without REMOTE_WRITE: IBV_WC_REM_ACCESS_ERR, QP in ERR, nothing written");
    fresh(a, b);
    op_expect(a, IBV_WR_RDMA_READ, src, 64, (uintptr_t)t1, rkey, IBV_WC_REM_ACCESS_ERR,
              "READ from an MR without REMOTE_READ");
    fresh(a, b);
    ok("READ from an MR without REMOTE_READ: IBV_WC_REM_ACCESS_ERR");

    int rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    check_rc(rc, "ibv_rereg_mr(CHANGE_ACCESS)");
    CHECK(mr->rkey == rkey && mr->lkey == rkey, "CHANGE_ACCESS changed the keys");
    write_expect(a, src, 100, (uintptr_t)t1 + 8, rkey, IBV_WC_SUCCESS, "WRITE after CHANGE_ACCESS");
    CHECK(memcmp(t1 + 8, src->addr, 100) == 0 && t1[7] == 0 && t1[108] == 0,
          "WRITE after CHANGE_ACCESS: bytes");
    ok("rereg CHANGE_ACCESS: same rkey, the WRITE lands");

    rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, t2, BUF, 0);
    check_rc(rc, "ibv_rereg_mr(CHANGE_TRANSLATION)");
    CHECK(mr->rkey == rkey && mr->addr == t2 && mr->length == BUF, "CHANGE_TRANSLATION: mr %p+%zu",
          mr->addr, mr->length);
    memset(t1, 0, BUF);
    write_expect(a, src, 300, (uintptr_t)t2 + 1000, rkey, IBV_WC_SUCCESS,
                 "WRITE after CHANGE_TRANSLATION");
    CHECK(memcmp(t2 + 1000, src->addr, 300) == 0 && all(t1, BUF, 0),
          "WRITE after CHANGE_TRANSLATION: in the new buffer only");
    ok("rereg CHANGE_TRANSLATION: same rkey, the WRITE lands in the new buffer, not the old");

    /* Refusals leave the MR as it was. */
    errno = 0;
    CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
          "rereg with flags 0: errno %d", errno);
    errno = 0;
    CHECK(ibv_rereg_mr(mr, 1 << 3, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
          "rereg with flag 1 << 3: errno %d", errno);
    errno = 0;
    CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, BUF, 0) ==
                  IBV_REREG_MR_ERR_INPUT &&
              errno == EINVAL,
          "rereg CHANGE_TRANSLATION without an address: errno %d", errno);
    errno = 0;
    CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
              errno == EINVAL,
          "rereg CHANGE_PD to NULL: errno %d", errno);
    write_expect(a, src, 10, (uintptr_t)t2, rkey, IBV_WC_SUCCESS, "WRITE after refused rereg");
    ok("rereg refusals (flags 0, 1 << 3, no address, NULL PD): ERR_INPUT, EINVAL, MR unchanged");

    struct ibv_pd *pd2 = ibv_alloc_pd(b->ctx);
    CHECK(pd2, "ibv_alloc_pd: %s", strerror(errno));
    check_rc(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0), "rereg CHANGE_PD");
    CHECK(mr->pd == pd2 && mr->rkey != rkey, "CHANGE_PD: pd %p, rkey %#x (was %#x)",
          (void *)mr->pd, mr->rkey, rkey);
    expect_errno(ibv_dealloc_pd(pd2), EBUSY, "dealloc the PD the MR moved to");
    write_expect(a, src, 10, (uintptr_t)t2, rkey, IBV_WC_REM_ACCESS_ERR,
                 "WRITE with the rkey of the old PD");
    ok("rereg CHANGE_PD: new keys, the old rkey is refused (IBV_WC_REM_ACCESS_ERR)");
    fresh(a, b);

    /* A receive WR in an MR of another PD than its QP's: posted, then the SEND into it fails
     * on both sides. */
    struct ibv_wc wc;
    memset(t2, 0, BUF);
    post_recv_wr(b, 41, t2, BUF, mr);
    post_send_wr(a, IBV_WR_SEND, 42, src->addr, 100, src, 0, 0, 0, IBV_SEND_SIGNALED);
    poll_one(a, &wc, "SEND into a receive WR of another PD");
    CHECK(wc.wr_id == 42 && wc.status == IBV_WC_REM_OP_ERR, "the SEND: %s", wc_str(&wc));
    poll_one(b, &wc, "receive WR of another PD");
    CHECK(wc.wr_id == 41 && wc.status == IBV_WC_LOC_PROT_ERR, "the receive WR: %s", wc_str(&wc));
    CHECK(all(t2, BUF, 0), "the refused SEND wrote bytes");
    ok("SEND into a receive WR whose MR is in another PD: IBV_WC_REM_OP_ERR and "
       "IBV_WC_LOC_PROT_ERR, nothing written");
    fresh(a, b);
    dereg_mr(mr);
    check_rc(ibv_dealloc_pd(pd2), "ibv_dealloc_pd");
    free(t1);
    free(t2);
}

static void type1(struct end *a, struct end *b, struct ibv_mr *src)
{
    uint8_t *t = alloc_buf(BUF, 0);
    struct ibv_mr *mr = ibv_reg_mr(b->pd, t, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(mr, "ibv_reg_mr(MW_BIND): %s", strerror(errno));
    struct ibv_mw *mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_1);
    CHECK(mw && mw->type == IBV_MW_TYPE_1 && mw->pd == b->pd, "ibv_alloc_mw(type 1): %s",
          strerror(errno));
    uint32_t before = mw->rkey;
    struct ibv_mw_bind bind = {
        .wr_id = 21,
        .send_flags = IBV_SEND_SIGNALED,
        .bind_info = {.mr = mr, .addr = (uintptr_t)t + 256, .length = 1024,
                      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE},
    };
    check_rc(ibv_bind_mw(b->qp, mw, &bind), "ibv_bind_mw");
    struct ibv_wc wc;
    expect_wc(b, &wc, 21, IBV_WC_BIND_MW, "bind (type 1)");
    CHECK(mw->rkey != before && (mw->rkey >> 8) == (before >> 8), "rkey %#x after bind (was %#x)",
          mw->rkey, before);
    write_expect(a, src, 1024, (uintptr_t)t + 256, mw->rkey, IBV_WC_SUCCESS, "WRITE in the window");
    CHECK(memcmp(t + 256, src->addr, 1024) == 0 && all(t, 256, 0) && all(t + 1280, BUF - 1280, 0),
          "WRITE in the window: bytes");
    expect_errno(ibv_dereg_mr(mr), EBUSY, "dereg an MR with a bound window");
    write_expect(a, src, 2, (uintptr_t)t + 1279, mw->rkey, IBV_WC_REM_ACCESS_ERR,
                 "WRITE one byte past the window");
    CHECK(t[1279] == ((uint8_t *)src->addr)[1023], "the refused WRITE changed the window");
    fresh(a, b);
    ok("type 1: bound over 256..1280 (IBV_WC_BIND_MW, new rkey), WRITE inside lands, past the "
       "end IBV_WC_REM_ACCESS_ERR, dereg of its MR EBUSY");

    struct ibv_mw_bind unbind = {.wr_id = 22, .send_flags = IBV_SEND_SIGNALED,
                                 .bind_info = {.mr = mr}};
    uint32_t bound = mw->rkey;
    check_rc(ibv_bind_mw(b->qp, mw, &unbind), "ibv_bind_mw(length 0)");
    expect_wc(b, &wc, 22, IBV_WC_BIND_MW, "unbind (type 1)");
    write_expect(a, src, 8, (uintptr_t)t + 256, bound, IBV_WC_REM_ACCESS_ERR,
                 "WRITE through the unbound window");
    fresh(a, b);
    check_rc(ibv_dealloc_mw(mw), "ibv_dealloc_mw");
    dereg_mr(mr);
    free(t);
    ok("type 1: a zero-length bind unbinds; its rkey is refused");
}

static void post_bind(struct end *b, struct ibv_mw *mw, uint32_t rkey, struct ibv_mr *mr,
                      void *addr, uint64_t len)
{
    struct ibv_send_wr wr = {.wr_id = 31, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info.mr = mr;
    wr.bind_mw.bind_info.addr = (uintptr_t)addr;
    wr.bind_mw.bind_info.length = len;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    struct ibv_send_wr *bad = NULL;
    check_rc(ibv_post_send(b->qp, &wr, &bad), "ibv_post_send(BIND_MW)");
}

static void type2(struct end *a, struct end *b, struct ibv_mr *src)
{
    uint8_t *t = alloc_buf(BUF, 0);
    struct ibv_mr *mr = ibv_reg_mr(b->pd, t, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(mr, "ibv_reg_mr(MW_BIND): %s", strerror(errno));
    struct ibv_mw *mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
    CHECK(mw, "ibv_alloc_mw(type 2): %s", strerror(errno));
    uint32_t rkey = ibv_inc_rkey(mw->rkey);
    struct ibv_wc wc;
    post_bind(b, mw, rkey, mr, t, BUF);
    expect_wc(b, &wc, 31, IBV_WC_BIND_MW, "IBV_WR_BIND_MW");
    write_expect(a, src, 500, (uintptr_t)t + 3000, rkey, IBV_WC_SUCCESS, "WRITE through type 2");
    CHECK(memcmp(t + 3000, src->addr, 500) == 0, "WRITE through type 2: bytes");

    struct ibv_send_wr inv = {.wr_id = 32, .opcode = IBV_WR_LOCAL_INV,
                              .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = rkey};
    struct ibv_send_wr *bad = NULL;
    check_rc(ibv_post_send(b->qp, &inv, &bad), "ibv_post_send(LOCAL_INV)");
    expect_wc(b, &wc, 32, IBV_WC_LOCAL_INV, "IBV_WR_LOCAL_INV");
    write_expect(a, src, 8, (uintptr_t)t, rkey, IBV_WC_REM_ACCESS_ERR,
                 "WRITE through an invalidated window");
    fresh(a, b);
    ok("type 2: IBV_WR_BIND_MW (IBV_WC_BIND_MW), WRITE lands, IBV_WR_LOCAL_INV "
       "(IBV_WC_LOCAL_INV), then IBV_WC_REM_ACCESS_ERR");

    rkey = ibv_inc_rkey(rkey);
    post_bind(b, mw, rkey, mr, t, BUF);
    expect_wc(b, &wc, 31, IBV_WC_BIND_MW, "IBV_WR_BIND_MW again");
    write_expect(a, src, 8, (uintptr_t)t, rkey, IBV_WC_SUCCESS, "WRITE through the rebound window");
    check_rc(ibv_dealloc_mw(mw), "ibv_dealloc_mw (bound)");
    write_expect(a, src, 8, (uintptr_t)t, rkey, IBV_WC_REM_ACCESS_ERR,
                 "WRITE through a deallocated window");
    fresh(a, b);
    dereg_mr(mr);
    ok("type 2: rebound under ibv_inc_rkey, then ibv_dealloc_mw: its rkey is refused");

    /* Refusals. */
    errno = 0;
    CHECK(!ibv_alloc_mw(b->pd, 3) && errno == EINVAL, "ibv_alloc_mw(type 3): errno %d", errno);
    struct ibv_mr *plain = reg_mr(b, t, BUF);
    mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
    CHECK(mw, "ibv_alloc_mw: %s", strerror(errno));
    post_bind(b, mw, ibv_inc_rkey(mw->rkey), plain, t, BUF);
    poll_one(b, &wc, "bind to an MR without MW_BIND");
    CHECK(wc.wr_id == 31 && wc.status == IBV_WC_MW_BIND_ERR, "bind without MW_BIND: %s",
          wc_str(&wc));
    fresh(a, b);
    check_rc(ibv_dealloc_mw(mw), "ibv_dealloc_mw");
    dereg_mr(plain);
    free(t);
    ok("ibv_alloc_mw(3): EINVAL; a bind to an MR without MW_BIND: IBV_WC_MW_BIND_ERR");
}

/* IBV_WR_SEND_WITH_INV of `inv` from a into a receive WR of b (200 bytes). */
static void send_inv(struct end *a, struct end *b, struct ibv_mr *src, struct ibv_mr *rmr,
                     uint8_t *r, uint32_t inv)
{
    memset(r, 0, BUF);
    post_recv_wr(b, 51, r, BUF, rmr);
    post_send_wr(a, IBV_WR_SEND_WITH_INV, 52, src->addr, 200, src, 0, 0, inv, IBV_SEND_SIGNALED);
}

static void remote_inv(struct end *a, struct end *b, struct ibv_mr *src)
{
    uint8_t *t = alloc_buf(BUF, 0), *r = alloc_buf(BUF, 0);
    struct ibv_mr *mr = ibv_reg_mr(b->pd, t, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    CHECK(mr, "ibv_reg_mr(MW_BIND): %s", strerror(errno));
    struct ibv_mr *rmr = reg_mr(b, r, BUF);
    struct ibv_mw *mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2);
    CHECK(mw, "ibv_alloc_mw(type 2): %s", strerror(errno));
    uint32_t rkey = ibv_inc_rkey(mw->rkey);
    struct ibv_wc wc;
    post_bind(b, mw, rkey, mr, t, BUF);
    expect_wc(b, &wc, 31, IBV_WC_BIND_MW, "IBV_WR_BIND_MW");
    write_expect(a, src, 64, (uintptr_t)t, rkey, IBV_WC_SUCCESS, "WRITE before SEND_WITH_INV");

    send_inv(a, b, src, rmr, r, rkey);
    expect_wc(a, &wc, 52, IBV_WC_SEND, "IBV_WR_SEND_WITH_INV");
    expect_wc(b, &wc, 51, IBV_WC_RECV, "the receive of a SEND_WITH_INV");
    CHECK(wc.byte_len == 200 && (wc.wc_flags & IBV_WC_WITH_INV) &&
              !(wc.wc_flags & IBV_WC_WITH_IMM) && wc.invalidated_rkey == rkey,
          "the receive of a SEND_WITH_INV: %s, wc_flags %#x, invalidated_rkey %#x (rkey %#x)",
          wc_str(&wc), wc.wc_flags, wc.invalidated_rkey, rkey);
    CHECK(memcmp(r, src->addr, 200) == 0 && all(r + 200, BUF - 200, 0),
          "the receive of a SEND_WITH_INV: bytes");
    write_expect(a, src, 8, (uintptr_t)t, rkey, IBV_WC_REM_ACCESS_ERR,
                 "WRITE through a remotely invalidated window");
    fresh(a, b);
    /* The MR no longer has a window bound: ibv_rereg_mr is no longer refused (EBUSY). */
    check_rc(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND),
             "ibv_rereg_mr after the remote invalidation");
    ok("IBV_WR_SEND_WITH_INV: bytes arrive, IBV_WC_WITH_INV with invalidated_rkey %#x, then "
       "IBV_WC_REM_ACCESS_ERR through the window",
       rkey);

    rkey = ibv_inc_rkey(rkey);
    post_bind(b, mw, rkey, mr, t, BUF);
    expect_wc(b, &wc, 31, IBV_WC_BIND_MW, "IBV_WR_BIND_MW again");
    send_inv(a, b, src, rmr, r, rmr->rkey);
    poll_one(a, &wc, "SEND_WITH_INV of an MR's rkey");
    CHECK(wc.wr_id == 52 && wc.status == IBV_WC_REM_OP_ERR, "the SEND: %s", wc_str(&wc));
    poll_one(b, &wc, "receive WR of a refused SEND_WITH_INV");
    CHECK(wc.wr_id == 51 && wc.status == IBV_WC_LOC_PROT_ERR, "the receive WR: %s", wc_str(&wc));
    CHECK(all(r, BUF, 0), "the refused SEND_WITH_INV wrote bytes");
    fresh(a, b);
    write_expect(a, src, 8, (uintptr_t)t, rkey, IBV_WC_SUCCESS,
                 "WRITE through the window after a refused SEND_WITH_INV");
    ok("SEND_WITH_INV of an MR's rkey: IBV_WC_REM_OP_ERR and IBV_WC_LOC_PROT_ERR, nothing "
       "written, the window still bound");
    check_rc(ibv_dealloc_mw(mw), "ibv_dealloc_mw");
    dereg_mr(rmr);
    dereg_mr(mr);
    free(r);
    free(t);
}

int main(void)
{
    test_start("mem_windows");
    struct end a, b;
    pair_open(&a, &b, NULL);
    struct ibv_device_attr da;
    check_rc(ibv_query_device(b.ctx, &da), "ibv_query_device");
    CHECK((da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
              (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) && da.max_mw > 0,
          "device_cap_flags %#x, max_mw %d", da.device_cap_flags, da.max_mw);
    ok("ibv_query_device: MEM_WINDOW, MEM_WINDOW_TYPE_2B, max_mw %d", da.max_mw);
    uint8_t *s = alloc_buf(BUF, 0);
    for (int k = 0; k < BUF; k++)
        s[k] = (uint8_t)(k * 13 + 5);
    struct ibv_mr *src = reg_mr(&a, s, BUF);
    rereg(&a, &b, src);
    type1(&a, &b, src);
    type2(&a, &b, src);
    remote_inv(&a, &b, src);
    dereg_mr(src);
    free(s);
    pair_close(&a, &b);
    printf("mem_windows: PASS\n");
    return 0;
}
