"""orion-controller: the vGPU pool in etcd, Orion's REST API and a JSON API on :9123 (docs/controller.md).
Its client is ivshmem/shared/controller_client.py, which the guest wheel ships too."""
