"""The host side of Orion vGPU: `oriond` (a supervisor process per region, a worker process per client
session, the cuda-python executor that runs forwarded calls on the GPU, the link that registers this host's
GPUs with the Orion Controller), host administration (`orion-shm`, server.conf) and the libvirt gateway behind
`orion-shm attach/detach`. From guest_runtime it imports ini.py and controller_client.py only."""
