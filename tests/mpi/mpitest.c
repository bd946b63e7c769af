/* MPI checks of `cargo xtask cluster`: one or more ranks per emulated node.
 *
 *   ping-pong  rank 0 and the first rank on another node (rank 1 if all share one node),
 *              8 B to 8 MiB (x4 per step); each size is checked once with a fresh pattern
 *              each way before and after its timed loop, which lasts about 0.5 s at most
 *              (BUDGET_SECONDS)
 *   pairs      every rank sends a 64 KiB block to every other rank and receives one from
 *              each (MPI_Sendrecv, shift k = 1..n-1), each byte checked: every pair of ranks
 *              has carried data, whichever node each is on
 *   allreduce  MPI_SUM of int vectors (1 Ki and 256 Ki elements)
 *   alltoall   a block of ints from every rank to every rank, each element naming its
 *              source, destination and index
 *   put        MPI_Put of a block into the right neighbour's window between two fences
 *
 * Rank 0 prints `mpitest: <n> ranks on <node of rank 0> <node of rank 1> ...`, then
 * `mpitest: pingpong rank 0 (<node>) <-> rank <p> (<node>)` and
 * `mpitest: pingpong <bytes> B <usec> usec <MB/s> MB/s (<n> round trips)` per size (half
 * a round trip; MB = 10^6 B), and `mpitest: all checks passed on <n> ranks` at the end. Any mismatch
 * prints what was expected and what arrived, and aborts the job with exit code 1.
 *
 * Build: mpicc -O2 -o mpitest mpitest.c
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZE (8u << 20)
/* The timed loop of a size: 1000, 100 or 20 round trips (small, middle, large sizes), fewer
 * when they would take longer than BUDGET_SECONDS (as CALIBRATION_TRIPS say), never fewer
 * than MIN_TRIPS. */
#define BUDGET_SECONDS 0.5
#define CALIBRATION_TRIPS 3
#define MIN_TRIPS 5
/* Untimed 8-byte round trips before the first size. */
#define WARMUP_TRIPS 20

static int rank, nranks;
/* The ping-pong's two ranks: 0 and `partner`. */
static int partner = 1;

static void fail(const char *what, size_t index, long long expected, long long got)
{
    fprintf(stderr, "mpitest: MISMATCH on rank %d in %s at element %zu: expected %lld, got %lld\n",
            rank, what, index, expected, got);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void check_mpi(int rc, const char *what)
{
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "mpitest: %s failed on rank %d: %s\n", what, rank, msg);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* The byte at `i` of the message of `size` bytes sent by `from` in round `round`. */
static uint8_t pattern(size_t i, size_t size, int from, unsigned round)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)size ^ ((uint32_t)from << 24) ^ (round * 40503u);
    return (uint8_t)(x ^ (x >> 13) ^ (x >> 21));
}

static void fill(uint8_t *buf, size_t size, int from, unsigned round)
{
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(i, size, from, round);
}

static void verify(const uint8_t *buf, size_t size, int from, unsigned round, const char *what)
{
    for (size_t i = 0; i < size; i++)
        if (buf[i] != pattern(i, size, from, round))
            fail(what, i, pattern(i, size, from, round), buf[i]);
}

/* One checked exchange of `size` bytes: 0 sends, the partner checks and answers, 0 checks. */
static void checked_round(uint8_t *sbuf, uint8_t *rbuf, size_t size, unsigned round)
{
    int peer = rank == 0 ? partner : 0;
    fill(sbuf, size, rank, round);
    memset(rbuf, 0xEE, size);
    if (rank == 0) {
        check_mpi(MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD), "MPI_Send");
        check_mpi(MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                  "MPI_Recv");
    } else {
        check_mpi(MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                  "MPI_Recv");
        check_mpi(MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD), "MPI_Send");
    }
    verify(rbuf, size, peer, round, "ping-pong");
}

/* `n` unchecked round trips of `size` bytes between rank 0 and `peer` (the partner). */
static void round_trips(uint8_t *sbuf, uint8_t *rbuf, size_t size, int peer, int n)
{
    for (int i = 0; i < n; i++) {
        if (rank == 0) {
            MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
        }
    }
}

