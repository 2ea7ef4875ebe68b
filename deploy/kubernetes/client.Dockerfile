# A client image: an unmodified CUDA Python program's environment plus orion-guest (no NVIDIA driver needed).
#   docker build -f deploy/kubernetes/client.Dockerfile -t <registry>/orion-client:0.1.0 .
# or, with no daemon and no registry, buildah: sudo bash deploy/kubernetes/build-images.sh (docs/kubernetes.md).
# Add the framework your program uses (PyTorch, CuPy, JAX) as you would on a GPU machine.
FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY guest_runtime /src/guest_runtime
COPY ivshmem /src/ivshmem
# PIP_CERT: the CA bundle pip trusts while building (deploy/kubernetes/Dockerfile says why); unset, pip's own.
ARG PIP_CERT
RUN python3 -m venv /opt/app && /opt/app/bin/pip install --no-cache-dir "/src/guest_runtime[cuda]" && rm -rf /src
ENV PATH=/opt/app/bin:$PATH
