/* Many rounds of RDMA WRITE from bluerdma0 to bluerdma1 with CQ moderation, as perftest does:
 * rounds go in batches of MODERATION; only the last WRITE of a batch is signaled, so the
 * writer must see exactly one completion per batch (its wr_id) and none for the unsignaled
 * ones. Every round writes its own slot with its own pattern, length and offsets; when the
 * batch's completion arrives, every slot of the batch is checked (RC completes in order, so
 * the signaled WRITE's completion stands for the whole batch) with the guard bytes around
 * it. Then RDMA READs from bluerdma1 into bluerdma0: single ones of several sizes, and a
 * chain of READs posted in one ibv_post_send with only the last signaled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define ROUNDS 1000
#define MODERATION 20
#define SLOT (64 * 1024 + 128)
#define MAX_LEN (64 * 1024)
#define GUARD 32
#define CANARY 0x99
#define MIB (1024 * 1024)
#define READ_BUF (2 * MIB)

/* A small deterministic generator for lengths and offsets. */
static uint32_t next_rand(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

struct round {
    uint32_t len, src_off, dst_off;
};

static void write_rounds(struct end *a, struct ibv_mr *amr, struct end *b, struct ibv_mr *bmr)
{
    uint8_t *src = amr->addr, *dst = bmr->addr;
    struct round r[MODERATION];
    uint32_t rng = 0x2545F491;
    for (uint32_t first = 0; first < ROUNDS; first += MODERATION) {
        memset(dst, CANARY, MODERATION * SLOT);
        for (uint32_t k = 0; k < MODERATION; k++) {
            uint32_t n = first + k;
            uint32_t x = next_rand(&rng);
            /* Mostly small, sometimes a full 64 KiB, now and then exactly one MTU. */
            r[k].len = x % 8 == 0 ? MAX_LEN : x % 8 == 1 ? 4096 : 1 + next_rand(&rng) % MAX_LEN;
            r[k].src_off = next_rand(&rng) % (SLOT - MAX_LEN);
            r[k].dst_off = GUARD + next_rand(&rng) % (SLOT - MAX_LEN - 2 * GUARD);
            pattern_fill(src + k * SLOT + r[k].src_off, r[k].len, n);
            post_send_wr(a, IBV_WR_RDMA_WRITE, n, src + k * SLOT + r[k].src_off, r[k].len, amr,
                         (uintptr_t)dst + k * SLOT + r[k].dst_off, bmr->rkey, 0,
                         k == MODERATION - 1 ? IBV_SEND_SIGNALED : 0);
        }
        uint32_t last = first + MODERATION - 1;
        char what[120];
        snprintf(what, sizeof what, "WRITE rounds %u..%u (only %u signaled)", first, last, last);
        struct ibv_wc wc;
        expect_wc(a, &wc, last, IBV_WC_RDMA_WRITE, what);
        expect_no_wc(a, what);
        expect_no_wc(b, what);
        for (uint32_t k = 0; k < MODERATION; k++) {
            uint8_t *d = dst + k * SLOT;
            char round[120];
            snprintf(round, sizeof round, "WRITE round %u of %u B (src +%u, dst +%u)", first + k,
                     r[k].len, r[k].src_off, r[k].dst_off);
            size_t bad = region_check(d, r[k].dst_off, r[k].len, first + k, CANARY, r[k].dst_off,
                                      SLOT - r[k].dst_off - r[k].len, round);
            CHECK(bad == 0, "%s: the target differs from what was written (%zu bytes)", round,
                  bad);
        }
    }
    ok("%d WRITE rounds, one completion per %d", ROUNDS, MODERATION);
}

/* READs of `len` bytes at `off` of bluerdma1's buffer into bluerdma0's at `off`. */
static void read_one(struct end *a, struct ibv_mr *amr, struct ibv_mr *bmr, uint32_t len,
                     size_t off, uint32_t seed)
{
    uint8_t *local = amr->addr, *remote = bmr->addr;
    char what[120];
    snprintf(what, sizeof what, "READ of %u B at +%#zx from bluerdma1", len, off);
    memset(local, CANARY, READ_BUF);
    pattern_fill(remote + off, len, seed);
    post_send_wr(a, IBV_WR_RDMA_READ, 0x8EAD0000u + seed, local + off, len, amr,
                 (uintptr_t)remote + off, bmr->rkey, 0, IBV_SEND_SIGNALED);
    struct ibv_wc wc;
    expect_wc(a, &wc, 0x8EAD0000u + seed, IBV_WC_RDMA_READ, what);
    CHECK(wc.byte_len == len, "%s: byte_len %u, expected %u: %s", what, wc.byte_len, len,
          wc_str(&wc));
    size_t bad = region_check(local, off, len, seed, CANARY, off, READ_BUF - off - len, what);
    CHECK(bad == 0, "%s: the local buffer differs from the remote one (%zu bytes)", what, bad);
    ok("%s", what);
}

/* Eight READs of 16 KiB + 1 in one ibv_post_send list, only the last signaled. */
static void read_chain(struct end *a, struct ibv_mr *amr, struct end *b, struct ibv_mr *bmr)
{
    enum { N = 8, LEN = 16 * 1024 + 1, STEP = 16 * 1024 + 64 };
    uint8_t *local = amr->addr, *remote = bmr->addr;
    struct ibv_sge sge[N];
    struct ibv_send_wr wr[N];
    memset(local, CANARY, READ_BUF);
    for (int i = 0; i < N; i++) {
        pattern_fill(remote + i * STEP, LEN, 500 + i);
        sge[i] = (struct ibv_sge){(uintptr_t)local + i * STEP, LEN, amr->lkey};
        wr[i] = (struct ibv_send_wr){
            .wr_id = 0xC4A10000u + i,
            .next = i + 1 < N ? &wr[i + 1] : NULL,
            .sg_list = &sge[i],
            .num_sge = 1,
            .opcode = IBV_WR_RDMA_READ,
            .send_flags = i + 1 == N ? IBV_SEND_SIGNALED : 0,
        };
        wr[i].wr.rdma.remote_addr = (uintptr_t)remote + i * STEP;
        wr[i].wr.rdma.rkey = bmr->rkey;
    }
    struct ibv_send_wr *bad_wr = NULL;
    int rc = ibv_post_send(a->qp, wr, &bad_wr);
    CHECK(rc == 0, "ibv_post_send(a chain of %d READs) returned %d (%s), bad_wr %s", N, rc,
          strerror(rc), bad_wr ? "set" : "NULL");
    struct ibv_wc wc;
    expect_wc(a, &wc, 0xC4A10000u + N - 1, IBV_WC_RDMA_READ, "the last READ of the chain");
    expect_no_wc(a, "after the chain of READs");
    expect_no_wc(b, "after the chain of READs");
    size_t bad = 0;
    for (int i = 0; i < N; i++) {
        char what[64];
        snprintf(what, sizeof what, "READ %d of the chain", i);
        bad += region_check(local, i * STEP, LEN, 500 + i, CANARY, 0, STEP - LEN, what);
    }
    CHECK(bad == 0, "a chain of %d READs: the local buffer differs (%zu bytes)", N, bad);
    ok("a chain of %d READs of %d B, one completion", N, LEN);
}

int main(void)
{
    test_start("multi_round_write");
    struct end a, b;
    struct pair_opts o = {.max_send_wr = 128};
    struct ibv_mr *amr, *bmr;
    size_t len = MODERATION * SLOT > READ_BUF ? MODERATION * SLOT : READ_BUF;
    pair_open_mrs(&a, &b, &o, len, &amr, &bmr);

    write_rounds(&a, amr, &b, bmr);
    read_one(&a, amr, bmr, 1, 0, 1);
    read_one(&a, amr, bmr, 4096, 0, 2);
    read_one(&a, amr, bmr, 4096, 4095, 3);
    read_one(&a, amr, bmr, 100000, 13, 4);
    read_one(&a, amr, bmr, MIB + 5, 4099, 5);
    read_chain(&a, amr, &b, bmr);

    pair_finish(&a, &b, amr, bmr);
    printf("PASS multi_round_write: %d WRITE rounds and the READs\n", ROUNDS);
    return 0;
}
