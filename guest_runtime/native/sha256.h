/* sha256.h: SHA-256 (FIPS 180-4), for naming module images by their bytes (module_calls.c: the host agent keeps
 * the images it has seen by digest, so a guest sends a fatbin's 32-byte digest instead of its megabytes).
 *
 * Portable C, no dependencies (the guest's libcuda.so.1 links nothing but libc). tests/unit/test_image_cache.py
 * holds it to FIPS 180-2's test vectors and to Python's hashlib. */
#ifndef ORION_SHA256_H
#define ORION_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define ORION_SHA256_BYTES 32

struct orion_sha256 {
    uint32_t state[8];
    uint64_t length;       /* bytes hashed so far */
    uint8_t block[64];     /* a partial block */
    size_t filled;         /* bytes of it */
};

void orion_sha256_init(struct orion_sha256 *ctx);
void orion_sha256_update(struct orion_sha256 *ctx, const void *data, size_t len);
void orion_sha256_final(struct orion_sha256 *ctx, uint8_t digest[ORION_SHA256_BYTES]);
/* Whether the CPU's SHA instructions do the rounds (x86 SHA-NI; ORION_SHA256_PORTABLE=1 turns them off). */
int orion_sha256_accelerated(void);
/* All at once. */
void orion_sha256(const void *data, size_t len, uint8_t digest[ORION_SHA256_BYTES]);

#endif
