"""The host's administration commands: `orion-shm` (shm_cli, the work in shm_admin), `orion-smi` (orion_smi) and
`orion-wire-demo` (wire_demo). They import the host agent's configuration, errors, region rules and controller link,
and kvm/ for attach and detach; never the session executor or the relay (tests/unit/test_import_graph.py)."""
