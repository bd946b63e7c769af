/* SEND and SEND_WITH_IMM between bluerdma0 and bluerdma1 in one process. The receiver posts
 * its receives first (several at once, consumed in order); for each message of 0 B, 1 B,
 * 4 KiB, 4 KiB + 1 and 1 MiB the sender's completion is IBV_WC_SEND and the receiver's is
 * IBV_WC_RECV with the message's byte_len, no IBV_WC_WITH_IMM for a plain SEND, and
 * IBV_WC_WITH_IMM with the sender's imm_data (network order, passed through unchanged) for
 * SEND_WITH_IMM. The receive buffer holds the message and nothing past it is touched.
 * Inline data: ibv_query_qp reports max_inline_data >= 64, and SENDs and WRITEs of 1..64 B
 * from unregistered memory in two SGEs with IBV_SEND_INLINE arrive intact even though the
 * source is overwritten right after ibv_post_send returns (what inline allows). */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define MIB (1024 * 1024)
/* Each receive buffer: the largest message and a guard. */
#define SLOT (MIB + 4096)
#define CANARY 0xC3

static const uint32_t sizes[] = {0, 1, 4096, 4097, MIB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Sends every size from `s` to `r`, with or without an immediate; `round` seeds patterns. */
static void round_trip(struct end *s, struct ibv_mr *smr, struct end *r, struct ibv_mr *rmr,
                       int with_imm, uint32_t round)
{
    uint8_t *sbuf = smr->addr, *rbuf = rmr->addr;
    memset(rbuf, CANARY, NSIZES * SLOT);
    /* All receives first: they complete in the order they were posted. */
    for (uint32_t i = 0; i < NSIZES; i++)
        post_recv_wr(r, 0x7EC00000u + round * 16 + i, rbuf + i * SLOT, SLOT, rmr);

    for (uint32_t i = 0; i < NSIZES; i++) {
        uint32_t seed = round * 16 + i, len = sizes[i];
        uint32_t imm = htonl(0xA5000000u | seed);
        uint8_t *src = sbuf + i * SLOT + (i & 1 ? 7 : 0);
        char what[160];
        snprintf(what, sizeof what, "%s #%u of %u B %s -> %s", with_imm ? "SEND_WITH_IMM" : "SEND",
                 seed, len, s->name, r->name);
        pattern_fill(src, len, seed);
        /* A zero-length SEND carries no SGE. wr.rdma means nothing for a SEND: fill it with
         * garbage (an address range that wraps, a random key), as applications may. */
        post_send_wr(s, with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, 0x5E0D0000u + seed, src,
                     len, len ? smr : NULL, 0xFFFFFFFFFFFFF000ull, 0xDEADBEEF,
                     with_imm ? imm : 0, IBV_SEND_SIGNALED);

        struct ibv_wc wc;
        expect_wc(s, &wc, 0x5E0D0000u + seed, IBV_WC_SEND, what);
        expect_wc(r, &wc, 0x7EC00000u + seed, IBV_WC_RECV, what);
        CHECK(wc.byte_len == len, "%s: receive byte_len %u, expected %u: %s", what, wc.byte_len,
              len, wc_str(&wc));
        if (with_imm) {
            CHECK(wc.wc_flags & IBV_WC_WITH_IMM, "%s: IBV_WC_WITH_IMM is not set: %s", what,
                  wc_str(&wc));
            CHECK(wc.imm_data == imm,
                  "%s: imm_data %#x (host order %#x), expected %#x (host order %#x): %s", what,
                  wc.imm_data, ntohl(wc.imm_data), imm, ntohl(imm), wc_str(&wc));
        } else {
            CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "%s: IBV_WC_WITH_IMM set on a plain SEND: %s",
                  what, wc_str(&wc));
        }
        uint8_t *dst = rbuf + i * SLOT;
        size_t bad = region_check(dst, 0, len, seed, CANARY, 0, SLOT - len, what);
        CHECK(bad == 0, "%s: the receive buffer differs from what was sent (%zu bytes)", what,
              bad);
        ok("%s", what);
    }
    expect_no_wc(s, "after the last SEND");
    expect_no_wc(r, "after the last receive");
}

