"""KVM and libvirt on the GPU host: the one libvirt connection (libvirt_gateway), in-place domain edits
(domain_edit), the attach and detach workflows (region_attach) and the one policy for giving QEMU a region
(qemu_region), docs/kvm.md. It imports the host agent's configuration and errors, ivshmem and xml_templates; nothing
of the daemon, the session executor or the relay (tests/unit/test_import_graph.py)."""
