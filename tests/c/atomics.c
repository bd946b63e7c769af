/* Atomics between bluerdma0 and bluerdma1 in one process (the responder's driver executes
 * them; the card has none):
 * - ibv_query_device and ibv_query_device_ex report atomic_cap IBV_ATOMIC_HCA;
 * - ibv_post_send of IBV_WR_ATOMIC_FETCH_AND_ADD and IBV_WR_ATOMIC_CMP_AND_SWP, both ways
 *   (after ibv_modify_qp RTS -> RTS grants IBV_ACCESS_REMOTE_ATOMIC): the completion is
 *   IBV_WC_FETCH_ADD / IBV_WC_COMP_SWAP with byte_len 8, the sink holds the original value,
 *   the target the new one, the bytes around both are untouched; a CAS that does not match
 *   leaves the target alone;
 * - a WRITE and a FETCH_AND_ADD on the same 8 bytes posted in one chain: the atomic sees the
 *   WRITE's value;
 * - 60 fetch-and-adds in one chain (more than max_qp_rd_atom in flight) complete in order,
 *   each seeing the one before;
 * - the ibv_wr_* API on a QP made with IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | FETCH_AND_ADD;
 * - ibv_post_send refuses a misaligned remote address, an SGE that is not 8 bytes and two
 *   SGEs with EINVAL and bad_wr;
 * - a responder QP without REMOTE_ATOMIC, and a bad rkey: IBV_WC_REM_ACCESS_ERR, the
 *   requester's QP in IBV_QPS_ERR, the target untouched. */
#define _GNU_SOURCE
#include "pair.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define BUF 4096
#define ATOMIC_MR (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

struct side {
    struct end *e;
    uint64_t *buf;
    struct ibv_mr *mr;
};

static void side_open(struct side *s, struct end *e)
{
    s->e = e;
    s->buf = alloc_buf(BUF, 0);
    s->mr = ibv_reg_mr(e->pd, s->buf, BUF, ATOMIC_MR);
    CHECK(s->mr, "ibv_reg_mr(%s, REMOTE_ATOMIC): %s", e->name, strerror(errno));
}

/* RTS -> RTS: the QP grants `access` to its peer. */
static void grant(struct ibv_qp *qp, const char *name, unsigned access)
{
    struct ibv_qp_attr a = {.qp_access_flags = access};
    int rc = ibv_modify_qp(qp, &a, IBV_QP_ACCESS_FLAGS);
    CHECK(rc == 0, "ibv_modify_qp(%s, RTS -> RTS, access %#x): %s", name, access, strerror(rc));
}

/* Posts an atomic on `qp` whose original value of `raddr` goes to `sink`. */
static int post_atomic(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, uint64_t *sink,
                       uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t cmp_add,
                       uint64_t swap, struct ibv_send_wr *next)
{
    struct ibv_sge sge = {.addr = (uintptr_t)sink, .length = 8, .lkey = lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED, .next = next};
    wr.wr.atomic.remote_addr = raddr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = cmp_add;
    wr.wr.atomic.swap = swap;
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(qp, &wr, &bad);
}

/* The next completion of `e` is a successful atomic `wr_id` of `qp` with byte_len 8. */
static void expect_atomic_of(struct end *e, struct ibv_qp *qp, uint64_t wr_id,
                             enum ibv_wc_opcode op, const char *what)
{
    struct ibv_wc wc;
    poll_one(e, &wc, what);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id && wc.opcode == op &&
              wc.qp_num == qp->qp_num && wc.byte_len == 8,
          "%s: %s (expected wr_id %#llx, opcode %d, byte_len 8)", what, wc_str(&wc),
          (unsigned long long)wr_id, op);
}

static void expect_atomic(struct end *e, uint64_t wr_id, enum ibv_wc_opcode op, const char *what)
{
    expect_atomic_of(e, e->qp, wr_id, op, what);
}