/* Inline SENDs and WRITEs from `s` (stack memory, never registered) into `r`'s MR. */
static void inline_round(struct end *s, struct end *r, struct ibv_mr *rmr)
{
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    check_rc(ibv_query_qp(s->qp, &attr, IBV_QP_CAP, &init), "ibv_query_qp");
    CHECK(init.cap.max_inline_data >= 64, "max_inline_data %u, expected >= 64",
          init.cap.max_inline_data);
    uint8_t *rbuf = rmr->addr;
    static const uint32_t lens[] = {1, 7, 33, 64};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        uint32_t len = lens[k];
        uint8_t src[64];
        char what[120];
        uint32_t seed = 900 + len;
        /* SEND: two SGEs gathered into one message. */
        memset(rbuf, CANARY, 2 * SLOT);
        post_recv_wr(r, 0x1D00 + len, rbuf, SLOT, rmr);
        pattern_fill(src, len, seed);
        uint32_t half = len / 2;
        struct ibv_sge sges[2] = {{.addr = (uintptr_t)src, .length = half},
                                  {.addr = (uintptr_t)(src + half), .length = len - half}};
        struct ibv_send_wr wr = {.wr_id = 0x1E00 + len, .sg_list = sges, .num_sge = 2,
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
        struct ibv_send_wr *bad = NULL;
        int rc = ibv_post_send(s->qp, &wr, &bad);
        CHECK(rc == 0, "inline SEND of %u B: ibv_post_send returned %d (%s)", len, rc,
              strerror(rc));
        memset(src, 0xEE, sizeof src); /* the library copied it already */
        snprintf(what, sizeof what, "inline SEND of %u B %s -> %s", len, s->name, r->name);
        struct ibv_wc wc;
        expect_wc(s, &wc, 0x1E00 + len, IBV_WC_SEND, what);
        expect_wc(r, &wc, 0x1D00 + len, IBV_WC_RECV, what);
        CHECK(wc.byte_len == len, "%s: byte_len %u", what, wc.byte_len);
        CHECK(region_check(rbuf, 0, len, seed, CANARY, 0, SLOT - len, what) == 0,
              "%s: the data differs", what);
        ok("%s", what);
        /* WRITE: one SGE. */
        pattern_fill(src, len, seed + 1);
        struct ibv_sge one = {.addr = (uintptr_t)src, .length = len};
        struct ibv_send_wr w2 = {.wr_id = 0x1F00 + len, .sg_list = &one, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED};
        w2.wr.rdma.remote_addr = (uintptr_t)(rbuf + SLOT);
        w2.wr.rdma.rkey = rmr->rkey;
        rc = ibv_post_send(s->qp, &w2, &bad);
        CHECK(rc == 0, "inline WRITE of %u B: ibv_post_send returned %d (%s)", len, rc,
              strerror(rc));
        memset(src, 0xEE, sizeof src);
        snprintf(what, sizeof what, "inline WRITE of %u B %s -> %s", len, s->name, r->name);
        expect_wc(s, &wc, 0x1F00 + len, IBV_WC_RDMA_WRITE, what);
        CHECK(region_check(rbuf + SLOT, 0, len, seed + 1, CANARY, 0, SLOT - len, what) == 0,
              "%s: the data differs", what);
        ok("%s", what);
    }
}

int main(void)
{
    test_start("send_recv");
    struct end a, b;
    struct ibv_mr *amr, *bmr;
    pair_open_mrs(&a, &b, NULL, NSIZES * SLOT, &amr, &bmr);

    round_trip(&a, amr, &b, bmr, 0, 1);
    round_trip(&b, bmr, &a, amr, 0, 2);
    round_trip(&a, amr, &b, bmr, 1, 3);
    round_trip(&b, bmr, &a, amr, 1, 4);
    inline_round(&a, &b, bmr);

    pair_finish(&a, &b, amr, bmr);
    printf("PASS send_recv: %zu messages\n", 4 * NSIZES);
    return 0;
}
