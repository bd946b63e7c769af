/* RDMA_WRITE_WITH_IMM between bluerdma0 and bluerdma1 in one process, 0 B to 1 MiB. The
 * target posts a receive without a buffer (the data goes where the WRITE says; the receive
 * only carries the immediate). The writer's completion is IBV_WC_RDMA_WRITE; the target's is
 * IBV_WC_RECV_RDMA_WITH_IMM with IBV_WC_WITH_IMM, the writer's imm_data (network order,
 * passed through unchanged) and byte_len = the WRITE's length. The target range holds the
 * pattern and the bytes around it are untouched; a zero-length WRITE_WITH_IMM touches none. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define MIB (1024 * 1024)
#define BUF (2 * MIB)
#define GUARD 64
#define CANARY 0x3C

static const struct shot shots[] = {
    {0, 0, 100},   {1, 0, 0},      {1, 9, 4095},     {4096, 0, 0},
    {4096, 5, 17}, {MIB, 0, 4096},  {MIB + 3, 1, 33},
};
#define NSHOTS (sizeof shots / sizeof shots[0])

static void write_imm(struct end *w, struct ibv_mr *src, struct end *t, struct ibv_mr *dst,
                      const struct shot *s, uint32_t n)
{
    uint8_t *sbuf = src->addr, *dbuf = dst->addr;
    uint32_t imm = htonl(0x1000000u * (n & 0xff) + 0xBEEF00u + n);
    char what[160];
    snprintf(what, sizeof what, "WRITE_WITH_IMM #%u of %u B %s+%#zx -> %s+%#zx", n, s->len,
             w->name, s->src_off, t->name, s->dst_off);
    memset(dbuf, CANARY, BUF);
    pattern_fill(sbuf + s->src_off, s->len, n);

    post_recv_wr(t, 0x1AA0000u + n, NULL, 0, NULL);
    post_send_wr(w, IBV_WR_RDMA_WRITE_WITH_IMM, 0xAB0000u + n, sbuf + s->src_off, s->len,
                 s->len ? src : NULL, (uintptr_t)dbuf + s->dst_off, dst->rkey, imm,
                 IBV_SEND_SIGNALED);

    struct ibv_wc wc;
    expect_wc(w, &wc, 0xAB0000u + n, IBV_WC_RDMA_WRITE, what);
    expect_wc(t, &wc, 0x1AA0000u + n, IBV_WC_RECV_RDMA_WITH_IMM, what);
    CHECK(wc.wc_flags & IBV_WC_WITH_IMM, "%s: IBV_WC_WITH_IMM is not set: %s", what,
          wc_str(&wc));
    CHECK(wc.imm_data == imm,
          "%s: imm_data %#x (host order %#x), expected %#x (host order %#x): %s", what,
          wc.imm_data, ntohl(wc.imm_data), imm, ntohl(imm), wc_str(&wc));
    CHECK(wc.byte_len == s->len, "%s: byte_len %u, expected %u: %s", what, wc.byte_len, s->len,
          wc_str(&wc));

    size_t bad = region_check(dbuf, s->dst_off, s->len, n, CANARY, s->dst_off, GUARD, what);
    CHECK(bad == 0, "%s: the target differs from what was written (%zu bytes)", what, bad);
    ok("%s", what);
}

int main(void)
{
    return shots_test("write_with_imm", BUF, shots, NSHOTS, write_imm);
}
