/* Raw packet QPs (root; as another user only the EPERM refusal is checked): a raw QP on bluerdma0 sends whole Ethernet frames through the
 * simple NIC, byte for byte:
 * - the frame is one this test builds by hand: a RoCE v2-style UD datagram (Ethernet,
 *   IPv4, UDP to port 4792, BTH 0x64, DETH, payload, ICRC computed here), which the UD QP
 *   on bluerdma1 receives: byte_len 40 + payload, src_qp as in the DETH, the payload
 *   intact; the raw send completes with IBV_WC_SEND and the frame's length;
 * - a frame with a wrong ICRC is dropped by the receiver (nothing arrives);
 * - refusals: a post before RTS, an opcode other than SEND, a frame shorter than an
 *   Ethernet header or longer than 2048 bytes (EINVAL, bad_wr); caps beyond the device and
 *   INIT without a port (EINVAL);
 * - receive WRs are kept (no flow rules) and flushed with IBV_WC_WR_FLUSH_ERR at ERR. */
#define _GNU_SOURCE
#include "pair.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QKEY 0x11111111u
#define BUF 4096
#define PAYLOAD 1000
#define SRC_QP 0x00800123u

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    return crc;
}

/* RoCE v2 ICRC over the IPv4 header .. payload: eight 0xFF bytes, then the packet with IPv4
 * TOS, TTL and checksum, the UDP checksum and BTH byte 4 set to ones. */
static uint32_t icrc(const uint8_t *ip, size_t n)
{
    static const size_t masked[] = {1, 8, 10, 11, 26, 27, 32};
    uint8_t head[40];
    memcpy(head, ip, sizeof head);
    for (size_t k = 0; k < sizeof masked / sizeof masked[0]; k++)
        head[masked[k]] = 0xFF;
    uint8_t ones[8];
    memset(ones, 0xFF, sizeof ones);
    uint32_t crc = crc32_update(0xFFFFFFFFu, ones, 8);
    crc = crc32_update(crc, head, sizeof head);
    crc = crc32_update(crc, ip + sizeof head, n - sizeof head);
    return ~crc;
}

