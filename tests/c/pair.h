/* The setup every C ibverbs test shares: open bluerdma0 and bluerdma1 in this process,
 * make a PD, a CQ (optionally on a completion channel) and an RC QP on each, connect the two
 * QPs to each other through the GIDs (INIT -> RTR with a GRH -> RTS), and post and poll with
 * bounded waits.
 *
 * Every helper that fails prints `<test>: FAIL: <what>` on stderr, naming the verb, the
 * errno and its strerror, or the completion's status (ibv_wc_status_str), opcode and wr_id,
 * and exits 1. Every wait ends after WAIT_MS; a watchdog (WATCHDOG_S) ends a test that is
 * stuck anywhere else, so a bug fails the test instead of hanging it. */
#ifndef BLUERDMA_TESTS_PAIR_H
#define BLUERDMA_TESTS_PAIR_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

/* How long one completion (or one event) may take. */
#define WAIT_MS 10000
/* How long a whole test may take. */
#define WATCHDOG_S 120

/* One side of the connection. */
struct end {
    const char *name; /* "bluerdma0" or "bluerdma1" */
    struct ibv_context *ctx;
    struct ibv_comp_channel *channel; /* NULL unless asked for */
    struct ibv_pd *pd;
    struct ibv_cq *cq; /* send and receive CQ */
    struct ibv_qp *qp;
    struct ibv_srq *srq; /* the QP's shared receive queue, when asked for */
    union ibv_gid gid; /* GID index 0 of port 1 */
    uint32_t psn;      /* the first PSN this side sends */
};

struct pair_opts {
    int channel;          /* make a completion channel per side and put the CQ on it */
    uint32_t max_send_wr; /* 0: 64 */
    uint32_t max_recv_wr; /* 0: 64 */
    uint32_t max_send_sge; /* 0: 1 */
    uint32_t max_recv_sge; /* 0: 1 */
    uint32_t srq_wr;      /* > 0: b's QP takes receives from an SRQ of this many WRs */
};

/* Names the test in messages, line-buffers stdout and arms the watchdog. */
void test_start(const char *name);

/* Prints `<test>: FAIL: <message>` on stderr and exits 1. */
void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Fails with the message unless `cond` holds. */
#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond))                                                                        \
            fail(__VA_ARGS__);                                                              \
    } while (0)

/* Fails naming `verb` when `rc` (a verb's errno-style result) is not 0. */
void check_rc(int rc, const char *verb);

/* Prints `ok   <message>` on stdout. */
void ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Opens both devices and connects a QP on `a` (bluerdma0) to one on `b` (bluerdma1). */
void pair_open(struct end *a, struct end *b, const struct pair_opts *opts);

/* Another connected QP pair on the same ends, with the options of pair_open (b's on b's SRQ
 * when it has one); both QPs share their end's CQ. Destroy them with ibv_destroy_qp before
 * pair_close. */
void pair_extra_qps(struct end *a, struct end *b, struct ibv_qp **aqp, struct ibv_qp **bqp);

/* Connects QP `qa` of `a` to QP `qb` of `b` (both in RESET), as pair_open connects its. */
void pair_connect(struct end *a, struct ibv_qp *qa, struct end *b, struct ibv_qp *qb);

/* Expects a failing verb: `rc` (its return, or -1 for a NULL object) and errno must both
 * say `want`. */
void expect_errno(int rc, int want, const char *what);

/* Destroys what pair_open made (and checks each destroy verb succeeds). */
void pair_close(struct end *a, struct end *b);

/* `len` bytes aligned to a page, filled with `fill`. */
void *alloc_buf(size_t len, uint8_t fill);

/* Registers `len` bytes at `buf` on `e` for local write, remote write and remote read. */
struct ibv_mr *reg_mr(struct end *e, void *buf, size_t len);

/* Deregisters `mr`; fails if the verb does. */
void dereg_mr(struct ibv_mr *mr);

/* pair_open, then a zeroed, page-aligned buffer of `len` bytes registered on each side. */
void pair_open_mrs(struct end *a, struct end *b, const struct pair_opts *opts, size_t len,
                   struct ibv_mr **amr, struct ibv_mr **bmr);

/* Deregisters and frees the buffers of pair_open_mrs, then pair_close. */
void pair_finish(struct end *a, struct end *b, struct ibv_mr *amr, struct ibv_mr *bmr);

/* One transfer of a size/offset table: `len` bytes from `src_off` of the source buffer to
 * `dst_off` of the target buffer. */
struct shot {
    uint32_t len;
    size_t src_off, dst_off;
};

/* What one shot does: from `from` (its buffer `src`) to `to` (`dst`); `n` numbers it. */
typedef void shot_fn(struct end *from, struct ibv_mr *src, struct end *to, struct ibv_mr *dst,
                     const struct shot *s, uint32_t n);

/* The whole of test `name`: opens the pair with a buffer of `buf_len` bytes on each side,
 * runs every shot a -> b and b -> a (numbered from 1), checks no completion is left over,
 * closes the pair and prints PASS; returns 0 (the exit status). */
int shots_test(const char *name, size_t buf_len, const struct shot *shots, size_t count,
               shot_fn *one);

/* Posts one send-queue request of `len` bytes at `laddr` (in `mr`; no SGE when `mr` is NULL)
 * to `raddr`/`rkey`; `imm` is the immediate in network order; `flags` are send flags. */
void post_send_wr(struct end *e, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr,
                  uint32_t len, const struct ibv_mr *mr, uint64_t raddr, uint32_t rkey,
                  uint32_t imm, unsigned flags);

/* Posts one receive of `len` bytes at `addr` (in `mr`; no SGE when `mr` is NULL). */
void post_recv_wr(struct end *e, uint64_t wr_id, void *addr, uint32_t len,
                  const struct ibv_mr *mr);

/* Polls `e`'s CQ until a completion arrives; fails after WAIT_MS naming `what`. */
void poll_one(struct end *e, struct ibv_wc *wc, const char *what);

/* poll_one, then fails unless the completion succeeded with `wr_id` and `opcode`. */
void expect_wc(struct end *e, struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_opcode opcode,
               const char *what);

/* Fails if `e`'s CQ holds a completion now. */
void expect_no_wc(struct end *e, const char *what);

/* "status <str> (<n>), opcode <n>, wr_id <n>, byte_len <n>, ..." for messages. */
const char *wc_str(const struct ibv_wc *wc);

#endif
