"""The /etc/libvirt/hooks/qemu entry point that prepares and releases Orion regions (the KVM issue builds it).

It must never call back into libvirt: libvirt holds its locks while running a hook.
"""
