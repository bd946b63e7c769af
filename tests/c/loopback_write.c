/* RDMA WRITE between bluerdma0 and bluerdma1 in one process: sizes from 1 B to 5 MiB, at
 * page-aligned and odd offsets on both sides, in both directions. Each write is signaled;
 * the writer's completion (IBV_WC_RDMA_WRITE, its wr_id) is checked, the target range must
 * hold the pattern, the bytes around it must be untouched, and the target gets no
 * completion (a plain WRITE consumes no receive). */
#include <stdio.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define MIB (1024 * 1024)
#define BUF (6 * MIB)
/* Bytes before and after the target range that must stay as they were. */
#define GUARD 64
#define CANARY 0x5A

static const struct shot shots[] = {
    {1, 0, 0},
    {1, 4095, 77},
    {4096, 0, 0},
    {4096, 1, 4093},
    {4097, 4000, 123},
    {MIB, 0, 0},
    {MIB + 1, 3, 4097},
    {5 * MIB, 0, 4096},
    {5 * MIB - 7, 123, 4095},
};
#define NSHOTS (sizeof shots / sizeof shots[0])

/* One write of `s` from `from` (buffer `src`) to `to` (buffer `dst`); `n` names it. */
static void write_one(struct end *from, struct ibv_mr *src, struct end *to, struct ibv_mr *dst,
                      const struct shot *s, uint32_t n)
{
    uint8_t *sbuf = src->addr, *dbuf = dst->addr;
    char what[160];
    snprintf(what, sizeof what, "WRITE #%u of %u B %s+%#zx -> %s+%#zx", n, s->len, from->name,
             s->src_off, to->name, s->dst_off);
    pattern_fill(sbuf + s->src_off, s->len, n);
    memset(dbuf, CANARY, BUF);

    post_send_wr(from, IBV_WR_RDMA_WRITE, 0xC0DE0000u + n, sbuf + s->src_off, s->len, src,
                 (uintptr_t)dbuf + s->dst_off, dst->rkey, 0, IBV_SEND_SIGNALED);
    struct ibv_wc wc;
    expect_wc(from, &wc, 0xC0DE0000u + n, IBV_WC_RDMA_WRITE, what);

    size_t before = s->dst_off < GUARD ? s->dst_off : GUARD;
    size_t bad = region_check(dbuf, s->dst_off, s->len, n, CANARY, before, GUARD, what);
    CHECK(bad == 0, "%s: the target differs from what was written (%zu bytes)", what, bad);
    expect_no_wc(to, what);
    ok("%s", what);
}

int main(void)
{
    return shots_test("loopback_write", BUF, shots, NSHOTS, write_one);
}