static uint16_t ip_checksum(const uint8_t *h)
{
    uint32_t s = 0;
    for (int i = 0; i < 20; i += 2)
        s += (uint32_t)(h[i] << 8 | h[i + 1]);
    while (s >> 16)
        s = (s & 0xFFFF) + (s >> 16);
    return (uint16_t)~s;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { put16(p, v >> 16); put16(p + 2, (uint16_t)v); }

/* A UD datagram frame from `src` to QP `dqpn` at `dst` with `len` payload bytes of `seed`. */
static size_t ud_frame(uint8_t *f, const union ibv_gid *src, const union ibv_gid *dst,
                       uint32_t dqpn, size_t len, uint8_t seed)
{
    memset(f, 0, 64);
    memset(f, 0xFF, 6);                    /* broadcast destination MAC */
    f[6] = 0x02, f[11] = 0x01;             /* a locally administered source MAC */
    put16(f + 12, 0x0800);
    uint8_t *ip = f + 14;
    size_t ip_len = 20 + 8 + 12 + 8 + len + 4;
    ip[0] = 0x45;
    put16(ip + 2, (uint16_t)ip_len);
    put16(ip + 6, 0x4000);                 /* DF */
    ip[8] = 64, ip[9] = 17;
    memcpy(ip + 12, src->raw + 12, 4);
    memcpy(ip + 16, dst->raw + 12, 4);
    put16(ip + 10, ip_checksum(ip));
    uint8_t *udp = ip + 20;
    put16(udp, 0xC123);
    put16(udp + 2, 4792);
    put16(udp + 4, (uint16_t)(ip_len - 20));
    uint8_t *bth = udp + 8;
    bth[0] = 0x64;                         /* UD SEND_ONLY */
    put16(bth + 2, 0xFFFF);                /* P_Key */
    put32(bth + 4, dqpn & 0xFFFFFF);
    put32(bth + 8, 7);                     /* PSN */
    uint8_t *deth = bth + 12;
    put32(deth, QKEY);
    put32(deth + 4, SRC_QP);
    uint8_t *pay = deth + 8;
    for (size_t k = 0; k < len; k++)
        pay[k] = (uint8_t)(k * 7 + seed);
    uint32_t c = icrc(ip, ip_len - 4);
    uint8_t *t = pay + len;
    t[0] = (uint8_t)c, t[1] = (uint8_t)(c >> 8), t[2] = (uint8_t)(c >> 16), t[3] = (uint8_t)(c >> 24);
    return 14 + ip_len;
}

static void to(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *name)
{
    int rc = ibv_modify_qp(qp, a, mask);
    CHECK(rc == 0, "ibv_modify_qp(-> %s): %d (%s)", name, rc, strerror(rc));
}

static struct ibv_qp *ud_qp(struct end *e)
{
    struct ibv_qp_init_attr ia = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_UD,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 8, .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(e->pd, &ia);
    CHECK(qp, "ibv_create_qp(UD): %s", strerror(errno));
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
    to(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "INIT");
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
    to(qp, &a, IBV_QP_STATE, "RTR");
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
    to(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
    return qp;
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, struct ibv_mr *mr, void *addr,
                uint32_t len, uint64_t wr_id, struct ibv_send_wr **bad)
{
    struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED};
    *bad = NULL;
    int rc = ibv_post_send(qp, &wr, bad);
    if (rc)
        CHECK(*bad != NULL, "a refused post names no bad_wr");
    return rc;
}

int main(void)
{
    test_start("raw_qp");
    struct end a, b;
    pair_open(&a, &b, NULL);
    struct ibv_qp_init_attr ia = {.send_cq = a.cq, .recv_cq = a.cq,
                                  .qp_type = IBV_QPT_RAW_PACKET,
                                  .cap = {.max_send_wr = 9000, .max_recv_wr = 4,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    if (geteuid() != 0) {
        errno = 0;
        CHECK(!ibv_create_qp(a.pd, &ia) && errno == EPERM, "raw QP as non-root: errno %d", errno);
        printf("raw_qp: not root: only the EPERM refusal is checked\n");
        pair_close(&a, &b);
        return 0;
    }
    errno = 0;
    CHECK(!ibv_create_qp(a.pd, &ia) && errno == EINVAL, "raw QP of 9000 WRs: errno %d", errno);
    ia.cap.max_send_wr = 8;
    struct ibv_qp *raw = ibv_create_qp(a.pd, &ia);
    CHECK(raw && raw->qp_type == IBV_QPT_RAW_PACKET && raw->state == IBV_QPS_RESET,
          "ibv_create_qp(RAW_PACKET): %s", strerror(errno));
    uint8_t *fb = alloc_buf(BUF, 0);
    struct ibv_mr *fm = reg_mr(&a, fb, BUF);
    struct ibv_send_wr *bad;
    CHECK(post(raw, IBV_WR_SEND, fm, fb, 100, 1, &bad) == EINVAL, "a post in RESET");
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    CHECK(ibv_modify_qp(raw, &at, IBV_QP_STATE) == EINVAL, "INIT without a port");
    to(raw, &at, IBV_QP_STATE | IBV_QP_PORT, "INIT");
    /* A receive WR is kept: no flow rule ever fills it. */
    struct ibv_sge rs = {.addr = (uintptr_t)fb, .length = 64, .lkey = fm->lkey};
    struct ibv_recv_wr rw = {.wr_id = 99, .sg_list = &rs, .num_sge = 1};
    struct ibv_recv_wr *rbad = NULL;
    check_rc(ibv_post_recv(raw, &rw, &rbad), "ibv_post_recv(raw)");
    at = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
    to(raw, &at, IBV_QP_STATE, "RTR");
    at = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
    to(raw, &at, IBV_QP_STATE, "RTS");
    ok("raw packet QP: caps beyond the device EINVAL, RESET post EINVAL, INIT needs the port");

    struct ibv_qp *ud = ud_qp(&b);
    uint8_t *rb = alloc_buf(BUF, 0);
    struct ibv_mr *rm = reg_mr(&b, rb, BUF);
    struct ibv_wc wc;
    for (int round = 0; round < 3; round++) {
        struct end rx = b;
        rx.qp = ud;
        memset(rb, 0, BUF);
        post_recv_wr(&rx, 10 + round, rb, BUF, rm);
        size_t n = ud_frame(fb, &a.gid, &b.gid, ud->qp_num, PAYLOAD + round, (uint8_t)round);
        check_rc(post(raw, IBV_WR_SEND, fm, fb, (uint32_t)n, 20 + round, &bad), "raw post");
        struct end tx = a;
        tx.qp = raw;
        expect_wc(&tx, &wc, 20 + round, IBV_WC_SEND, "raw send");
        CHECK(wc.byte_len == n, "raw send byte_len %u, frame %zu", wc.byte_len, n);
        expect_wc(&rx, &wc, 10 + round, IBV_WC_RECV, "UD receive of the raw frame");
        CHECK(wc.byte_len == 40 + PAYLOAD + round && wc.src_qp == SRC_QP,
              "UD receive: byte_len %u src_qp %#x", wc.byte_len, wc.src_qp);
        CHECK(memcmp(rb + 40, fb + 62, PAYLOAD + round) == 0, "UD receive: payload differs");
    }
    ok("3 hand-built UD frames sent raw: IBV_WC_SEND with the frame length; the UD QP on "
       "bluerdma1 got each payload byte for byte, src_qp from the DETH");

    /* A corrupted ICRC: dropped by the receiver. */
    struct end rx = b;
    rx.qp = ud;
    post_recv_wr(&rx, 30, rb, BUF, rm);
    size_t n = ud_frame(fb, &a.gid, &b.gid, ud->qp_num, 64, 9);
    fb[n - 1] ^= 0x5A;
    check_rc(post(raw, IBV_WR_SEND, fm, fb, (uint32_t)n, 31, &bad), "raw post (bad ICRC)");
    struct end tx = a;
    tx.qp = raw;
    expect_wc(&tx, &wc, 31, IBV_WC_SEND, "raw send (bad ICRC)");
    /* A good frame after it is the next one the UD QP receives. */
    n = ud_frame(fb, &a.gid, &b.gid, ud->qp_num, 77, 3);
    check_rc(post(raw, IBV_WR_SEND, fm, fb, (uint32_t)n, 32, &bad), "raw post");
    expect_wc(&tx, &wc, 32, IBV_WC_SEND, "raw send");
    expect_wc(&rx, &wc, 30, IBV_WC_RECV, "UD receive after a bad frame");
    CHECK(wc.byte_len == 40 + 77, "the bad frame was received (byte_len %u)", wc.byte_len);
    ok("a frame with a wrong ICRC is dropped by the receiver; the next one arrives");

    CHECK(post(raw, IBV_WR_RDMA_WRITE, fm, fb, 100, 40, &bad) == EINVAL, "raw WRITE");
    CHECK(post(raw, IBV_WR_SEND, fm, fb, 10, 41, &bad) == EINVAL, "a 10-byte frame");
    CHECK(post(raw, IBV_WR_SEND, fm, fb, 2049, 42, &bad) == EINVAL, "a 2049-byte frame");
    expect_no_wc(&a, "after refused raw posts");
    ok("raw posts refused: RDMA_WRITE, 10 and 2049 bytes (EINVAL, bad_wr)");

    at = (struct ibv_qp_attr){.qp_state = IBV_QPS_ERR};
    to(raw, &at, IBV_QP_STATE, "ERR");
    poll_one(&a, &wc, "the raw QP's receive WR");
    CHECK(wc.wr_id == 99 && wc.status == IBV_WC_WR_FLUSH_ERR, "raw receive WR at ERR: %s",
          wc_str(&wc));
    ok("the raw QP's receive WR is flushed at ERR");
    check_rc(ibv_destroy_qp(raw), "ibv_destroy_qp(raw)");
    check_rc(ibv_destroy_qp(ud), "ibv_destroy_qp(UD)");
    dereg_mr(fm);
    dereg_mr(rm);
    free(fb);
    free(rb);
    pair_close(&a, &b);
    printf("raw_qp: PASS\n");
    return 0;
}
