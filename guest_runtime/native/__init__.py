"""The native guest library (issue 13): C sources and the step that builds them with the system compiler.

Nothing here is imported by a guest program's start-up; only build.py is Python, and it needs the stdlib alone.
"""