/* FAA and CAS from `from` to `to`, checked in the sink, the target and around them. */
static void basics(struct side *from, struct side *to)
{
    uint64_t raddr = (uintptr_t)&to->buf[1];
    to->buf[1] = 0x0101010101010101ull;
    check_rc(post_atomic(from->e->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, &from->buf[2],
                         from->mr->lkey, raddr, to->mr->rkey, 0x0202020202020202ull, 0, NULL),
             "ibv_post_send(FETCH_AND_ADD)");
    expect_atomic(from->e, 1, IBV_WC_FETCH_ADD, "fetch-and-add");
    CHECK(from->buf[2] == 0x0101010101010101ull, "FAA original %#llx",
          (unsigned long long)from->buf[2]);
    CHECK(to->buf[1] == 0x0303030303030303ull, "FAA result %#llx",
          (unsigned long long)to->buf[1]);
    CHECK(to->buf[0] == 0 && to->buf[2] == 0 && from->buf[1] == 0 && from->buf[3] == 0,
          "bytes around the sink or the target changed");

    check_rc(post_atomic(from->e->qp, IBV_WR_ATOMIC_CMP_AND_SWP, 2, &from->buf[3],
                         from->mr->lkey, raddr, to->mr->rkey, 0x0303030303030303ull, 7, NULL),
             "ibv_post_send(CMP_AND_SWP)");
    expect_atomic(from->e, 2, IBV_WC_COMP_SWAP, "compare-and-swap (match)");
    CHECK(from->buf[3] == 0x0303030303030303ull && to->buf[1] == 7, "CAS: original %#llx, now %llu",
          (unsigned long long)from->buf[3], (unsigned long long)to->buf[1]);
    check_rc(post_atomic(from->e->qp, IBV_WR_ATOMIC_CMP_AND_SWP, 3, &from->buf[3],
                         from->mr->lkey, raddr, to->mr->rkey, 8, 9, NULL),
             "ibv_post_send(CMP_AND_SWP)");
    expect_atomic(from->e, 3, IBV_WC_COMP_SWAP, "compare-and-swap (no match)");
    CHECK(from->buf[3] == 7 && to->buf[1] == 7, "CAS without a match: original %llu, now %llu",
          (unsigned long long)from->buf[3], (unsigned long long)to->buf[1]);
    expect_no_wc(to->e, "the target of atomics");
    ok("%s -> %s: FETCH_AND_ADD and CMP_AND_SWP (match, no match), byte_len 8", from->e->name,
       to->e->name);
}

/* A WRITE then a FETCH_AND_ADD on the same 8 bytes, in one chain. */
static void after_write(struct side *a, struct side *b)
{
    a->buf[8] = 1000;
    b->buf[4] = 5;
    struct ibv_sge sge = {.addr = (uintptr_t)&a->buf[8], .length = 8, .lkey = a->mr->lkey};
    struct ibv_send_wr faa_wr;
    struct ibv_sge faa_sge = {.addr = (uintptr_t)&a->buf[9], .length = 8, .lkey = a->mr->lkey};
    memset(&faa_wr, 0, sizeof faa_wr);
    faa_wr.wr_id = 11;
    faa_wr.sg_list = &faa_sge;
    faa_wr.num_sge = 1;
    faa_wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    faa_wr.send_flags = IBV_SEND_SIGNALED;
    faa_wr.wr.atomic.remote_addr = (uintptr_t)&b->buf[4];
    faa_wr.wr.atomic.rkey = b->mr->rkey;
    faa_wr.wr.atomic.compare_add = 1;
    struct ibv_send_wr wr = {.wr_id = 10, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                             .next = &faa_wr};
    wr.wr.rdma.remote_addr = (uintptr_t)&b->buf[4];
    wr.wr.rdma.rkey = b->mr->rkey;
    struct ibv_send_wr *bad = NULL;
    check_rc(ibv_post_send(a->e->qp, &wr, &bad), "ibv_post_send(WRITE, FETCH_AND_ADD)");
    struct ibv_wc wc;
    expect_wc(a->e, &wc, 10, IBV_WC_RDMA_WRITE, "the WRITE before the atomic");
    expect_atomic(a->e, 11, IBV_WC_FETCH_ADD, "the atomic after the WRITE");
    CHECK(a->buf[9] == 1000 && b->buf[4] == 1001,
          "the atomic after a WRITE saw %llu (the WRITE wrote 1000), left %llu",
          (unsigned long long)a->buf[9], (unsigned long long)b->buf[4]);
    ok("a FETCH_AND_ADD after a WRITE to the same bytes sees the WRITE");
}

