"""The native guest driver: `libcuda.so.1` and `libnvidia-ml.so.1`, C sources, the generator of their calls from
the one call table (gen_libcuda.py) and the step that builds them with the system compiler (build.py); see
docs/native-driver.md.

Nothing here is imported by a guest program's start-up (the start-up hook loads the built library by its path);
build.py and gen_libcuda.py need the standard library and ivshmem alone, ctypes_client.py is a test and bench view.
"""
