/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Checked parsers for the numbers of command-line options, shared by the example engines and the
 * benchmarks: a decimal number and nothing else (no blanks, no sign), within [min, max].
 */

#include <stddef.h>
#include <stdint.h>

/* Parses s into *ret. Returns 0; -EINVAL when s is not a decimal number; -ERANGE when it is one
 * but lies outside [min, max]. *ret is untouched on failure. */
int argnum_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret);

/* The same for a uint32_t. */
int argnum_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret);

/* A comma-separated list of such numbers ("16" or "1,16,256"), at most cap of them, into
 * ret[0 .. *ret_n). 0, -EINVAL (not a list of numbers, or more than cap) or -ERANGE. ret and
 * *ret_n are untouched on failure. */
int argnum_u32_list(const char *s, uint32_t min, uint32_t max, uint32_t *ret, size_t cap,
                    size_t *ret_n);
