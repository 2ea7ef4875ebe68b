"""Running the controller: connect to etcd, serve the HTTP app, stop cleanly on SIGINT/SIGTERM.

Start-up prints Orion's lines (``Creating database connection to <etcd>``, ``Database connection is
created.``, ``Orion CE Controller is launching, listening on <addr>``) in Orion's logrus format. A cluster key
that cannot be used (``--key-file``: missing, a link, readable by others, too short; docs/security.md), an etcd
that does not answer at start, or a port that cannot be bound, ends the start with one line saying what to do;
once running, an etcd outage only turns requests into 503s until it is back.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from controller.cluster_key import ClusterKeyError, load_key
from controller.config import ControllerConfig
from controller.errors import EtcdUnavailable
from controller.http_api import build_app
from controller.keys import Keys
from controller.pool import GpuPool
from controller.store import EtcdStore

log = logging.getLogger("controller")

SHUTDOWN_TIMEOUT_S = 5.0
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


class StartError(Exception):
    """The controller cannot start; the message is the one line to print."""


def _quoted(text: str) -> str:
    """``text`` for inside logrus' ``msg="..."``: backslashes and quotes escaped, and every character that is
    not printable (newline, carriage return, other controls, Unicode line separators) written as an escape, as
    logrus quotes it: a path or name a client sent can never end the line or forge another."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class LogrusFormatter(logging.Formatter):
    """``time="..." level=info msg="..."``: the format Orion's controller (Go, logrus) wrote, one line each."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.created))
        level = {"WARNING": "warning", "CRITICAL": "fatal"}.get(record.levelname, record.levelname.lower())
        msg = record.getMessage()
        if record.exc_info:
            msg += " " + self.formatException(record.exc_info).replace("\n", " | ")
        return f'time="{ts}" level={level} msg="{_quoted(msg)}"'


def setup_logging(config: ControllerConfig) -> None:
    handler: logging.Handler
    if config.log_file:
        try:
            handler = logging.FileHandler(config.log_file)
        except OSError as exc:
            raise StartError(f"cannot open log file {config.log_file}: {exc.strerror}; pick a writable path "
                             f"for --log") from None
    else:
        handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(LogrusFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[config.log_level])
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


ETCD_RETRY_S = 0.5


async def _wait_for_etcd(store: EtcdStore, executor: ThreadPoolExecutor, within_s: float) -> None:
    """Return once etcd answers a status request, asking again every half second for `within_s` (--etcd-timeout)
    before giving up: an etcd starting alongside the controller, or one busy for a moment (a single member on a
    loaded 2-core machine refused one connection in a CI run), is not a failed start; a missing one still is,
    within seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            await loop.run_in_executor(executor, store.healthy)
            return
        except EtcdUnavailable:
            if loop.time() + ETCD_RETRY_S > deadline:
                raise
            await asyncio.sleep(ETCD_RETRY_S)


async def serve(config: ControllerConfig, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or ``stop`` is set)."""
    try:  # first: without its key the controller could not tell a member from anyone else
        key = load_key(Path(config.key_file))
    except ClusterKeyError as exc:
        raise StartError(f"{exc}; the controller does not start without the cluster key (--key-file)") from None
    log.info("Creating database connection to %s", config.etcd_url)
    store = EtcdStore(config.etcd_url, config.etcd_timeout_s)
    executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="etcd")
    loop = asyncio.get_running_loop()
    try:
        try:
            await _wait_for_etcd(store, executor, config.etcd_timeout_s)
        except EtcdUnavailable as exc:
            raise StartError(exc.message) from None
        log.info("Database connection is created.")
        pool = GpuPool(store, Keys(config.key_root), config.lease_ttl_s, config.host_ttl_s,
                       tiebreak_salt=uuid.uuid4().hex, max_txn_ops=config.etcd_max_txn_ops)
        log.info("At most %d vGPUs per allocation (etcd --max-txn-ops %d)", pool.max_vgpus, pool.max_txn_ops)
        app = build_app(pool, executor, key, config.limits, config.max_body_kib << 10)
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        site = web.TCPSite(runner, config.listen_host, config.listen_port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise StartError(f"cannot listen on {config.listen}: {exc.strerror}; is another controller running "
                             f"there? Pick another --listen address") from None
        log.info("Orion CE Controller is launching, listening on %s", config.listen)
        stop = stop or asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("Orion CE Controller is stopping")
        await runner.cleanup()
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        store.close()


def run(config: ControllerConfig) -> int:
    """Set up logging and serve; the exit status (0 clean stop, 1 could not start, 130 interrupted at start)."""
    try:
        setup_logging(config)
    except StartError as exc:
        print(f"orion-controller: {exc}", file=sys.stderr)
        return 1
    try:
        asyncio.run(serve(config))
    except StartError as exc:
        log.error("%s", exc)
        print(f"orion-controller: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return 130
    return 0
