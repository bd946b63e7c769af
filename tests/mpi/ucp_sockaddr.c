/* UCP client/server over a socket address, for `cargo xtask cluster`: the way most UCX
 * applications connect (ucp_listener_create on the server, ucp_ep_create with
 * UCP_EP_PARAM_FIELD_SOCK_ADDR on the client), through whichever connection manager
 * UCX_SOCKADDR_TLS_PRIORITY selects (rdmacm, over the librdmacm.so.1 stand-in).
 *
 *   server:  ucp_sockaddr -p PORT [-a LISTEN_ADDR]        (default 0.0.0.0)
 *   client:  ucp_sockaddr -p PORT -c SERVER_ADDR [-n ITERS]
 *
 * The client sends tagged messages of 8 B to 4 MiB (ROUNDS each), each filled with a
 * pattern of its size, round and direction; the server checks every byte and answers with
 * a message of the same size and its own pattern, which the client checks. Then ITERS
 * (default 20) timed round trips of the largest size, and the client closes its endpoint
 * gracefully. The server must then see the client's disconnect (its endpoint's error
 * callback with UCS_ERR_CONNECTION_RESET) before it closes its own.
 *
 * Both print `ucp_sockaddr: ep` with ucp_ep_print_info's lanes (which name the transports
 * and, for the CM lane, the connection manager), `ucp_sockaddr: <role> verified <n>
 * messages, <bytes> B`, and the client `ucp_sockaddr: <size> B round trip <usec> usec
 * <MB/s> MB/s` (MB = 10^6 B, both directions counted). Any mismatch prints the first bad
 * offset with the expected and received byte and exits 1; any UCX failure exits 2; a
 * watchdog (WATCHDOG_S) ends a run that hangs with exit 3.
 *
 * Build: cc -O2 -Wall -o ucp_sockaddr ucp_sockaddr.c -lucp -lucs
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define ROUNDS 3
#define WATCHDOG_S 60
#define STR_(x) #x
#define STR(x) STR_(x)
#define TAG_C2S 0xc25ull
#define TAG_S2C 0x52cull

static const size_t sizes[] = {8, 200, 4096, 65536, 1u << 20, 4u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAX_SIZE (4u << 20)

static const char *role = "?";
static ucp_worker_h worker;
static ucp_conn_request_h pending;     /* server: the accepted request */
static int extra_requests;             /* server: requests rejected after the first */
static volatile ucs_status_t ep_error; /* UCS_OK until the error callback fires */

static void die(const char *what, ucs_status_t st)
{
    fprintf(stderr, "ucp_sockaddr: %s: %s failed: %s\n", role, what, ucs_status_string(st));
    exit(2);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "ucp_sockaddr: watchdog: not done in " STR(WATCHDOG_S) " s\n";
    if (write(2, msg, sizeof(msg) - 1) < 0) {
        /* nothing more to do */
    }
    _exit(3);
}

/* A pattern that depends on the message (size, round, direction) and on the offset, and
 * does not repeat at any power of two. */
static uint8_t pattern(size_t size, int round, int dir, size_t i)
{
    uint64_t x = (uint64_t)size * 0x9e3779b97f4a7c15ull ^ (uint64_t)(round * 2 + dir) << 56;
    x ^= (uint64_t)i * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 17) ^ (i / 4093));
}

static void fill(uint8_t *buf, size_t size, int round, int dir)
{
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(size, round, dir, i);
}

static void verify(const uint8_t *buf, size_t got, size_t size, int round, int dir)
{
    if (got != size) {
        fprintf(stderr, "ucp_sockaddr: %s: MISMATCH: message %zu B round %d arrived with %zu B\n",
                role, size, round, got);
        exit(1);
    }
    for (size_t i = 0; i < size; i++) {
        uint8_t want = pattern(size, round, dir, i);
        if (buf[i] != want) {
            fprintf(stderr,
                    "ucp_sockaddr: %s: MISMATCH: message %zu B round %d at offset %zu: "
                    "expected 0x%02x, got 0x%02x\n",
                    role, size, round, i, want, buf[i]);
            exit(1);
        }
    }
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    ep_error = st;
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
    ucp_listener_h listener = *(ucp_listener_h *)arg;
    if (pending != NULL) {
        extra_requests++;
        ucp_listener_reject(listener, req);
        return;
    }
    pending = req;
}