/* 60 fetch-and-adds in one chain. */
static void many(struct side *a, struct side *b)
{
    enum { N = 60 }; /* the QP holds 64 */
    static struct ibv_send_wr wrs[N];
    static struct ibv_sge sges[N];
    b->buf[5] = 0;
    for (int k = 0; k < N; k++) {
        sges[k] = (struct ibv_sge){(uintptr_t)&a->buf[64 + k], 8, a->mr->lkey};
        memset(&wrs[k], 0, sizeof wrs[k]);
        wrs[k].wr_id = 100 + k;
        wrs[k].sg_list = &sges[k];
        wrs[k].num_sge = 1;
        wrs[k].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wrs[k].send_flags = IBV_SEND_SIGNALED;
        wrs[k].wr.atomic.remote_addr = (uintptr_t)&b->buf[5];
        wrs[k].wr.atomic.rkey = b->mr->rkey;
        wrs[k].wr.atomic.compare_add = 1;
        wrs[k].next = k + 1 < N ? &wrs[k + 1] : NULL;
    }
    struct ibv_send_wr *bad = NULL;
    check_rc(ibv_post_send(a->e->qp, wrs, &bad), "ibv_post_send(60 x FETCH_AND_ADD)");
    for (int k = 0; k < N; k++)
        expect_atomic(a->e, 100 + k, IBV_WC_FETCH_ADD, "one of 60 fetch-and-adds");
    for (int k = 0; k < N; k++)
        CHECK(a->buf[64 + k] == (uint64_t)k, "fetch-and-add %d saw %llu", k,
              (unsigned long long)a->buf[64 + k]);
    CHECK(b->buf[5] == N, "60 fetch-and-adds of 1 left %llu", (unsigned long long)b->buf[5]);
    ok("60 fetch-and-adds in one chain complete in order, each seeing the one before");
}

