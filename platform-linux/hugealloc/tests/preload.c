/* Run under LD_PRELOAD=libbluerdma_hugealloc.so: page-aligned and large allocations are
 * 2 MiB hugetlb pages (smaps says so), small ones are not, and free/realloc/calloc/
 * malloc_usable_size behave. Prints "ok" and exits 0, or names the failed check. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HUGE (2u << 20)
#define CHECK(c)                                                                       \
    do {                                                                               \
        if (!(c)) {                                                                    \
            fprintf(stderr, "preload.c:%d: %s\n", __LINE__, #c);                       \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* The kernel page size of the mapping holding p, in KiB (0 if not found). */
static long page_kib(void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int inside = 0;
    long kib = 0;
    uintptr_t a = (uintptr_t)p;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
            continue;
        }
        if (inside && sscanf(line, "KernelPageSize: %ld kB", &kib) == 1)
            break;
    }
    if (f)
        fclose(f);
    return kib;
}

int main(void) {
    char *a = memalign(4096, 1 << 20);
    void *b = NULL;
    CHECK(posix_memalign(&b, 4096, 8192) == 0);
    char *c = malloc(100);
    char *d = calloc(1, 3u << 20);
    CHECK(a && b && c && d);
    CHECK((uintptr_t)a % HUGE == 0 && (uintptr_t)b % HUGE == 0);
    CHECK(page_kib(a) == 2048 && page_kib(b) == 2048 && page_kib(d) == 2048);
    CHECK(page_kib(c) == 4);
    for (size_t i = 0; i < (3u << 20); i += 4096)
        CHECK(d[i] == 0);
    CHECK(malloc_usable_size(d) >= (3u << 20));
    CHECK(malloc_usable_size(c) >= 100);
    memset(a, 0xab, 1 << 20);
    char *same = realloc(a, HUGE); /* fits its page: stays */
    CHECK(same == a);
    a = realloc(same, 3u << 20);
    CHECK(a && (unsigned char)a[0] == 0xab && (unsigned char)a[(1 << 20) - 1] == 0xab);
    free(a);
    free(b);
    free(c);
    free(d);
    free(NULL);
    /* Freed pages went back: the same slots are handed out again. */
    char *e = memalign(4096, 4096);
    CHECK(e && page_kib(e) == 2048);
    free(e);
    /* A small page-aligned buffer is one to register too (ibv_ud_pingpong -s 2048). */
    char *u = memalign(4096, 2048 + 40);
    CHECK(u && (uintptr_t)u % HUGE == 0 && page_kib(u) == 2048);
    free(u);
    puts("ok");
    return 0;
}
