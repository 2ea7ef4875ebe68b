"""Domain and <shmem> templates for generated `virsh define` XML (the KVM issue builds them)."""
