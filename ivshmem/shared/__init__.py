"""What the host side and the guest side share besides the wire, on the same ground floor: Orion's configuration
syntax (ini: its INI files, addresses, numbers), the controller's HTTP client (controller_client: both oriond and a
guest's vGPU lease speak to the controller) and the C compiler lookup (compiler: the guest's native driver and the
host's compiled hot path are built alike). Standard library only, like the rest of ivshmem; shipped by both wheels.
What does not belong here: anything one side alone uses."""
