/* Parent domains between bluerdma0 and bluerdma1 in one process:
 * - ibv_alloc_parent_domain refuses a NULL PD, a parent domain as the PD, a thread domain,
 *   an unknown comp_mask bit and ALLOCATORS without a free function (EINVAL each);
 * - on each side a parent domain with counting allocators (posix_memalign) over the pair's
 *   PD: an RC QP and an MR made on it name it (qp->pd, mr->pd); an inline SEND and a SEND
 *   gathered from three SGEs (the QP's inline and gather rings, which the allocator places:
 *   it is called with the parent domain, its pd_context and resource type 1) arrive byte
 *   for byte; a WRITE from the parent domain's MR into an MR of the protection domain,
 *   and one from a QP of the protection domain into the parent domain's MR, land;
 * - ibv_dealloc_pd of the protection domain while the parent domain lives, and of the
 *   parent while its QP lives: EBUSY; after the QP is destroyed every allocation was freed;
 * - a parent domain whose allocator answers IBV_ALLOCATOR_USE_DEFAULT carries traffic too;
 * - ibv_create_cq_ex with IBV_CQ_INIT_ATTR_MASK_PD takes a parent domain and refuses a
 *   plain PD (EINVAL). */
#define _GNU_SOURCE
#include "pair.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF 8192
#define MAX_ALLOCS 16

/* What one side's allocator saw. */
struct pool {
    struct ibv_pd *parent; /* the parent domain it serves (set once made) */
    int use_default;       /* answer IBV_ALLOCATOR_USE_DEFAULT */
    int calls, allocs, frees, wrong;
    void *live[MAX_ALLOCS];
};

static void *pool_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
    struct pool *p = ctx;
    p->calls++;
    if (pd != p->parent || type != 1 || align == 0 || (align & (align - 1)))
        p->wrong++;
    if (p->use_default)
        return IBV_ALLOCATOR_USE_DEFAULT;
    void *mem = NULL;
    if (p->allocs >= MAX_ALLOCS || posix_memalign(&mem, align, size) != 0)
        return NULL;
    p->live[p->allocs++] = mem;
    return mem;
}

static void pool_free(struct ibv_pd *pd, void *ctx, void *ptr, uint64_t type)
{
    struct pool *p = ctx;
    int found = 0;
    for (int i = 0; i < p->allocs; i++) {
        if (p->live[i] == ptr) {
            p->live[i] = NULL;
            found = 1;
        }
    }
    if (!found || pd != p->parent || type != 1)
        p->wrong++;
    p->frees++;
    free(ptr);
}

static struct ibv_pd *parent_of(struct end *e, struct pool *p)
{
    struct ibv_parent_domain_init_attr a = {
        .pd = e->pd,
        .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
        .alloc = pool_alloc,
        .free = pool_free,
        .pd_context = p,
    };
    struct ibv_pd *pd = ibv_alloc_parent_domain(e->ctx, &a);
    CHECK(pd, "ibv_alloc_parent_domain(%s): %s", e->name, strerror(errno));
    CHECK(pd->context == e->ctx, "the parent domain's context");
    p->parent = pd;
    return pd;
}

static struct ibv_qp *qp_on(struct end *e, struct ibv_pd *pd)
{
    struct ibv_qp_init_attr init = {
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 3, .max_recv_sge = 1,
                .max_inline_data = 64},
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    CHECK(qp, "ibv_create_qp(%s, on a parent domain): %s", e->name, strerror(errno));
    CHECK(qp->pd == pd, "qp->pd is %p, not the parent domain %p", (void *)qp->pd, (void *)pd);
    return qp;
}

static void refusals(struct end *a)
{
    struct ibv_parent_domain_init_attr at = {.pd = NULL};
    expect_errno(ibv_alloc_parent_domain(a->ctx, &at) ? 0 : -1, EINVAL, "parent of a NULL PD");
    at.pd = a->pd;
    at.td = (struct ibv_td *)a->pd;
    expect_errno(ibv_alloc_parent_domain(a->ctx, &at) ? 0 : -1, EINVAL, "a thread domain");
    at.td = NULL;
    at.comp_mask = 1 << 5;
    expect_errno(ibv_alloc_parent_domain(a->ctx, &at) ? 0 : -1, EINVAL, "comp_mask 1 << 5");
    at.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
    at.alloc = pool_alloc;
    expect_errno(ibv_alloc_parent_domain(a->ctx, &at) ? 0 : -1, EINVAL, "alloc without free");
    at.comp_mask = 0;
    struct ibv_pd *pd = ibv_alloc_parent_domain(a->ctx, &at);
    CHECK(pd, "ibv_alloc_parent_domain without allocators: %s", strerror(errno));
    at.pd = pd;
    expect_errno(ibv_alloc_parent_domain(a->ctx, &at) ? 0 : -1, EINVAL,
                 "a parent domain of a parent domain");
    check_rc(ibv_dealloc_pd(pd), "ibv_dealloc_pd(parent domain)");
    ok("ibv_alloc_parent_domain refuses NULL PD, td, unknown comp_mask, alloc without free, "
       "a parent as the PD (EINVAL)");
}

