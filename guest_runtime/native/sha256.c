/* sha256.c: SHA-256 as FIPS 180-4 specifies it (section 6.2), one 64-byte block at a time.
 *
 * Portable C does some 180 MB/s, slower than the ring the hash is meant to spare (a 16 MiB fatbin: ~90 ms). x86
 * CPUs with the SHA extensions (Intel since Ice Lake and Goldmont, every AMD Zen) hash ~1.5 GB/s with them, so
 * those blocks go through the SHA-NI rounds below, chosen once at run time from CPUID; others use the portable
 * rounds. */
#include "sha256.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define ORION_SHA_NI 1
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress_portable(uint32_t state[8], const uint8_t block[64]) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 | (uint32_t)block[4 * t + 2] << 8
               | (uint32_t)block[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1;
        d = c; c = b; b = a; a = t1 + t2;
    }
    state[0] += a; state[1] += b; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
}

#ifdef ORION_SHA_NI
/* The same rounds with SHA-NI: the state as the instructions keep it (ABEF, CDGH), four rounds per step from the
 * message words and K, the message schedule four words at a time (sha256msg1/msg2), as Intel's SHA extensions
 * paper lays it out. */
__attribute__((target("sha,sse4.1,ssse3")))
static void compress_ni(uint32_t state[8], const uint8_t block[64]) {
    const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[0]), 0xB1); /* CDAB */
    __m128i state1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[4]), 0x1B); /* EFGH */
    __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);                                    /* ABEF */
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);                                         /* CDGH */
    const __m128i abef = state0, cdgh = state1;
    __m128i w[4];
    for (int i = 0; i < 4; i++)
        w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 16 * i)), byte_swap);
    for (int i = 0; i < 16; i++) {
        __m128i sum = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&K[4 * i]));
        state1 = _mm_sha256rnds2_epu32(state1, state0, sum);
        state0 = _mm_sha256rnds2_epu32(state0, state1, _mm_shuffle_epi32(sum, 0x0E));
        if (i < 12) { /* words 4(i+4)..4(i+4)+3 replace words 4i..4i+3 */
            __m128i next = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
            next = _mm_add_epi32(next, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
            w[i & 3] = _mm_sha256msg2_epu32(next, w[(i + 3) & 3]);
        }
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
    tmp = _mm_shuffle_epi32(state0, 0x1B);       /* FEBA */
    state1 = _mm_shuffle_epi32(state1, 0xB1);    /* DCHG */
    state0 = _mm_blend_epi16(tmp, state1, 0xF0); /* DCBA */
    state1 = _mm_alignr_epi8(state1, tmp, 8);    /* HGFE */
    _mm_storeu_si128((__m128i *)&state[0], state0);
    _mm_storeu_si128((__m128i *)&state[4], state1);
}

static int has_sha_ni(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1)) return 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29)); /* CPUID.7.0:EBX.SHA */
}
#endif

/* ORION_SHA256_PORTABLE=1 forces the portable rounds (the tests compare both). */
int orion_sha256_accelerated(void) {
#ifdef ORION_SHA_NI
    static int use_ni = -1; /* chosen once; threads racing to choose all write the same answer */
    int choice = __atomic_load_n(&use_ni, __ATOMIC_RELAXED);
    if (choice < 0) {
        const char *forced = getenv("ORION_SHA256_PORTABLE");
        choice = !(forced && *forced && strcmp(forced, "0") != 0) && has_sha_ni();
        __atomic_store_n(&use_ni, choice, __ATOMIC_RELAXED);
    }
    return choice;
#else
    return 0;
#endif
}

static void compress(uint32_t state[8], const uint8_t block[64]) {
#ifdef ORION_SHA_NI
    if (orion_sha256_accelerated()) {
        compress_ni(state, block);
        return;
    }
#endif
    compress_portable(state, block);
}

void orion_sha256_init(struct orion_sha256 *ctx) {
    static const uint32_t initial[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(ctx->state, initial, sizeof initial);
    ctx->length = 0;
    ctx->filled = 0;
}

void orion_sha256_update(struct orion_sha256 *ctx, const void *data, size_t len) {
    const uint8_t *p = data;
    ctx->length += len;
    if (ctx->filled) {
        size_t take = 64 - ctx->filled < len ? 64 - ctx->filled : len;
        memcpy(ctx->block + ctx->filled, p, take);
        ctx->filled += take;
        p += take;
        len -= take;
        if (ctx->filled < 64) return;
        compress(ctx->state, ctx->block);
        ctx->filled = 0;
    }
    for (; len >= 64; p += 64, len -= 64) compress(ctx->state, p);
    memcpy(ctx->block, p, len);
    ctx->filled = len;
}

void orion_sha256_final(struct orion_sha256 *ctx, uint8_t digest[ORION_SHA256_BYTES]) {
    uint64_t bits = ctx->length * 8;
    static const uint8_t pad[64] = { 0x80 };
    size_t room = ctx->filled < 56 ? 56 - ctx->filled : 120 - ctx->filled; /* to 56 mod 64 */
    orion_sha256_update(ctx, pad, room);
    uint8_t tail[8];
    for (int i = 0; i < 8; i++) tail[i] = (uint8_t)(bits >> (56 - 8 * i));
    orion_sha256_update(ctx, tail, sizeof tail);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(ctx->state[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(ctx->state[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(ctx->state[i] >> 8);
        digest[4 * i + 3] = (uint8_t)ctx->state[i];
    }
}

void orion_sha256(const void *data, size_t len, uint8_t digest[ORION_SHA256_BYTES]) {
    struct orion_sha256 ctx;
    orion_sha256_init(&ctx);
    orion_sha256_update(&ctx, data, len);
    orion_sha256_final(&ctx, digest);
}
