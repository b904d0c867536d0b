/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Checked parsers: 0, -EINVAL (not a number, trailing junk, empty), -ERANGE (does not fit). */
int vase_parse_u64(const char *s, uint64_t *ret);
int vase_parse_i64(const char *s, int64_t *ret);
/* A byte count with an optional K, M, G or T suffix (powers of 1024; "KiB", "KB" also). */
int vase_parse_size(const char *s, uint64_t *ret);
/* Formats a byte count with the largest exact suffix ("256M"). */
void vase_format_size(uint64_t v, char *buf, size_t len);