/* SENDs and WRITEs on QPs `qa`/`qb` (on parent domains) with `amr` on the parent domain
 * of a and `bmr` on b's protection domain (or parent). */
static void traffic(struct end *a, struct ibv_qp *qa, struct end *b, struct ibv_qp *qb,
                    struct ibv_mr *amr, struct ibv_mr *bmr, const char *what)
{
    uint8_t *src = amr->addr, *dst = bmr->addr;
    struct ibv_qp *sa = a->qp, *sb = b->qp;
    a->qp = qa;
    b->qp = qb;
    struct ibv_wc wc;
    for (int i = 0; i < BUF; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    memset(dst, 0, BUF);

    /* Inline SEND of 40 bytes. */
    post_recv_wr(b, 10, dst, 64, bmr);
    post_send_wr(a, IBV_WR_SEND, 11, src, 40, amr, 0, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    expect_wc(a, &wc, 11, IBV_WC_SEND, "inline SEND");
    expect_wc(b, &wc, 10, IBV_WC_RECV, "inline SEND's receive");
    CHECK(wc.byte_len == 40 && memcmp(dst, src, 40) == 0 && dst[40] == 0,
          "%s: inline SEND: byte_len %u or bytes differ", what, wc.byte_len);

    /* SEND gathered from three SGEs. */
    memset(dst, 0, BUF);
    struct ibv_sge sges[3] = {
        {.addr = (uintptr_t)src + 100, .length = 1000, .lkey = amr->lkey},
        {.addr = (uintptr_t)src + 3000, .length = 17, .lkey = amr->lkey},
        {.addr = (uintptr_t)src + 5000, .length = 2000, .lkey = amr->lkey},
    };
    struct ibv_send_wr wr = {.wr_id = 12, .sg_list = sges, .num_sge = 3, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad = NULL;
    post_recv_wr(b, 13, dst, BUF, bmr);
    check_rc(ibv_post_send(qa, &wr, &bad), "ibv_post_send(SEND of 3 SGEs)");
    expect_wc(a, &wc, 12, IBV_WC_SEND, "gathered SEND");
    expect_wc(b, &wc, 13, IBV_WC_RECV, "gathered SEND's receive");
    CHECK(wc.byte_len == 3017 && memcmp(dst, src + 100, 1000) == 0 &&
              memcmp(dst + 1000, src + 3000, 17) == 0 && memcmp(dst + 1017, src + 5000, 2000) == 0 &&
              dst[3017] == 0,
          "%s: gathered SEND: byte_len %u or bytes differ", what, wc.byte_len);

    /* WRITE both ways. */
    memset(dst, 0, BUF);
    post_send_wr(a, IBV_WR_RDMA_WRITE, 14, src + 1, 4000, amr, (uintptr_t)dst + 3, bmr->rkey, 0,
                 IBV_SEND_SIGNALED);
    expect_wc(a, &wc, 14, IBV_WC_RDMA_WRITE, "WRITE a -> b");
    CHECK(memcmp(dst + 3, src + 1, 4000) == 0 && dst[2] == 0 && dst[4003] == 0,
          "%s: WRITE a -> b: bytes differ", what);
    memset(src, 0, BUF);
    post_send_wr(b, IBV_WR_RDMA_WRITE, 15, dst + 3, 4000, bmr, (uintptr_t)src + 8, amr->rkey, 0,
                 IBV_SEND_SIGNALED);
    expect_wc(b, &wc, 15, IBV_WC_RDMA_WRITE, "WRITE b -> a");
    CHECK(memcmp(src + 8, dst + 3, 4000) == 0 && src[7] == 0 && src[4008] == 0,
          "%s: WRITE b -> a: bytes differ", what);
    expect_no_wc(a, what);
    expect_no_wc(b, what);
    a->qp = sa;
    b->qp = sb;
    ok("%s: inline SEND, SEND of 3 SGEs, WRITE both ways: completions and bytes", what);
}

static void cq_ex(struct end *a, struct ibv_pd *parent)
{
    struct ibv_cq_init_attr_ex at = {
        .cqe = 16,
        .wc_flags = IBV_WC_STANDARD_FLAGS,
        .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
        .parent_domain = parent,
    };
    struct ibv_cq_ex *cq = ibv_create_cq_ex(a->ctx, &at);
    CHECK(cq, "ibv_create_cq_ex(parent domain): %s", strerror(errno));
    check_rc(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), "ibv_destroy_cq");
    at.parent_domain = a->pd;
    expect_errno(ibv_create_cq_ex(a->ctx, &at) ? 0 : -1, EINVAL, "create_cq_ex with a plain PD");
    ok("ibv_create_cq_ex: IBV_CQ_INIT_ATTR_MASK_PD with a parent domain, EINVAL with a plain PD");
}

int main(void)
{
    test_start("parent_domain");
    struct end a, b;
    pair_open(&a, &b, NULL);
    refusals(&a);

    struct pool pa = {0}, pb = {0};
    struct ibv_pd *par_a = parent_of(&a, &pa), *par_b = parent_of(&b, &pb);
    struct ibv_qp *qa = qp_on(&a, par_a), *qb = qp_on(&b, par_b);
    pair_connect(&a, qa, &b, qb);
    void *abuf = alloc_buf(BUF, 0), *bbuf = alloc_buf(BUF, 0);
    struct ibv_mr *amr = ibv_reg_mr(par_a, abuf, BUF,
                                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(amr && amr->pd == par_a, "ibv_reg_mr on the parent domain: %s", strerror(errno));
    struct ibv_mr *bmr = reg_mr(&b, bbuf, BUF);
    traffic(&a, qa, &b, qb, amr, bmr, "QPs on parent domains");
    CHECK(pa.allocs == 2 && pb.allocs == 0 && pa.wrong == 0,
          "allocator calls: a %d (expected 2: inline and gather ring), b %d, wrong %d", pa.allocs,
          pb.allocs, pa.wrong);
    ok("the parent domain's allocator placed the inline and gather rings (2 calls, its pd, "
       "pd_context and resource type 1)");

    /* The pair's own QPs (protection domain) with the parent domain's MR. */
    traffic(&a, a.qp, &b, b.qp, amr, bmr, "QPs on the protection domains, MR on a parent");

    expect_errno(ibv_dealloc_pd(a.pd), EBUSY, "dealloc the PD under a parent domain");
    expect_errno(ibv_dealloc_pd(par_a), EBUSY, "dealloc a parent domain its QP uses");
    dereg_mr(amr);
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp(a, parent)");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp(b, parent)");
    CHECK(pa.frees == 2 && pa.wrong == 0, "after destroy_qp: %d frees of 2, wrong %d", pa.frees,
          pa.wrong);
    ok("dealloc_pd EBUSY under a parent domain and its QP; the QP's rings freed through it");
    cq_ex(&a, par_a);
    check_rc(ibv_dealloc_pd(par_a), "ibv_dealloc_pd(parent a)");
    check_rc(ibv_dealloc_pd(par_b), "ibv_dealloc_pd(parent b)");

    /* USE_DEFAULT. */
    struct pool da = {.use_default = 1}, db = {.use_default = 1};
    par_a = parent_of(&a, &da);
    par_b = parent_of(&b, &db);
    qa = qp_on(&a, par_a);
    qb = qp_on(&b, par_b);
    pair_connect(&a, qa, &b, qb);
    amr = reg_mr(&a, abuf, BUF);
    traffic(&a, qa, &b, qb, amr, bmr, "allocator answering USE_DEFAULT");
    CHECK(da.calls == 2 && da.allocs == 0 && da.wrong == 0,
          "USE_DEFAULT pool: %d calls (expected 2), %d allocations", da.calls, da.allocs);
    dereg_mr(amr);
    dereg_mr(bmr);
    check_rc(ibv_destroy_qp(qa), "ibv_destroy_qp");
    check_rc(ibv_destroy_qp(qb), "ibv_destroy_qp");
    CHECK(da.frees == 0, "USE_DEFAULT pool freed %d", da.frees);
    check_rc(ibv_dealloc_pd(par_a), "ibv_dealloc_pd(parent a)");
    check_rc(ibv_dealloc_pd(par_b), "ibv_dealloc_pd(parent b)");
    free(abuf);
    free(bbuf);
    pair_close(&a, &b);
    printf("parent_domain: PASS\n");
    return 0;
}
