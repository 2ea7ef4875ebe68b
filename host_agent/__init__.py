"""The host side of Orion vGPU, one folder per job (docs/architecture.md, "host_agent's folders"):

* daemon/   `oriond`: its configuration, the processes it supervises, region serving, the controller link;
* session/  the session executor: one session's CUDA calls on this host's GPU, with its compiled hot path;
* relay/    relayed sessions, both ends: the relaying host's route and relay, the GPU host's listener and workers;
* kvm/      libvirt: the gateway behind `orion-shm attach/detach`, in-place domain edits, regions for QEMU;
* admin/    the commands `orion-shm`, `orion-smi` and `orion-wire-demo`;
* k8s/      `orion-k8s-plugin`, kubelet's device plugin.

Its ground floor (the modules outside every folder) holds what the folders share: the error tree (errors.py), the
session loop and the transports it drives (session_loop.py, handler.py), supervised processes, the compiled modules'
build (native_build.py), server.conf's [server-shm] and the region maker. It imports ivshmem (ivshmem.shared
included), xml_templates and controller's keys and cluster key, never guest_runtime (tests/unit/test_import_graph.py
checks this and every folder's imports).
"""
