/* integrity.h: the CUDA runtime's integrity check, answered as the real driver answers it.
 *
 * cudart asks the driver's export table d4082055-bde6-704b-8d34-ba123c66e1f2, entry 1, for a 16-byte value and
 * compares it with its own computation; on a mismatch every runtime call fails with
 * cudaErrorSoftwareValidityNotEstablished (PyTorch: "Unexpected error from cudaGetDeviceCount()"). The value is
 * HMAC (RFC 2104) over MD2 (RFC 1319, 16-byte blocks) with a fixed key, of: the driver version, the runtime's
 * `version` argument, the process id, the low 32 bits of pthread_self(), the addresses of the CUDART_INTERFACE
 * table, of the integrity table and of its entry 1, the time cudart passed, then for every device its UUID and
 * PCI domain, bus and device numbers (docs/native-driver.md "Export tables"). Runtime versions ending in 0 or 1
 * get fixed answers. Layouts as public reverse engineering describes them (ZLUDA's dark-API notes); the code is
 * ours.
 */
#ifndef ORION_INTEGRITY_H
#define ORION_INTEGRITY_H

#include <stddef.h>
#include <stdint.h>

struct orion_device_identity {
    uint8_t uuid[16];
    int32_t pci_domain, pci_bus, pci_device;
};

struct orion_integrity_input {
    uint32_t driver_version, version, process, thread;
    const void *cudart_table, *integrity_table, *integrity_function;
    uint64_t unix_seconds;
};

/* MD2 of `len` bytes (RFC 1319): exported for the tests, which hold it to the RFC's test vectors. */
void orion_md2(const void *data, size_t len, uint8_t digest[16]);

/* The 16 bytes the integrity entry answers for these inputs and `count` devices. */
void orion_integrity_digest(const struct orion_integrity_input *input, const struct orion_device_identity *devices,
                            uint32_t count, uint8_t digest[16]);

#endif
