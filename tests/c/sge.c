/* Send requests with several SGEs (up to 6; the card takes one buffer per request, the
 * library splits WRITE and READ into one request per SGE and gathers SEND and
 * WRITE_WITH_IMM into one message):
 * - WRITE of 3 SGEs (odd sizes and offsets) lands contiguously at the remote address;
 * - READ of 3 SGEs scatters the remote bytes into the three local pieces;
 * - SEND of 6 SGEs arrives as one message, byte_len the sum, bytes in SGE order;
 * - WRITE_WITH_IMM of 2 SGEs: one receive completion, byte_len the sum, the immediate;
 * - 1500 SENDs of 3 SGEs (9 KiB each, 13 MiB through the library's 4 MiB gather ring, so it
 *   wraps and reuses buffers the card is done with) each checked at the receiver;
 * - ibv_query_qp reports max_send_sge >= 6; 7 SGEs are refused;
 * - receive WRs of 3 SGEs take SENDs scattered over their pieces, byte_len the message's,
 *   1500 of them (13 MiB through the library's 4 MiB bounce ring, so it wraps), every byte
 *   checked and nothing written past a piece or into a piece the message did not reach. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define BUF (8 << 20)
#define CANARY 0x77

static void post_sges(struct end *e, enum ibv_wr_opcode op, uint64_t wr_id, struct ibv_sge *sg,
                      int n, uint64_t raddr, uint32_t rkey, uint32_t imm)
{
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = n, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = imm};
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(e->qp, &wr, &bad);
    CHECK(rc == 0, "ibv_post_send(opcode %d, %d SGEs): %d (%s)", op, n, rc, strerror(rc));
}

int main(void)
{
    test_start("sge");
    struct end a, b;
    struct ibv_mr *amr, *bmr;
    struct pair_opts o = {.max_send_wr = 256, .max_recv_wr = 256, .max_send_sge = 6,
                          .max_recv_sge = 3};
    pair_open_mrs(&a, &b, &o, BUF, &amr, &bmr);
    uint8_t *abuf = amr->addr, *bbuf = bmr->addr;
    struct ibv_wc wc;

    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    check_rc(ibv_query_qp(a.qp, &attr, IBV_QP_CAP, &init), "ibv_query_qp");
    CHECK(init.cap.max_send_sge >= 6, "max_send_sge %u < 6", init.cap.max_send_sge);

    /* WRITE of 3 SGEs -> contiguous at b + 100. */
    uint32_t wl[3] = {1000, 4097, 3};
    size_t woff[3] = {7, 20000, 50001};
    struct ibv_sge sg[7];
    uint32_t total = 0;
    for (int k = 0; k < 3; k++) {
        pattern_fill(abuf + woff[k], wl[k], 10 + k);
        sg[k] = (struct ibv_sge){(uintptr_t)(abuf + woff[k]), wl[k], amr->lkey};
        total += wl[k];
    }
    memset(bbuf, CANARY, 100000);
    post_sges(&a, IBV_WR_RDMA_WRITE, 1, sg, 3, (uintptr_t)(bbuf + 100), bmr->rkey, 0);
    expect_wc(&a, &wc, 1, IBV_WC_RDMA_WRITE, "WRITE of 3 SGEs");
    expect_no_wc(&a, "one completion for the split WRITE");
    size_t at = 100;
    for (int k = 0; k < 3; k++) {
        CHECK(region_check(bbuf + at, 0, wl[k], 10 + k, CANARY, 0, 0, "WRITE piece") == 0,
              "WRITE of 3 SGEs: piece %d differs", k);
        at += wl[k];
    }
    CHECK(bbuf[99] == CANARY && bbuf[at] == CANARY, "WRITE of 3 SGEs wrote outside its range");
    ok("WRITE of 3 SGEs (%u B) contiguous at the remote address", total);

    /* READ of 3 SGEs: b's bytes at 200000.. scattered into a's three pieces. */
    uint32_t rl[3] = {5000, 1, 70000};
    size_t roff[3] = {300000, 400003, 500000};
    pattern_fill(bbuf + 200000, 75001, 99);
    memset(abuf + 300000, CANARY, 300000);
    for (int k = 0; k < 3; k++)
        sg[k] = (struct ibv_sge){(uintptr_t)(abuf + roff[k]), rl[k], amr->lkey};
    post_sges(&a, IBV_WR_RDMA_READ, 2, sg, 3, (uintptr_t)(bbuf + 200000), bmr->rkey, 0);
    expect_wc(&a, &wc, 2, IBV_WC_RDMA_READ, "READ of 3 SGEs");
    expect_no_wc(&a, "one completion for the split READ");
    at = 200000;
    for (int k = 0; k < 3; k++) {
        CHECK(memcmp(abuf + roff[k], bbuf + at, rl[k]) == 0, "READ of 3 SGEs: piece %d differs",
              k);
        CHECK(abuf[roff[k] + rl[k]] == CANARY, "READ piece %d overran", k);
        at += rl[k];
    }
    ok("READ of 3 SGEs scattered");

    /* SEND of 6 SGEs and WRITE_WITH_IMM of 2. */
    memset(bbuf, CANARY, 200000);
    post_recv_wr(&b, 10, bbuf, 100000, bmr);
    post_recv_wr(&b, 11, bbuf + 100000, 100, bmr);
    total = 0;
    for (int k = 0; k < 6; k++) {
        uint32_t len = 100 + 1000 * k;
        pattern_fill(abuf + 1000000 + k * 10000, len, 30 + k);
        sg[k] = (struct ibv_sge){(uintptr_t)(abuf + 1000000 + k * 10000), len, amr->lkey};
        total += len;
    }
    post_sges(&a, IBV_WR_SEND, 3, sg, 6, 0, 0, 0);
    expect_wc(&a, &wc, 3, IBV_WC_SEND, "SEND of 6 SGEs");
    expect_wc(&b, &wc, 10, IBV_WC_RECV, "SEND of 6 SGEs");
    CHECK(wc.byte_len == total, "SEND of 6 SGEs: byte_len %u, expected %u", wc.byte_len, total);
    at = 0;
    for (int k = 0; k < 6; k++) {
        uint32_t len = 100 + 1000 * k;
        CHECK(region_check(bbuf + at, 0, len, 30 + k, CANARY, 0, 0, "SEND piece") == 0,
              "SEND of 6 SGEs: piece %d differs", k);
        at += len;
    }
    ok("SEND of 6 SGEs arrived as one %u-byte message", total);
    sg[1] = sg[5];
    post_sges(&a, IBV_WR_RDMA_WRITE_WITH_IMM, 4, sg, 2, (uintptr_t)(bbuf + 150000), bmr->rkey,
              htonl(0xC0FFEE));
    expect_wc(&a, &wc, 4, IBV_WC_RDMA_WRITE, "WRITE_WITH_IMM of 2 SGEs");
    expect_wc(&b, &wc, 11, IBV_WC_RECV_RDMA_WITH_IMM, "WRITE_WITH_IMM of 2 SGEs");
    CHECK(wc.byte_len == 100 + 5100 && ntohl(wc.imm_data) == 0xC0FFEE,
          "WRITE_WITH_IMM of 2 SGEs: byte_len %u, imm %#x", wc.byte_len, ntohl(wc.imm_data));
    ok("WRITE_WITH_IMM of 2 SGEs: one completion, byte_len %u", wc.byte_len);

    /* 7 SGEs: refused. */
    for (int k = 0; k < 7; k++)
        sg[k] = (struct ibv_sge){(uintptr_t)abuf, 1, amr->lkey};
    struct ibv_send_wr w7 = {.wr_id = 5, .sg_list = sg, .num_sge = 7, .opcode = IBV_WR_SEND};
    struct ibv_send_wr *bad = NULL;
    CHECK(ibv_post_send(a.qp, &w7, &bad) != 0 && bad == &w7, "7 SGEs were not refused");

    /* Many gathered SENDs: the gather ring wraps. */
    enum { N = 1500, PIECE = 3000, MSG = 3 * PIECE, WINDOW = 64 };
    uint32_t posted = 0, done = 0;
    while (done < N) {
        while (posted < N && posted - done < WINDOW) {
            post_recv_wr(&b, 100 + posted, bbuf + (size_t)(posted % WINDOW) * MSG, MSG, bmr);
            uint8_t *src = abuf + (size_t)(posted % WINDOW) * MSG;
            pattern_fill(src, MSG, 1000 + posted);
            for (int k = 0; k < 3; k++)
                sg[k] = (struct ibv_sge){(uintptr_t)(src + k * PIECE), PIECE, amr->lkey};
            post_sges(&a, IBV_WR_SEND, 100 + posted, sg, 3, 0, 0, 0);
            posted++;
        }
        expect_wc(&a, &wc, 100 + done, IBV_WC_SEND, "gathered SEND");
        expect_wc(&b, &wc, 100 + done, IBV_WC_RECV, "gathered SEND");
        CHECK(wc.byte_len == MSG, "gathered SEND #%u: byte_len %u", done, wc.byte_len);
        CHECK(region_check(bbuf + (size_t)(done % WINDOW) * MSG, 0, MSG, 1000 + done, 0, 0, 0,
                           "gathered SEND") == 0,
              "gathered SEND #%u differs", done);
        done++;
    }
    ok("%d SENDs of 3 SGEs through the gather ring, every byte checked", N);

    /* Receive WRs of 3 SGEs: each message is scattered over pieces at odd places of b's
     * buffer; a short message fills the first pieces only. */
    enum { RPIECE = 3001, RSLOT = 3 * 4096 };
    posted = done = 0;
    while (done < N) {
        while (posted < N && posted - done < WINDOW) {
            uint8_t *slot = bbuf + (size_t)(posted % WINDOW) * RSLOT;
            memset(slot, CANARY, RSLOT);
            struct ibv_sge rs[3];
            for (int k = 0; k < 3; k++)
                rs[k] = (struct ibv_sge){(uintptr_t)(slot + 7 + k * 4096), RPIECE, bmr->lkey};
            struct ibv_recv_wr rw = {.wr_id = 5000 + posted, .sg_list = rs, .num_sge = 3};
            struct ibv_recv_wr *rbad = NULL;
            check_rc(ibv_post_recv(b.qp, &rw, &rbad), "ibv_post_recv(3 SGEs)");
            uint32_t len = posted % 3 == 2 ? RPIECE + 10 : 3 * RPIECE;
            uint8_t *src = abuf + (size_t)(posted % WINDOW) * RSLOT;
            pattern_fill(src, len, 2000 + posted);
            post_send_wr(&a, IBV_WR_SEND, 5000 + posted, src, len, amr, 0, 0, 0,
                         IBV_SEND_SIGNALED);
            posted++;
        }
        uint32_t len = done % 3 == 2 ? RPIECE + 10 : 3 * RPIECE;
        expect_wc(&a, &wc, 5000 + done, IBV_WC_SEND, "SEND into 3 SGEs");
        expect_wc(&b, &wc, 5000 + done, IBV_WC_RECV, "SEND into 3 SGEs");
        CHECK(wc.byte_len == len, "SEND #%u into 3 SGEs: byte_len %u, expected %u", done,
              wc.byte_len, len);
        uint8_t *slot = bbuf + (size_t)(done % WINDOW) * RSLOT;
        uint8_t expect[3 * RPIECE];
        pattern_fill(expect, len, 2000 + done);
        for (int k = 0; k < 3; k++) {
            uint32_t off = k * RPIECE, n = len > off ? len - off : 0;
            n = n > RPIECE ? RPIECE : n;
            char what[64];
            snprintf(what, sizeof what, "SEND #%u piece %d", done, k);
            CHECK(hexdiff(expect + off, slot + 7 + k * 4096, n, what) == 0, "%s differs", what);
            CHECK(fill_check(slot + 7 + k * 4096 + n, RPIECE - n + 1, CANARY, what) == 0,
                  "%s: written past the message", what);
        }
        done++;
    }
    ok("%d SENDs into receive WRs of 3 SGEs through the bounce ring, every byte checked", N);

    pair_finish(&a, &b, amr, bmr);
    printf("PASS sge\n");
    return 0;
}