struct recv_state {
    int done;
    ucs_status_t status;
    size_t length;
};

static void on_recv(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user)
{
    (void)req;
    struct recv_state *s = user;
    s->status = st;
    s->length = st == UCS_OK ? info->length : 0;
    s->done = 1;
}

/* Progresses the worker until `req` (from a *_nbx call) completes; its status. */
static ucs_status_t wait_req(void *req)
{
    if (req == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS)
        ucp_worker_progress(worker);
    ucp_request_free(req);
    return st;
}

static void send_msg(ucp_ep_h ep, const void *buf, size_t len, ucp_tag_t tag)
{
    ucp_request_param_t p = {0};
    ucs_status_t st = wait_req(ucp_tag_send_nbx(ep, buf, len, tag, &p));
    if (st != UCS_OK)
        die("ucp_tag_send_nbx", st);
}

/* Receives one message of tag `tag` into buf (room for `cap`); its length. */
static size_t recv_msg(void *buf, size_t cap, ucp_tag_t tag)
{
    struct recv_state s = {0};
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = on_recv,
        .user_data = &s,
    };
    void *req = ucp_tag_recv_nbx(worker, buf, cap, tag, (ucp_tag_t)-1, &p);
    if (UCS_PTR_IS_ERR(req))
        die("ucp_tag_recv_nbx", UCS_PTR_STATUS(req));
    while (!s.done)
        ucp_worker_progress(worker);
    ucp_request_free(req);
    if (s.status != UCS_OK)
        die("receiving a message", s.status);
    return s.length;
}

static void print_ep(ucp_ep_h ep)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return;
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
        printf("ucp_sockaddr: ep %s\n", line);
    free(text);
    fflush(stdout);
}

static struct sockaddr_in parse_addr(const char *ip, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "ucp_sockaddr: not an IPv4 address: %s\n", ip);
        exit(2);
    }
    return a;
}

static double now_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec * 1e6 + tv.tv_usec;
}

static void client(ucp_ep_h ep, uint8_t *buf, int iters)
{
    size_t bytes = 0;
    int n = 0;
    for (size_t s = 0; s < NSIZES; s++) {
        for (int r = 0; r < ROUNDS; r++) {
            fill(buf, sizes[s], r, 0);
            send_msg(ep, buf, sizes[s], TAG_C2S);
            memset(buf, 0, sizes[s]);
            verify(buf, recv_msg(buf, MAX_SIZE, TAG_S2C), sizes[s], r, 1);
            bytes += 2 * sizes[s];
            n += 2;
        }
    }
    printf("ucp_sockaddr: client verified %d messages, %zu B\n", n, bytes);
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        send_msg(ep, buf, MAX_SIZE, TAG_C2S);
        recv_msg(buf, MAX_SIZE, TAG_S2C);
    }
    double us = (now_us() - t0) / (iters > 0 ? iters : 1);
    printf("ucp_sockaddr: %u B round trip %.1f usec %.2f MB/s\n", MAX_SIZE, us,
           us > 0 ? 2.0 * MAX_SIZE / us : 0.0);
}

static void server(ucp_ep_h ep, uint8_t *buf, int iters)
{
    size_t bytes = 0;
    int n = 0;
    for (size_t s = 0; s < NSIZES; s++) {
        for (int r = 0; r < ROUNDS; r++) {
            memset(buf, 0, sizes[s]);
            verify(buf, recv_msg(buf, MAX_SIZE, TAG_C2S), sizes[s], r, 0);
            fill(buf, sizes[s], r, 1);
            send_msg(ep, buf, sizes[s], TAG_S2C);
            bytes += 2 * sizes[s];
            n += 2;
        }
    }
    printf("ucp_sockaddr: server verified %d messages, %zu B\n", n, bytes);
    for (int i = 0; i < iters; i++) {
        recv_msg(buf, MAX_SIZE, TAG_C2S);
        send_msg(ep, buf, MAX_SIZE, TAG_S2C);
    }
}

