"""libvirt's qemu hook for Orion regions, and its installer (`orion-hooks`).

qemu_hook.py is the entry point libvirt runs (prepare creates regions, release removes them, both wake the
host agent); regions.py holds what it does; installer.py places it in /etc/libvirt/hooks/qemu.d/ next to any
hook already there, plus the AppArmor rule where AppArmor is active. Nothing here may call libvirt: libvirt
holds its locks while a hook runs.
"""
