"""The host side of Orion vGPU: `oriond` (a supervisor process per region and a worker process per client session
running the cuda-python executor with its compiled hot path; the relay listener and its workers on a GPU host, the
relay of a GPU-less host's sessions; the link that registers this host's GPUs with the Orion Controller), host
administration (`orion-shm`, `orion-smi`, server.conf), the libvirt gateway behind `orion-shm attach/detach`, and
`orion-k8s-plugin` (k8s/). It imports ivshmem (ivshmem.shared included), xml_templates and controller.keys, never
guest_runtime (tests/unit/test_import_graph.py); its errors are host_agent/errors.py's tree."""
