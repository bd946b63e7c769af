/* Deterministic byte patterns and a bounded hex diff for the C ibverbs tests.
 *
 * A pattern is a function of (seed, offset): byte i of pattern `seed` is pattern_byte(seed,
 * i). It is not periodic at any power of two, so a transfer that lands a page, a packet or
 * an MTU off shows up as a mismatch, and different seeds differ almost everywhere, so stale
 * data from an earlier round shows up too.
 *
 * On a mismatch the checkers print, on stderr, how many bytes differ, the first and last
 * differing offsets, and up to VERIFY_MAX_ROWS rows of 16 bytes around the first
 * mismatches, expected above actual in hex with a caret under each differing byte. */
#ifndef BLUERDMA_TESTS_VERIFY_H
#define BLUERDMA_TESTS_VERIFY_H

#include <stddef.h>
#include <stdint.h>

/* Rows of 16 bytes a diff prints at the most. */
#define VERIFY_MAX_ROWS 8

/* Byte `i` of pattern `seed`. */
uint8_t pattern_byte(uint32_t seed, size_t i);

/* Writes bytes 0..len of pattern `seed` to `buf`. */
void pattern_fill(void *buf, size_t len, uint32_t seed);

/* 0 when `buf` holds bytes 0..len of pattern `seed`; otherwise prints the diff under the
 * heading `what` and returns the number of differing bytes. */
size_t pattern_check(const void *buf, size_t len, uint32_t seed, const char *what);

/* 0 when every byte of `buf` is `value`; otherwise as pattern_check. */
size_t fill_check(const void *buf, size_t len, uint8_t value, const char *what);

/* 0 when `buf[off..off+len]` holds bytes 0..len of pattern `seed` and the `before` bytes
 * before it and the `after` bytes after it are all `canary` (untouched); otherwise prints
 * the diffs and returns the number of differing bytes. */
size_t region_check(const void *buf, size_t off, size_t len, uint32_t seed, uint8_t canary,
                    size_t before, size_t after, const char *what);

/* 0 when `actual` equals `expected`; otherwise as pattern_check. */
size_t hexdiff(const void *expected, const void *actual, size_t len, const char *what);

#endif
