"""The host side of Orion vGPU: serving regions (one worker process per client session), and later oriond,
the cuda-python executor and the libvirt gateway. It must not import guest_runtime."""
