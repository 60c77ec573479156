/*
 * md5.c - MD5 (RFC 1321), only to name cache files as Megatron does:
 * hashlib.md5(unique_description).hexdigest(). Not used for security.
 * Written from the RFC: 64-byte blocks, four rounds of 16 steps, the
 * sine-derived constants K[i] = floor(2^32 * |sin(i + 1)|).
 */
#include "gpt_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint32_t rotl(uint32_t x, int c) { return (x << c) | (x >> (32 - c)); }

static void md5_block(uint32_t h[4], const unsigned char *blk, const uint32_t K[64])
{
    static const int S[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                              5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                              4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                              6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};
    uint32_t M[16];
    for (int i = 0; i < 16; i++)
        M[i] = (uint32_t)blk[4 * i] | (uint32_t)blk[4 * i + 1] << 8 |
               (uint32_t)blk[4 * i + 2] << 16 | (uint32_t)blk[4 * i + 3] << 24;
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; i++) {
        uint32_t f;
        int g;
        if (i < 16) {
            f = (b & c) | (~b & d);
            g = i;
        } else if (i < 32) {
            f = (d & b) | (~d & c);
            g = (5 * i + 1) % 16;
        } else if (i < 48) {
            f = b ^ c ^ d;
            g = (3 * i + 5) % 16;
        } else {
            f = c ^ (b | ~d);
            g = (7 * i) % 16;
        }
        f += a + K[i] + M[g];
        a = d;
        d = c;
        c = b;
        b += rotl(f, S[i]);
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
}

void mc_md5_hex(const void *data, size_t n, char hex[33])
{
    uint32_t K[64], h[4] = {0x67452301U, 0xefcdab89U, 0x98badcfeU, 0x10325476U};
    for (int i = 0; i < 64; i++)
        K[i] = (uint32_t)(uint64_t)floor(4294967296.0 * fabs(sin(i + 1.0)));
    const unsigned char *p = data;
    size_t full = n / 64 * 64;
    for (size_t off = 0; off < full; off += 64) md5_block(h, p + off, K);
    /* tail: the rest, 0x80, zeros, then the bit length little-endian */
    unsigned char tail[128] = {0};
    size_t rest = n - full, tl = rest + 9 <= 64 ? 64 : 128;
    memcpy(tail, p + full, rest);
    tail[rest] = 0x80;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[tl - 8 + i] = (unsigned char)(bits >> (8 * i));
    md5_block(h, tail, K);
    if (tl == 128) md5_block(h, tail + 64, K);
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", (h[i / 4] >> (8 * (i % 4))) & 0xff);
}
