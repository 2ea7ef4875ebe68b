"""The session executor: one session's CUDA calls run on this host's GPU (executor.CudaExecutor and the call
families it delegates to), the session's ledger of what it owns, its page-locked pool, its vGPU quota and grant,
the module image cache, and the compiled hot path (hot_path.py, hot_dispatch.c) that serves the steady state's
records in C.

It is a Handler (handler.py) that any session loop drives, whatever carries the records: it imports the ground floor
of host_agent only, never the daemon, the relay or kvm. What does not belong here: reading records off a transport
(session_loop.py), serving regions (daemon/), relaying (relay/).
"""