int main(int argc, char **argv)
{
    const char *peer = NULL, *listen_ip = "0.0.0.0";
    int port = 0, iters = 20, opt;
    while ((opt = getopt(argc, argv, "p:c:a:n:")) != -1) {
        switch (opt) {
        case 'p': port = atoi(optarg); break;
        case 'c': peer = optarg; break;
        case 'a': listen_ip = optarg; break;
        case 'n': iters = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s -p PORT [-a LISTEN_ADDR] | -p PORT -c SERVER [-n ITERS]\n",
                    argv[0]);
            return 2;
        }
    }
    if (port <= 0 || port > 65535 || iters < 0) {
        fprintf(stderr, "ucp_sockaddr: -p PORT (1..65535) is required, -n must be >= 0\n");
        return 2;
    }
    role = peer ? "client" : "server";
    signal(SIGALRM, on_alarm);
    alarm(WATCHDOG_S);
    setvbuf(stdout, NULL, _IOLBF, 0);

    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_context_h ctx;
    ucs_status_t st = ucp_init(&params, NULL, &ctx);
    if (st != UCS_OK)
        die("ucp_init", st);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(ctx, &wp, &worker)) != UCS_OK)
        die("ucp_worker_create", st);

    uint8_t *buf = malloc(MAX_SIZE);
    if (buf == NULL) {
        fprintf(stderr, "ucp_sockaddr: out of memory\n");
        return 2;
    }
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = NULL},
    };
    ucp_listener_h listener = NULL;
    struct sockaddr_in addr;
    if (peer) {
        addr = parse_addr(peer, port);
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
        ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        ep_params.sockaddr.addr = (const struct sockaddr *)&addr;
        ep_params.sockaddr.addrlen = sizeof(addr);
    } else {
        addr = parse_addr(listen_ip, port);
        ucp_listener_params_t lp = {
            .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                          UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
            .sockaddr = {.addr = (const struct sockaddr *)&addr, .addrlen = sizeof(addr)},
            .conn_handler = {.cb = on_conn_request, .arg = &listener},
        };
        if ((st = ucp_listener_create(worker, &lp, &listener)) != UCS_OK)
            die("ucp_listener_create", st);
        printf("ucp_sockaddr: server listening on %s:%d\n", listen_ip, port);
        while (pending == NULL)
            ucp_worker_progress(worker);
        ucp_conn_request_attr_t ra = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
        if ((st = ucp_conn_request_query(pending, &ra)) != UCS_OK)
            die("ucp_conn_request_query", st);
        char from[INET6_ADDRSTRLEN] = "?";
        const struct sockaddr_in *c = (const struct sockaddr_in *)&ra.client_address;
        if (c->sin_family == AF_INET)
            inet_ntop(AF_INET, &c->sin_addr, from, sizeof(from));
        printf("ucp_sockaddr: connection request from %s\n", from);
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
        ep_params.conn_request = pending;
    }
    ucp_ep_h ep;
    if ((st = ucp_ep_create(worker, &ep_params, &ep)) != UCS_OK)
        die("ucp_ep_create", st);

    if (peer)
        client(ep, buf, iters);
    else
        server(ep, buf, iters);
    print_ep(ep);
    /* The server has answered everything: the client may close before the server gets here,
     * and its disconnect is then already the endpoint's error (seen in CI: the server died
     * on the expected CONNECTION_RESET). Any other error fails. */
    if (ep_error != UCS_OK && (peer || ep_error != UCS_ERR_CONNECTION_RESET))
        die("the endpoint", ep_error);

    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
    if (peer) {
        /* Graceful: flush, then the CM's disconnect. */
        if ((st = wait_req(ucp_ep_close_nbx(ep, &cp))) != UCS_OK)
            die("ucp_ep_close_nbx", st);
        printf("ucp_sockaddr: client closed its endpoint\n");
    } else {
        while (ep_error == UCS_OK)
            ucp_worker_progress(worker);
        if (ep_error != UCS_ERR_CONNECTION_RESET)
            die("waiting for the client's disconnect", ep_error);
        printf("ucp_sockaddr: server saw the client disconnect (%s)\n",
               ucs_status_string(ep_error));
        cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
        wait_req(ucp_ep_close_nbx(ep, &cp));
        if (extra_requests)
            printf("ucp_sockaddr: server rejected %d further requests\n", extra_requests);
        ucp_listener_destroy(listener);
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    free(buf);
    printf("ucp_sockaddr: %s done\n", role);
    return 0;
}