static void pingpong(void)
{
    uint8_t *sbuf = malloc(MAX_SIZE), *rbuf = malloc(MAX_SIZE);
    if (!sbuf || !rbuf) {
        fprintf(stderr, "mpitest: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    unsigned round = 0;
    /* Untimed: the first messages set up the endpoint's lanes. */
    if (rank == 0 || rank == partner)
        round_trips(sbuf, rbuf, 8, rank == 0 ? partner : 0, WARMUP_TRIPS);
    for (size_t size = 8; size <= MAX_SIZE; size *= 4) {
        if (rank == 0 || rank == partner) {
            checked_round(sbuf, rbuf, size, round++);
            int peer = rank == 0 ? partner : 0;
            /* A few round trips say how long one takes; rank 0 cuts the count to fit the
             * budget (a loaded machine, many ranks on two cores) and tells the partner. */
            double t0 = MPI_Wtime();
            round_trips(sbuf, rbuf, size, peer, CALIBRATION_TRIPS);
            double one = (MPI_Wtime() - t0) / CALIBRATION_TRIPS;
            int iters = size <= 4096 ? 1000 : size <= (256u << 10) ? 100 : 20;
            if (rank == 0) {
                if (one > 0 && BUDGET_SECONDS / one < iters)
                    iters = (int)(BUDGET_SECONDS / one);
                if (iters < MIN_TRIPS)
                    iters = MIN_TRIPS;
                check_mpi(MPI_Send(&iters, 1, MPI_INT, peer, 4, MPI_COMM_WORLD), "MPI_Send");
            } else {
                check_mpi(MPI_Recv(&iters, 1, MPI_INT, peer, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                          "MPI_Recv");
            }
            t0 = MPI_Wtime();
            round_trips(sbuf, rbuf, size, peer, iters);
            double half_rtt = (MPI_Wtime() - t0) / iters / 2;
            checked_round(sbuf, rbuf, size, round++);
            if (rank == 0)
                printf("mpitest: pingpong %zu B %.2f usec %.2f MB/s (%d round trips)\n", size,
                       half_rtt * 1e6, size / half_rtt / 1e6, iters);
        }
        check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    }
    free(sbuf);
    free(rbuf);
}

/* Every rank to every other: at shift k, send to rank + k and receive from rank - k. */
static void pairs(size_t size)
{
    uint8_t *sbuf = malloc(size), *rbuf = malloc(size);
    if (!sbuf || !rbuf) {
        fprintf(stderr, "mpitest: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int k = 1; k < nranks; k++) {
        int to = (rank + k) % nranks, from = (rank + nranks - k) % nranks;
        /* The round names the destination, so a block delivered to the wrong rank fails. */
        fill(sbuf, size, rank, 1000u + (unsigned)to);
        memset(rbuf, 0xEE, size);
        check_mpi(MPI_Sendrecv(sbuf, (int)size, MPI_BYTE, to, 3, rbuf, (int)size, MPI_BYTE,
                               from, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
        verify(rbuf, size, from, 1000u + (unsigned)rank, "pairs");
    }
    free(sbuf);
    free(rbuf);
}

static void allreduce(int count)
{
    int *in = malloc(count * sizeof(int)), *out = malloc(count * sizeof(int));
    for (int i = 0; i < count; i++) {
        in[i] = rank * (i % 1000) + 1;
        out[i] = -1;
    }
    check_mpi(MPI_Allreduce(in, out, count, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    long long ranks_sum = (long long)nranks * (nranks - 1) / 2;
    for (int i = 0; i < count; i++) {
        long long want = ranks_sum * (i % 1000) + nranks;
        if (out[i] != want)
            fail("allreduce", i, want, out[i]);
    }
    free(in);
    free(out);
}

static void alltoall(int count)
{
    size_t n = (size_t)count * nranks;
    int *in = malloc(n * sizeof(int)), *out = malloc(n * sizeof(int));
    for (int to = 0; to < nranks; to++)
        for (int k = 0; k < count; k++)
            in[(size_t)to * count + k] = rank * 1000000 + to * 10000 + k % 10000;
    memset(out, 0xEE, n * sizeof(int));
    check_mpi(MPI_Alltoall(in, count, MPI_INT, out, count, MPI_INT, MPI_COMM_WORLD), "MPI_Alltoall");
    for (int from = 0; from < nranks; from++)
        for (int k = 0; k < count; k++) {
            size_t i = (size_t)from * count + k;
            int want = from * 1000000 + rank * 10000 + k % 10000;
            if (out[i] != want)
                fail("alltoall", i, want, out[i]);
        }
    free(in);
    free(out);
}

static void put(int count)
{
    int *win_buf = NULL;
    MPI_Win win;
    size_t n = (size_t)count * nranks;
    check_mpi(MPI_Win_allocate((MPI_Aint)(n * sizeof(int)), sizeof(int), MPI_INFO_NULL,
                               MPI_COMM_WORLD, &win_buf, &win),
              "MPI_Win_allocate");
    for (size_t i = 0; i < n; i++)
        win_buf[i] = -1;
    int *src = malloc(count * sizeof(int));
    for (int k = 0; k < count; k++)
        src[k] = rank * 1000000 + k;
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    check_mpi(MPI_Win_fence(0, win), "MPI_Win_fence");
    check_mpi(MPI_Put(src, count, MPI_INT, right, (MPI_Aint)rank * count, count, MPI_INT, win),
              "MPI_Put");
    check_mpi(MPI_Win_fence(0, win), "MPI_Win_fence");
    for (int from = 0; from < nranks; from++)
        for (int k = 0; k < count; k++) {
            size_t i = (size_t)from * count + k;
            int want = from == left ? from * 1000000 + k : -1;
            if (win_buf[i] != want)
                fail("put", i, want, win_buf[i]);
        }
    check_mpi(MPI_Win_free(&win), "MPI_Win_free");
    free(src);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    char *names = malloc((size_t)nranks * MPI_MAX_PROCESSOR_NAME);
    if (!names) {
        fprintf(stderr, "mpitest: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names,
                            MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
              "MPI_Allgather");
#define NAME(r) (names + (size_t)(r) * MPI_MAX_PROCESSOR_NAME)
    for (int r = 1; r < nranks; r++)
        if (strcmp(NAME(r), NAME(0)) != 0) {
            partner = r;
            break;
        }
    if (rank == 0) {
        printf("mpitest: %d ranks on", nranks);
        for (int r = 0; r < nranks; r++)
            printf(" %s", NAME(r));
        printf("\n");
        if (nranks >= 2)
            printf("mpitest: pingpong rank 0 (%s) <-> rank %d (%s)\n", NAME(0), partner,
                   NAME(partner));
        fflush(stdout);
    }
#undef NAME
    free(names);

    if (nranks >= 2)
        pingpong();
    else if (rank == 0)
        printf("mpitest: one rank: no ping-pong\n");
    pairs(64 * 1024);
    allreduce(1024);
    allreduce(256 * 1024);
    alltoall(1024);
    alltoall(64 * 1024);
    put(1024);
    put(256 * 1024);
    if (rank == 0)
        printf("mpitest: pairs, allreduce, alltoall and put checked\n");

    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    if (rank == 0) {
        printf("mpitest: all checks passed on %d ranks\n", nranks);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
