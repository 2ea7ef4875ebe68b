"""orion-controller: the vGPU pool in etcd and Orion's REST API on :9123 (the controller issue builds it)."""