/* ibv_post_send's refusals. */
static void refusals(struct side *a, struct side *b)
{
    uint64_t raddr = (uintptr_t)&b->buf[6];
    int rc = post_atomic(a->e->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, 20, &a->buf[10], a->mr->lkey,
                         raddr + 4, b->mr->rkey, 1, 0, NULL);
    CHECK(rc == EINVAL, "a misaligned remote address: ibv_post_send returned %d", rc);
    struct ibv_sge sge[2] = {{(uintptr_t)&a->buf[10], 4, a->mr->lkey},
                             {(uintptr_t)&a->buf[11], 8, a->mr->lkey}};
    struct ibv_send_wr wr = {.wr_id = 21, .sg_list = sge, .num_sge = 1,
                             .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.wr.atomic.remote_addr = raddr;
    wr.wr.atomic.rkey = b->mr->rkey;
    struct ibv_send_wr *bad = NULL;
    CHECK(ibv_post_send(a->e->qp, &wr, &bad) == EINVAL && bad == &wr,
          "an SGE of 4 bytes is not refused with EINVAL and bad_wr");
    sge[0].length = 8;
    wr.num_sge = 2;
    bad = NULL;
    CHECK(ibv_post_send(a->e->qp, &wr, &bad) == EINVAL && bad == &wr,
          "two SGEs are not refused with EINVAL and bad_wr");
    CHECK(b->buf[6] == 0, "a refused atomic changed the target");
    expect_no_wc(a->e, "after refused posts");
    ok("ibv_post_send refuses a misaligned address, a 4-byte SGE and two SGEs (EINVAL)");
}

/* The ibv_wr_* API on an extended QP with both atomic send ops. */
static void wr_api(struct side *a, struct side *b)
{
    struct ibv_qp_init_attr_ex ia = {
        .send_cq = a->e->cq,
        .recv_cq = a->e->cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .pd = a->e->pd,
        .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
    };
    struct ibv_qp *qa = ibv_create_qp_ex(a->e->ctx, &ia);
    CHECK(qa, "ibv_create_qp_ex(RC, CMP_AND_SWP | FETCH_AND_ADD): %s", strerror(errno));
    struct ibv_qp_init_attr ib = {.send_cq = b->e->cq, .recv_cq = b->e->cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_recv_wr = 16,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qb = ibv_create_qp(b->e->pd, &ib);
    CHECK(qb, "ibv_create_qp(%s): %s", b->e->name, strerror(errno));
    pair_connect(a->e, qa, b->e, qb);
    grant(qb, b->e->name, ATOMIC_MR | IBV_ACCESS_REMOTE_READ);
    struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qa);
    CHECK(x, "ibv_qp_to_qp_ex");
    b->buf[7] = 40;
    ibv_wr_start(x);
    x->wr_id = 30;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_fetch_add(x, b->mr->rkey, (uintptr_t)&b->buf[7], 2);
    ibv_wr_set_sge(x, a->mr->lkey, (uintptr_t)&a->buf[12], 8);
    x->wr_id = 31;
    ibv_wr_atomic_cmp_swp(x, b->mr->rkey, (uintptr_t)&b->buf[7], 42, 99);
    ibv_wr_set_sge(x, a->mr->lkey, (uintptr_t)&a->buf[13], 8);
    check_rc(ibv_wr_complete(x), "ibv_wr_complete(FETCH_AND_ADD, CMP_AND_SWP)");
    expect_atomic_of(a->e, qa, 30, IBV_WC_FETCH_ADD, "ibv_wr_atomic_fetch_add");
    expect_atomic_of(a->e, qa, 31, IBV_WC_COMP_SWAP, "ibv_wr_atomic_cmp_swp");
    CHECK(a->buf[12] == 40 && a->buf[13] == 42 && b->buf[7] == 99,
          "ibv_wr_* atomics: originals %llu, %llu, now %llu", (unsigned long long)a->buf[12],
          (unsigned long long)a->buf[13], (unsigned long long)b->buf[7]);
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp(extended)");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    ok("ibv_wr_atomic_fetch_add and ibv_wr_atomic_cmp_swp on an extended QP");
}

/* An atomic the responder refuses on a new QP pair: REM_ACCESS_ERR, requester QP to ERR. */
static void refused(struct side *a, struct side *b, int grant_atomic, uint32_t rkey,
                    const char *what)
{
    struct ibv_qp *qa, *qb;
    pair_extra_qps(a->e, b->e, &qa, &qb);
    if (grant_atomic)
        grant(qb, b->e->name, ATOMIC_MR | IBV_ACCESS_REMOTE_READ);
    b->buf[15] = 42;
    check_rc(post_atomic(qa, IBV_WR_ATOMIC_FETCH_AND_ADD, 40, &a->buf[14], a->mr->lkey,
                         (uintptr_t)&b->buf[15], rkey, 1, 0, NULL),
             "ibv_post_send(FETCH_AND_ADD)");
    struct ibv_wc wc;
    poll_one(a->e, &wc, what);
    CHECK(wc.wr_id == 40 && wc.status == IBV_WC_REM_ACCESS_ERR, "%s: %s", what, wc_str(&wc));
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    check_rc(ibv_query_qp(qa, &attr, IBV_QP_STATE, &init), "ibv_query_qp");
    CHECK(attr.qp_state == IBV_QPS_ERR, "%s: the requester's QP is in state %d", what,
          attr.qp_state);
    CHECK(b->buf[15] == 42, "%s: the target changed to %llu", what,
          (unsigned long long)b->buf[15]);
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    ok("%s: IBV_WC_REM_ACCESS_ERR, requester QP in ERR, target untouched", what);
}

int main(void)
{
    test_start("atomics");
    struct end a, b;
    pair_open(&a, &b, NULL);
    struct ibv_device_attr da;
    check_rc(ibv_query_device(a.ctx, &da), "ibv_query_device");
    CHECK(da.atomic_cap == IBV_ATOMIC_HCA, "atomic_cap %d", da.atomic_cap);
    struct ibv_device_attr_ex dx;
    check_rc(ibv_query_device_ex(b.ctx, NULL, &dx), "ibv_query_device_ex");
    CHECK(dx.orig_attr.atomic_cap == IBV_ATOMIC_HCA, "atomic_cap (ex) %d", dx.orig_attr.atomic_cap);
    ok("atomic_cap IBV_ATOMIC_HCA (ibv_query_device, ibv_query_device_ex)");

    struct side sa, sb;
    side_open(&sa, &a);
    side_open(&sb, &b);
    unsigned all = ATOMIC_MR | IBV_ACCESS_REMOTE_READ;
    grant(a.qp, a.name, all);
    grant(b.qp, b.name, all);
    basics(&sa, &sb);
    memset(sa.buf, 0, BUF);
    memset(sb.buf, 0, BUF);
    basics(&sb, &sa);
    after_write(&sa, &sb);
    many(&sa, &sb);
    refusals(&sa, &sb);
    wr_api(&sa, &sb);
    refused(&sa, &sb, 0, sb.mr->rkey, "a responder QP without REMOTE_ATOMIC");
    refused(&sa, &sb, 1, sb.mr->rkey ^ 0x5a, "a bad rkey");

    dereg_mr(sa.mr);
    dereg_mr(sb.mr);
    pair_close(&a, &b);
    printf("atomics: PASS\n");
    return 0;
}
