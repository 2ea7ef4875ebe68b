"""The CUresult codes the forwarding layer itself answers with, defined once for both sides.

A forwarded call's reply carries the driver's own CUresult as its record status; these are the codes the guest
runtime and the host executor produce without the driver (a NULL output pointer, a handle the session does not
own, a call that is not forwarded, a quota). Plain ints, as cuda.h numbers them: the hot paths compare them with
the record status, and an IntEnum costs a microsecond there. cudaError_t codes of the runtime API have the same
numbers for these (runtime_shim.py maps the rest).
"""
SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
NOT_INITIALIZED = 3
DEINITIALIZED = 4
DEVICE_UNAVAILABLE = 46  # a session whose GPU (or relayed GPU host) is gone (docs/remote.md)
NO_DEVICE = 100
INVALID_DEVICE = 101
INVALID_IMAGE = 200
INVALID_CONTEXT = 201
PEER_ACCESS_ALREADY_ENABLED = 704  # two vGPUs of one GPU (host_agent/session/vgpu_contexts.py)
PEER_ACCESS_NOT_ENABLED = 705
INVALID_HANDLE = 400
LOSSY_QUERY = 402  # cuStreamGetCaptureInfo: edges with data of their own, and nowhere to write it
NOT_FOUND = 500
NOT_SUPPORTED = 801
UNKNOWN = 999
