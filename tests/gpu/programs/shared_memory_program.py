"""Two processes share GPU memory as NCCL's P2P transport shares it between ranks, and as PyTorch's multiprocessing
shares CUDA tensors (issue 32): the first creates cuMem memory exportable as a POSIX file descriptor, maps and fills it,
exports it and passes the descriptor to the second over a UNIX socket (SCM_RIGHTS); it also fills a cuMemAlloc
allocation and sends its legacy IPC handle (cuIpcGetMemHandle). The second imports and maps the first, opens the
second, reads the first process's bytes in both and writes its own, which the first reads back. An export of memory
created without that handle type is the driver's refusal. RESULT: each step's status and what each process read."""
import ctypes
import json
import os
import socket
import subprocess
import sys

from cuda.bindings import driver as cu

POSIX = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def check(result):
    err, *values = result
    assert int(err) == 0, err
    return values[0] if len(values) == 1 else values


def setup():
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(device))))


def prop(handle_types):
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.requestedHandleTypes = handle_types
    p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = 0
    return p


def mapped(handle, size):
    base = check(cu.cuMemAddressReserve(size, 0, 0, 0))
    check(cu.cuMemMap(base, size, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location = prop(POSIX).location
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(cu.cuMemSetAccess(base, size, [access], 1))
    return base


def pattern(size, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(size))


def read(base, size):
    target = bytearray(size)
    check(cu.cuMemcpyDtoH(target, base, size))
    return bytes(target)


def exporter():
    setup()
    size = check(cu.cuMemGetAllocationGranularity(
        prop(POSIX), cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    handle = check(cu.cuMemCreate(size, prop(POSIX), 0))
    base = mapped(handle, size)
    check(cu.cuMemcpyHtoD(base, pattern(size, 5), size))
    out = {"size": size}
    err, descriptor = cu.cuMemExportToShareableHandle(handle, POSIX, 0)
    out["export"] = int(err)
    plain = check(cu.cuMemCreate(size, prop(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE), 0))
    out["export_plain"] = int(cu.cuMemExportToShareableHandle(plain, POSIX, 0)[0])
    allocation = check(cu.cuMemAlloc(size))
    check(cu.cuMemcpyHtoD(allocation, pattern(size, 6), size))
    err, ipc = cu.cuIpcGetMemHandle(allocation)
    out["ipc_export"] = int(err)
    ours, theirs = socket.socketpair()
    prefix = sys.orig_argv[:len(sys.orig_argv) - len(sys.argv)]  # the interpreter and a loader's -c, if any
    child = subprocess.Popen([*prefix, sys.argv[0], "import", str(theirs.fileno()), str(size)],
                             pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True)
    theirs.close()
    socket.send_fds(ours, [ctypes.string_at(ipc.getPtr(), 64)], [int(descriptor)])
    os.close(int(descriptor))
    answer = ours.recv(4096)
    out["importer"] = json.loads(answer.decode())
    out["read_back"] = read(base, size) == pattern(size, 9)
    out["ipc_read_back"] = read(allocation, size) == pattern(size, 10)
    ours.sendall(b"bye")
    child.wait(timeout=120)
    out["importer_exit"] = child.returncode
    print("RESULT " + json.dumps(out, sort_keys=True))


def importer(descriptor_socket, size):
    setup()
    peer = socket.socket(fileno=descriptor_socket)
    ipc_bytes, descriptors, _, _ = socket.recv_fds(peer, 64, 1)
    while len(ipc_bytes) < 64 and descriptors:
        more = peer.recv(64 - len(ipc_bytes))
        if not more:
            break
        ipc_bytes += more
    if len(ipc_bytes) < 64 or not descriptors:  # the exporter failed before it sent them: it says why
        sys.exit("importer: the exporter closed its socket before it sent its handles")
    out = {}
    err, handle = cu.cuMemImportFromShareableHandle(descriptors[0], POSIX)
    out["import"] = int(err)
    if int(err) == 0:
        base = mapped(handle, size)
        out["read"] = read(base, size) == pattern(size, 5)
        check(cu.cuMemcpyHtoD(base, pattern(size, 9), size))
    os.close(descriptors[0])
    handle = cu.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), ipc_bytes, 64)
    err, pointer = cu.cuIpcOpenMemHandle(handle, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    out["ipc_open"] = int(err)
    if int(err) == 0:
        out["ipc_read"] = read(pointer, size) == pattern(size, 6)
        check(cu.cuMemcpyHtoD(pointer, pattern(size, 10), size))
        check(cu.cuCtxSynchronize())
        out["ipc_close"] = int(cu.cuIpcCloseMemHandle(pointer)[0])
    peer.sendall(json.dumps(out, sort_keys=True).encode())
    peer.recv(16)  # the exporter has read what this process wrote


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "import":
        importer(int(sys.argv[2]), int(sys.argv[3]))
    else:
        exporter()
