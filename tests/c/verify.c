/* Patterns and the bounded hex diff (see verify.h). */
#include "verify.h"

#include <stdio.h>
#include <string.h>

uint8_t pattern_byte(uint32_t seed, size_t i)
{
    /* A 32-bit mix of (seed, i): cheap, and no short period. */
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)((uint64_t)i >> 32) ^ seed * 0x85EBCA77u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return (uint8_t)(x ^ x >> 24);
}

void pattern_fill(void *buf, size_t len, uint32_t seed)
{
    uint8_t *b = buf;
    for (size_t i = 0; i < len; i++)
        b[i] = pattern_byte(seed, i);
}

/* What a byte should be: one of the three kinds of expectation. */
struct expect {
    const uint8_t *bytes; /* a reference buffer, or NULL */
    int use_pattern;      /* else: pattern `seed` */
    uint32_t seed;
    uint8_t value; /* else: every byte `value` */
};

static uint8_t expected_at(const struct expect *e, size_t i)
{
    if (e->bytes)
        return e->bytes[i];
    return e->use_pattern ? pattern_byte(e->seed, i) : e->value;
}

static void print_row(const struct expect *e, const uint8_t *actual, size_t len, size_t row)
{
    size_t end = row + 16 < len ? row + 16 : len;
    fprintf(stderr, "    %#10zx expected:", row);
    for (size_t i = row; i < end; i++)
        fprintf(stderr, " %02x", expected_at(e, i));
    fprintf(stderr, "\n    %10s   actual:", "");
    for (size_t i = row; i < end; i++)
        fprintf(stderr, " %02x", actual[i]);
    fprintf(stderr, "\n    %10s          ", "");
    for (size_t i = row; i < end; i++)
        fprintf(stderr, " %s", actual[i] == expected_at(e, i) ? "  " : "^^");
    fprintf(stderr, "\n");
}

static size_t diff(const struct expect *e, const void *buf, size_t len, const char *what)
{
    const uint8_t *actual = buf;
    size_t bad = 0, first = 0, last = 0;
    for (size_t i = 0; i < len; i++) {
        if (actual[i] != expected_at(e, i)) {
            if (bad++ == 0)
                first = i;
            last = i;
        }
    }
    if (bad == 0)
        return 0;
    fprintf(stderr,
            "MISMATCH in %s: %zu of %zu bytes differ, first at offset %#zx (%zu), last at %#zx "
            "(%zu)\n",
            what, bad, len, first, first, last, last);
    size_t rows = 0, row = first & ~(size_t)15;
    for (; row < len && rows < VERIFY_MAX_ROWS; row += 16) {
        size_t end = row + 16 < len ? row + 16 : len;
        int differs = 0;
        for (size_t i = row; i < end && !differs; i++)
            differs = actual[i] != expected_at(e, i);
        if (differs) {
            print_row(e, actual, len, row);
            rows++;
        }
    }
    if (last >= row)
        fprintf(stderr, "    ... (only the first %d differing rows are shown)\n", VERIFY_MAX_ROWS);
    return bad;
}

size_t pattern_check(const void *buf, size_t len, uint32_t seed, const char *what)
{
    struct expect e = {.use_pattern = 1, .seed = seed};
    return diff(&e, buf, len, what);
}

size_t fill_check(const void *buf, size_t len, uint8_t value, const char *what)
{
    struct expect e = {.value = value};
    return diff(&e, buf, len, what);
}

size_t region_check(const void *buf, size_t off, size_t len, uint32_t seed, uint8_t canary,
                    size_t before, size_t after, const char *what)
{
    const uint8_t *b = buf;
    char around[200];
    snprintf(around, sizeof around, "%s: the %zu bytes before the target", what, before);
    size_t bad = fill_check(b + off - before, before, canary, around);
    bad += pattern_check(b + off, len, seed, what);
    snprintf(around, sizeof around, "%s: the %zu bytes after the target", what, after);
    return bad + fill_check(b + off + len, after, canary, around);
}

size_t hexdiff(const void *expected, const void *actual, size_t len, const char *what)
{
    struct expect e = {.bytes = expected};
    return diff(&e, actual, len, what);
}
