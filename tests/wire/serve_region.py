#!/usr/bin/env python3
"""Test helper: serve one Orion region with the diagnostics handler until SIGINT or SIGTERM.

    python tests/wire/serve_region.py REGION_PATH [--heartbeat-timeout SECONDS]

tests/conftest.py runs this as a separate process (never a thread of the test process), so the tests talk
to a real host agent: a supervisor process plus one forked worker per claimed channel. A stop signal makes
serve_forever return, which ends every session (FAILED, AGENT_STOPPED) and marks the region STOPPED.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys

from host_agent.daemon.region_server import RegionServer
from host_agent.diagnostics import DiagnosticsHandler
from host_agent.session_loop import ServerOptions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0)
    parser.add_argument("--stall-timeout", type=float, default=ServerOptions.stall_timeout)
    parser.add_argument("--max-assembled", type=int, default=ServerOptions.max_assembled)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    server: RegionServer | None = None
    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True
        if server is not None:
            server.stop()

    # Installed before the server exists: the region reads SERVING as soon as the constructor returns, so a
    # test may already be stopping us before serve_forever starts.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server = RegionServer(args.path, DiagnosticsHandler, ServerOptions(
        heartbeat_timeout=args.heartbeat_timeout, stall_timeout=args.stall_timeout, max_assembled=args.max_assembled))
    if stop_requested:
        server.stop()
    server.serve_forever()
    logging.getLogger(__name__).info("stopped cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
