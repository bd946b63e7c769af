/* Completion channels on bluerdma0 and bluerdma1 in one process: each CQ is made on its
 * device's channel and armed with ibv_req_notify_cq; a SEND then raises one event on each
 * channel, waited for with poll() on the channel's fd (bounded: WAIT_MS), read with
 * ibv_get_cq_event (which must name the CQ and its cq_context) and acknowledged with
 * ibv_ack_cq_events; the completions are then polled and checked. After draining and
 * re-arming, no event may come without a new completion, and a non-blocking
 * ibv_get_cq_event finds none. Several rounds, the events acknowledged in one call at the
 * end as well as one by one. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pair.h"
#include "verify.h"

#define ROUNDS 10
#define LEN 3000
/* How long "no event" is watched for. */
#define QUIET_MS 100

static void arm(struct end *e)
{
    int rc = ibv_req_notify_cq(e->cq, 0);
    CHECK(rc == 0, "ibv_req_notify_cq(%s) returned %d (%s)", e->name, rc, strerror(rc));
}

/* Waits up to `ms` for `e`'s channel fd to be readable; returns whether it is. */
static int readable(struct end *e, int ms)
{
    struct pollfd p = {.fd = e->channel->fd, .events = POLLIN};
    int n = poll(&p, 1, ms);
    CHECK(n >= 0, "poll(%s's channel fd %d): %s", e->name, p.fd, strerror(errno));
    return n == 1 && (p.revents & POLLIN);
}

/* Waits for one event on `e`'s channel and checks it names `e`'s CQ; returns 1 (to count
 * events not yet acknowledged). */
static unsigned take_event(struct end *e, const char *what)
{
    CHECK(readable(e, WAIT_MS), "no completion event on %s's channel within %d ms (poll) for %s",
          e->name, WAIT_MS, what);
    struct ibv_cq *cq = NULL;
    void *ctx = NULL;
    int rc = ibv_get_cq_event(e->channel, &cq, &ctx);
    CHECK(rc == 0, "ibv_get_cq_event(%s) returned %d (%s) for %s", e->name, rc, strerror(errno),
          what);
    CHECK(cq == e->cq, "ibv_get_cq_event(%s) named CQ %p, expected %p", e->name, (void *)cq,
          (void *)e->cq);
    CHECK(ctx == e, "ibv_get_cq_event(%s) gave cq_context %p, expected %p", e->name, ctx,
          (void *)e);
    return 1;
}

/* Fails if an event is pending on `e`'s channel. */
static void expect_quiet(struct end *e, const char *what)
{
    CHECK(!readable(e, QUIET_MS), "%s: an event on %s's channel without a new completion", what,
          e->name);
    struct ibv_cq *cq = NULL;
    void *ctx = NULL;
    errno = 0;
    int rc = ibv_get_cq_event(e->channel, &cq, &ctx);
    CHECK(rc != 0, "%s: a non-blocking ibv_get_cq_event(%s) returned an event", what, e->name);
    CHECK(errno == EAGAIN || errno == EWOULDBLOCK,
          "%s: a non-blocking ibv_get_cq_event(%s) with no event: errno %d (%s), expected EAGAIN",
          what, e->name, errno, strerror(errno));
}

/* Each CQ was armed while it still held the completion polled next, and a device may raise
 * an event for that (mlx4 and mlx5 do). Takes such an event and re-arms the now empty CQ;
 * then no event may come. Returns the events taken (0 or 1). */
static unsigned settle(struct end *e)
{
    unsigned taken = 0;
    if (readable(e, QUIET_MS)) {
        taken = take_event(e, "a completion present when the CQ was armed");
        arm(e);
        expect_no_wc(e, "an event for a completion present when the CQ was armed");
    }
    expect_quiet(e, "drained, then armed");
    return taken;
}

int main(void)
{
    test_start("event_channel");
    struct end a, b;
    struct pair_opts o = {.channel = 1};
    struct ibv_mr *amr, *bmr;
    pair_open_mrs(&a, &b, &o, LEN, &amr, &bmr);
    uint8_t *abuf = amr->addr, *bbuf = bmr->addr;
    /* Non-blocking channels, as the ibv_get_cq_event man page shows for poll(). */
    for (struct end *e = &a; e; e = e == &a ? &b : NULL) {
        int fl = fcntl(e->channel->fd, F_GETFL);
        CHECK(fl >= 0 && fcntl(e->channel->fd, F_SETFL, fl | O_NONBLOCK) == 0,
              "fcntl(%s's channel fd, O_NONBLOCK): %s", e->name, strerror(errno));
    }

    arm(&a);
    arm(&b);
    expect_quiet(&a, "armed, before any work");
    expect_quiet(&b, "armed, before any work");
    unsigned a_unacked = 0;
    for (uint32_t n = 1; n <= ROUNDS; n++) {
        char what[80];
        snprintf(what, sizeof what, "SEND #%u of %d B bluerdma0 -> bluerdma1", n, LEN);
        post_recv_wr(&b, 0x4EC0000u + n, bbuf, LEN, bmr);
        pattern_fill(abuf, LEN, n);
        post_send_wr(&a, IBV_WR_SEND, 0x5E00000u + n, abuf, LEN, amr, 0, 0, 0, IBV_SEND_SIGNALED);

        /* The sender's events are acknowledged all at once at the end; the receiver's one by
         * one. Both are re-armed before polling, so no completion goes unnoticed. */
        a_unacked += take_event(&a, what);
        arm(&a);
        struct ibv_wc wc;
        expect_wc(&a, &wc, 0x5E00000u + n, IBV_WC_SEND, what);

        ibv_ack_cq_events(b.cq, take_event(&b, what));
        arm(&b);
        expect_wc(&b, &wc, 0x4EC0000u + n, IBV_WC_RECV, what);
        CHECK(wc.byte_len == LEN, "%s: byte_len %u, expected %d: %s", what, wc.byte_len, LEN,
              wc_str(&wc));
        CHECK(pattern_check(bbuf, LEN, n, what) == 0, "%s: the receive buffer differs", what);

        expect_no_wc(&a, what);
        expect_no_wc(&b, what);
        a_unacked += settle(&a);
        ibv_ack_cq_events(b.cq, settle(&b));
        ok("%s: one event on each channel", what);
    }
    ibv_ack_cq_events(a.cq, a_unacked);
    CHECK(a.cq->comp_events_completed == a_unacked,
          "comp_events_completed %u after acknowledging %u events", a.cq->comp_events_completed,
          a_unacked);

    pair_finish(&a, &b, amr, bmr);
    printf("PASS event_channel: %d rounds\n", ROUNDS);
    return 0;
}
