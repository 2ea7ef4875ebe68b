"""Runs inside the test guest (tests/guest/vm.py): the relay's RDMA transport on Soft-RoCE (rdma_rxe).

  rdma_guest.py stream   two processes joined by a TCP connection move to RDMA (host_agent/relay/transport.py)
                         and exchange records: small ones both ways, one larger than the whole inbox, one
                         written and read in uneven pieces; then the far end dies and the near end must see it
  rdma_guest.py relay    a GPU host (tests/controller/fake_gpu_agent.py --listen --rdma: the real listener,
                         workers and executor over the stand-in driver) and a relaying oriond (a real one, its
                         server.conf with enable_rdma and [server-relay] remote_addr), a client on the relay's
                         region: its calls and a 12 MiB copy go over RDMA; the differential corpus
                         (tests/differential/corpus.py) over RDMA through the capsule path and the native library,
                         each transcript compared with the fake driver's own; the link drops under a session and
                         comes back; then the same session with the GPU host's device missing (the TCP fallback,
                         with its reason in both logs)
  rdma_guest.py check    stream, then relay (one boot: what tests/guest/test_guest_rdma.py runs)
  rdma_guest.py bench    the raw pyverbs baseline (SEND/RECV round trip, RDMA WRITE stream), the transport's
                         record round trip and one-way bulk, then relay's sessions timed (bench/rdma_bench.py)

relay and check take native=PATH (relative to the checkout): the native library the corpus runs through, built on
the host (the guest has no C compiler; test_guest_rdma.py builds a fresh one); default: setup.sh's build.

Soft-RoCE: `rdma link add rxe0 type rxe netdev lo` (TESTBED.md: verbs work on loopback), so both ends use
127.0.0.1 and the same device. Lines starting with RDMA- are what tests/guest/test_guest_rdma.py reads.
"""
from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

for site in glob.glob("/mnt/orion/.venv/lib/python3*/site-packages"):  # in the guest only
    sys.path.append(site)  # the checkout's own environment (posix_ipc, ...): the guest's Python is the same 3.11
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), site) if p)

from host_agent.relay import transport  # noqa: E402
from host_agent.relay.frames import ConnectionLost  # noqa: E402
from host_agent.relay.rdma_stream import PIECE, SLOTS, RdmaStream  # noqa: E402
from host_agent.relay.transport import RdmaSettings  # noqa: E402


def sh(command: str) -> str:
    out = subprocess.run(command, shell=True, capture_output=True, text=True)
    return (out.stdout + out.stderr).strip()


BULK = 0x101  # the far end answers this opcode with an empty payload
ODD = 0x102  # the far end reads this one's payload in uneven pieces (begin + read_payload), then echoes it reversed
ODD_READS = (1, 31, 4096, 70001, PIECE, PIECE + 3)  # cycled through
PINGS = 300


def soft_roce() -> None:
    sh("ip link set lo up")
    print("RDMA-SETUP", sh("modprobe rdma_rxe && rdma link add rxe0 type rxe netdev lo && echo ok").splitlines()[-1])
    gids = sorted(glob.glob("/sys/class/infiniband/rxe0/ports/1/gids/*"), key=lambda p: int(p.rsplit("/", 1)[1]))
    print("RDMA-GIDS", " ".join(f"{p.rsplit('/', 1)[1]}={Path(p).read_text().strip()}" for p in gids[:4]))


def _pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    near = socket.create_connection(listener.getsockname())
    far, _ = listener.accept()
    listener.close()
    return near, far


def _far(sock: socket.socket, offer_out: int, offer_in: int) -> None:
    """The far end (a child): answers each record with its payload reversed; a record of opcode 9 ends it hard."""
    link, why = transport.prepare(sock, RdmaSettings(True))
    if link is None:
        print("RDMA-FAR no link:", why, flush=True)
        os._exit(3)
    os.write(offer_out, link.offer())
    peer = os.read(offer_in, 4096)
    stream = transport.connect(link, peer, sock)
    while True:
        record = stream.begin()
        if record is None:
            continue
        if record.opcode == 9:
            os._exit(0)  # dies without a word: its kernel closes the TCP connection
        payload, at, i = bytearray(record.length), 0, 0
        while at < record.length:
            n = min(ODD_READS[i % len(ODD_READS)] if record.opcode == ODD else record.length, record.length - at)
            stream.read_payload(memoryview(payload)[at:at + n])
            at, i = at + n, i + 1
        record = record._replace(payload=payload)
        answer = b"" if record.opcode == BULK else bytes(record.payload[::-1])
        stream.send(record.call_id, record.opcode, answer, status=7)


def _transport_pair() -> tuple[RdmaStream, int]:
    """This process's end of an RDMA transport connection (the handshake's offers go over pipes) and the pid of the
    far end (_far); SystemExit when this end cannot offer RDMA."""
    near_sock, far_sock = _pair()
    to_far, from_near = os.pipe()
    to_near, from_far = os.pipe()
    pid = os.fork()
    if pid == 0:
        near_sock.close()
        _far(far_sock, from_far, to_far)
    far_sock.close()
    link, why = transport.prepare(near_sock, RdmaSettings(True))
    if link is None:
        raise SystemExit(f"RDMA-NOLINK {why}")
    print("RDMA-PORT", transport.describe(link))
    os.write(from_near, link.offer())
    return transport.connect(link, os.read(to_near, 4096), near_sock), pid


def stream() -> int:
    soft_roce()
    near, pid = _transport_pair()
    ok = True
    for size in (256, 0, 1, 100, PIECE - 32, PIECE, 3 * PIECE + 5, SLOTS * PIECE * 2 + 12345):
        data = os.urandom(size)
        near.send(size, 0x100, data)
        answer = near.receive(timeout=60)
        good = answer is not None and answer.call_id == size and answer.status == 7 and \
            bytes(answer.payload) == data[::-1]
        ok &= good
        print(f"RDMA-ECHO size={size} {'ok' if good else 'WRONG'}")
    ok &= _frame_in_pieces(near)
    t0 = time.perf_counter()
    for i in range(200):
        near.send(i, 0x100, b"x" * 32)
        near.receive(timeout=10)
    print(f"RDMA-RTT {1e6 * (time.perf_counter() - t0) / 200:.1f} us")
    near.send(1, 9)
    t0 = time.perf_counter()
    try:
        near.receive(timeout=20)
        print("RDMA-DEATH not seen")
        ok = False
    except ConnectionLost as exc:
        print(f"RDMA-DEATH seen in {time.perf_counter() - t0:.2f} s: {exc}")
    os.waitpid(pid, 0)
    near.close()
    return 0 if ok else 1


def _frame_in_pieces(near: RdmaStream) -> bool:
    """A frame written in uneven pieces (open_frame), read by the far end in other uneven pieces, and its answer
    read here a third way: the bytes must come back reversed, whole."""
    data = os.urandom(SLOTS * PIECE + 3 * PIECE + 777)  # more than the inbox holds: credit must flow mid-frame
    writer = near.open_frame(77, ODD, len(data))
    at, i, sizes = 0, 0, (5, 65536, PIECE - 1, 3 * PIECE + 11, 1 << 20)
    while at < len(data):
        n = min(sizes[i % len(sizes)], len(data) - at)
        writer.write(memoryview(data)[at:at + n])
        at, i = at + n, i + 1
    writer.close()
    head = near.begin(timeout=60)
    answer = bytearray(len(data))
    good = head is not None and head.call_id == 77 and head.length == len(data)
    if good:
        for start in range(0, len(data), 300007):
            near.read_payload(memoryview(answer)[start:start + 300007])
        good = bytes(answer) == data[::-1]
    print(f"RDMA-PIECES size={len(data)} {'ok' if good else 'WRONG'}")
    return good


RAW_SIZE, RAW_WRITES, RAW_IN_FLIGHT = 4 << 20, 32, 4


def _raw_end(sock: socket.socket, serve: bool) -> None:
    """Raw pyverbs between the two processes (the baseline): SEND/RECV ping-pong of 32 bytes, then RDMA WRITEs of
    RAW_SIZE into the server's buffer. QP details go over `sock`."""
    import json

    import pyverbs.enums as e
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR

    from host_agent.relay.rdma_stream import find_port
    port = find_port("127.0.0.1")
    ctx = Context(name=port.device)
    pd, cq = PD(ctx), CQ(ctx, 256)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=64, max_recv_wr=64)))
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    mr = MR(pd, RAW_SIZE, access)
    sock.sendall(json.dumps({"qpn": qp.qp_num, "addr": mr.buf, "rkey": mr.rkey}).encode().ljust(256))
    peer = json.loads(sock.recv(256, socket.MSG_WAITALL))
    attr = QPAttr()
    attr.qp_access_flags, attr.pkey_index, attr.port_num = access, 0, 1
    qp.to_init(attr)
    attr.ah_attr = AHAttr(port_num=1, is_global=1, dlid=0, gr=GlobalRoute(
        dgid=GID(":".join(port.gid[i:i + 2].hex() for i in range(0, 16, 2))), sgid_index=port.gid_index,
        hop_limit=64))
    attr.dest_qp_num, attr.path_mtu, attr.rq_psn, attr.max_dest_rd_atomic, attr.min_rnr_timer = \
        peer["qpn"], e.IBV_MTU_1024, 0, 1, 12
    qp.to_rtr(attr)
    attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 0, 14, 7, 7, 1
    qp.to_rts(attr)

    def recv() -> None:
        qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf, 32, mr.lkey)]))

    def send(opcode: int = e.IBV_WR_SEND, size: int = 32) -> None:
        wr = SendWR(wr_id=2, opcode=opcode, num_sge=1, sg=[SGE(mr.buf, size, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        if opcode == e.IBV_WR_RDMA_WRITE:
            wr.set_wr_rdma(peer["rkey"], peer["addr"])
        qp.post_send(wr)

    def poll(n: int) -> None:
        while n:
            got, wcs = cq.poll(num_entries=n)
            for wc in wcs[:got]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise RuntimeError(f"raw baseline: work completion status {wc.status}")
            n -= got

    sock.sendall(b"r")
    sock.recv(1)  # both QPs are in RTS
    if serve:
        for _ in range(PINGS):
            recv()
            poll(1)
            send()
            poll(1)
        sock.recv(1)  # the client's writes are done
        return
    t0 = time.perf_counter()
    for _ in range(PINGS):
        recv()
        send()
        poll(2)
    rtt = (time.perf_counter() - t0) / PINGS
    t0 = time.perf_counter()
    for i in range(RAW_WRITES):
        send(e.IBV_WR_RDMA_WRITE, RAW_SIZE)
        if i >= RAW_IN_FLIGHT - 1:
            poll(1)
    poll(RAW_IN_FLIGHT - 1)
    rate = RAW_WRITES * RAW_SIZE / (time.perf_counter() - t0)
    sock.sendall(b"d")
    print(f"RDMA-RAW rtt_us={1e6 * rtt:.1f} write_MBps={rate / 1e6:.1f}", flush=True)


def bench() -> int:
    """The raw baseline, then the relay's stream on the same device: record round trip and one-way bulk."""
    soft_roce()
    near_sock, far_sock = _pair()
    pid = os.fork()
    if pid == 0:
        near_sock.close()
        _raw_end(far_sock, serve=True)
        os._exit(0)
    far_sock.close()
    _raw_end(near_sock, serve=False)
    os.waitpid(pid, 0)
    near_sock.close()

    near, pid = _transport_pair()
    for i in range(20):
        near.send(i, 0x100, b"x" * 32)
        near.receive(timeout=10)
    t0 = time.perf_counter()
    for i in range(PINGS):
        near.send(i, 0x100, b"x" * 32)
        near.receive(timeout=10)
    rtt = (time.perf_counter() - t0) / PINGS
    bulk = os.urandom(16 << 20)
    t0 = time.perf_counter()
    for i in range(4):
        near.send(i, BULK, bulk)
        near.receive(timeout=60)  # an empty answer: the bytes went one way
    rate = 4 * len(bulk) / (time.perf_counter() - t0)
    print(f"RDMA-STREAM rtt_us={1e6 * rtt:.1f} bulk_MBps={rate / 1e6:.1f}", flush=True)
    near.send(1, 9)
    os.waitpid(pid, 0)
    near.close()
    return relay(setup=False, corpus=False)


def check(native: str = "") -> int:
    return stream() or relay(setup=False, native=native)


class Hosts:
    """A GPU host (fake_gpu_agent.py: listener, workers and executor of oriond over the stand-in driver, RDMA on
    with `gpu_rdma` as its ibverbs_device) and a relaying oriond (a real one: enable_rdma, [server-relay]
    remote_addr = the GPU host) in `work`; `relay_region` is the relay's region, `gpu_region` the GPU host's."""

    def __init__(self, work: Path, gpu_rdma: str, relay_sections: str = "", gpu_args: tuple[str, ...] = (),
                 gpu_env: dict[str, str] | None = None) -> None:
        """`relay_sections`: more of the relay's server.conf; `gpu_args`, `gpu_env`: more of the GPU host's command
        line (fake_gpu_agent.py's flags) and environment."""
        from tests.controller.oriond_proc import Oriond
        from tests.controller.rig import REPO, free_port, wait_until
        from tests.processes import python_path
        work.mkdir(parents=True)
        self.gpu_region, self.gpu_log = work / "gpu-region", work / "gpu.log"
        with open(self.gpu_region, "wb") as f:
            f.truncate(32 << 20)
        port = free_port()
        with open(self.gpu_log, "wb") as log:
            self.gpu = subprocess.Popen(
                [sys.executable, "tests/controller/fake_gpu_agent.py", str(self.gpu_region), "127.0.0.1", "--listen",
                 str(port), "--rdma", gpu_rdma, *gpu_args], stdout=log, stderr=subprocess.STDOUT,
                cwd=REPO, env={**os.environ, "PYTHONPATH": python_path(), **(gpu_env or {})})
        self.relay = Oriond(work / "relay", "127.0.0.1", None, gpus=[], listen_port=free_port(), rdma="",
                            relay_to=f"127.0.0.1:{port}", sections=relay_sections)
        self.relay_region = self.relay.shm / "orionsock0"
        with open(self.relay_region, "wb") as f:
            f.truncate(32 << 20)
        self.relay.start()
        wait_until("the GPU host to listen", lambda: "listens on" in self.gpu_text(), 120, self.gpu_text)
        wait_until("the relay to serve its region", lambda: "Using SHM" in self.relay.log(), 120, self.relay.log)
        wait_until("the GPU host to serve its region", lambda: "Using SHM" in self.gpu_text(), 120, self.gpu_text)

    def gpu_text(self) -> str:
        return self.gpu_log.read_text(errors="replace")

    def stop(self) -> None:
        from tests.processes import stop_process
        self.relay.stop()
        stop_process(self.gpu, 20)


def session_check(region: Path, copy: int) -> tuple[bool, float, float]:
    """A client session on `region`: context, a `copy`-byte copy there and back (checked), then timings: (bytes
    came back right, a synchronous call's round trip in us, copy MB/s both ways)."""
    from tests.forwarding_rig import Guest
    guest = Guest(str(region))
    try:
        guest.setup()
        pointer = guest.alloc(copy)
        data = os.urandom(copy)
        good = guest.htod(pointer, data) == 0 and guest.dtoh(pointer, copy) == (0, data)
        for _ in range(10):
            guest.sync()
        t0 = time.perf_counter()
        for _ in range(PINGS):
            guest.sync()
        rtt = 1e6 * (time.perf_counter() - t0) / PINGS
        t0 = time.perf_counter()
        for _ in range(2):
            guest.htod(pointer, data)
            guest.dtoh(pointer, copy)
        rate = 4 * copy / (time.perf_counter() - t0) / 1e6
        return good, rtt, rate
    finally:
        guest.close()


COPY = 12 << 20  # more than the RDMA inbox, the relay's 1 MiB pieces and the rings' staging arenas


def link_drop(hosts: Hosts) -> bool:
    """The link under a relayed RDMA session drops (`ip link set lo down`: rxe0's port goes down with it): the
    guest's call fails with CUDA_ERROR_DEVICE_UNAVAILABLE within the relay's silence bound and every later one at
    once, and the GPU host ends its session; once the link is back, a new session works."""
    from tests.controller.rig import wait_until
    from tests.forwarding_rig import Guest
    guest = Guest(str(hosts.relay_region))
    guest.setup()
    pointer = guest.alloc(4096)
    print("RDMA-LINK", sh("ip link set lo down && echo down"))
    try:
        t0 = time.perf_counter()
        first = guest.sync()
        took = time.perf_counter() - t0
        later = guest.htod(pointer, b"x")
        wait_until("the GPU host to end the session", lambda: " ended: " in hosts.gpu_text(), 60, hosts.gpu_text)
    finally:
        print("RDMA-LINK", sh("ip link set lo up && echo up"))
        guest.close()
    print(f"RDMA-LINKDOWN sync={first} after {took:.1f} s, then {later}")
    good = session_check(hosts.relay_region, 4096)[0]
    print(f"RDMA-HEALED copy={'ok' if good else 'WRONG'}")
    return first == later == 46 and good


# The differential corpus over RDMA. Its seeds: the first three of test_differential.py's, about a minute of the
# guest's time for the reference and both paths under TCG (the run prints each one's took_s).
DIFF_SEEDS = (1, 2, 3)
NATIVE_BUILD = "guest_runtime/native/lib/libcuda.so.1"  # setup.sh's build in the checkout
NATIVE_TIMEOUT_S = 300
RELAYED = re.compile(r"session \d+: relayed to \S+ \(its session \d+\) over (\w+)")  # the relay's log, a session


def differential(hosts: Hosts, native: str) -> None:
    """The differential corpus (tests/differential/corpus.py), seeds DIFF_SEEDS, relayed over RDMA through the
    capsule path (a Forwarder in this process) and through the native library `native` (a path in the checkout: a
    child running tests/differential/run_corpus.py, as test_differential.py does), each transcript compared with
    the fake driver's own, computed here. One line a path:

      RDMA-DIFF <path> seeds=N differences=D relayed=<how the relay says it relayed that path's sessions> took_s=T

    and, for each seed that differs, its first difference on `RDMA-WHY <path> seed=N:` lines; a path that could
    not run says `failed: why` (its stderr on RDMA-WHY lines) or `missing: why` in place of differences=D. The
    lines are the verdict (test_guest_rdma.py reads them), not the exit status: the boot goes on, and the test
    shows the difference."""
    from tests.controller.rig import REPO
    from tests.differential.corpus import Runner, fake_table, first_difference, sequence
    from tests.fake_driver import FakeDriver
    from tests.forwarding_rig import Guest, native_child_env

    t0 = time.perf_counter()
    reference = Runner(fake_table(FakeDriver(devices=1)))
    wanted = {seed: reference.run(sequence(seed)) for seed in DIFF_SEEDS}
    print(f"RDMA-DIFF reference seeds={len(DIFF_SEEDS)} took_s={time.perf_counter() - t0:.1f}")

    def capsule() -> list[list[list[object]]]:
        guest = Guest(str(hosts.relay_region))
        try:
            runner = Runner(guest.fn)
            return [runner.run(sequence(seed)) for seed in DIFF_SEEDS]
        finally:
            guest.close()

    def native_child() -> list[list[list[object]]]:
        import json
        library = REPO / native
        if not library.is_file():
            raise _Missing(f"no native library at {native} (the host builds it: guest_runtime/native/build.py "
                           "--driver; the guest has no C compiler)")
        command = [sys.executable, "-m", "tests.differential.run_corpus", "driver", str(library),
                   *map(str, DIFF_SEEDS)]
        done = subprocess.run(command, cwd=REPO, env=native_child_env(library, str(hosts.relay_region)),
                              capture_output=True, text=True, timeout=NATIVE_TIMEOUT_S)
        if done.returncode != 0:
            raise _Failed(f"run_corpus exited {done.returncode}", done.stderr)
        return json.loads(done.stdout)["transcripts"]  # type: ignore[no-any-return]

    for path, run in (("capsule", capsule), ("native", native_child)):
        sessions = len(RELAYED.findall(hosts.relay.log()))
        t0 = time.perf_counter()
        why: dict[str, str] = {}  # label (seed=N, or stderr) -> what to show
        try:
            transcripts = run()
            for seed, got in zip(DIFF_SEEDS, transcripts, strict=True):
                text = first_difference(wanted[seed], got, sequence(seed))
                if text:
                    why[f"seed={seed}"] = text
            verdict = f"differences={len(why)}"
        except _Missing as exc:
            verdict = f"missing: {exc}"
        except Exception as exc:  # said on the line (and its stderr below): the rest of the boot goes on
            verdict = f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            if isinstance(exc, _Failed):
                why["stderr"] = exc.stderr[-3000:]
        relayed = ",".join(RELAYED.findall(hosts.relay.log())[sessions:]) or "none"
        print(f"RDMA-DIFF {path} seeds={len(DIFF_SEEDS)} {verdict} relayed={relayed} "
              f"took_s={time.perf_counter() - t0:.1f}")
        for label, text in why.items():
            for line in text.splitlines():
                print(f"RDMA-WHY {path} {label}: {line}")


class _Missing(Exception):
    """The native library is not there."""


class _Failed(Exception):
    """A path's process failed; `stderr`: what it wrote there."""

    def __init__(self, why: str, stderr: str) -> None:
        super().__init__(why)
        self.stderr = stderr


def relay(setup: bool = True, native: str = "", corpus: bool = True) -> int:
    """Relayed sessions over RDMA (and the differential corpus through them, with `corpus`: see differential()),
    then with the GPU host's device missing (TCP, and why), through real orionds."""
    import tempfile
    if setup:
        soft_roce()
    ok = True
    work = Path(tempfile.mkdtemp(prefix="orion-rdma-"))
    for case, gpu_rdma in (("rdma", "any"), ("fallback", "rxe9")):
        hosts = Hosts(work / case, gpu_rdma)
        try:
            good, rtt, rate = session_check(hosts.relay_region, COPY)
            ok &= good
            print(f"RDMA-RELAY {case} copy={'ok' if good else 'WRONG'} rtt_us={rtt:.0f} copy_MBps={rate:.1f}")
            if case == "rdma":
                good, rtt, rate = session_check(hosts.gpu_region, COPY)
                print(f"RDMA-RELAY local copy={'ok' if good else 'WRONG'} rtt_us={rtt:.0f} copy_MBps={rate:.1f}")
                if corpus:
                    differential(hosts, native or NATIVE_BUILD)
                ok &= link_drop(hosts)
        finally:
            hosts.stop()
        for who, text in (("relay", hosts.relay.log()), ("gpu", hosts.gpu_text())):
            for line in text.splitlines():
                if any(w in line for w in ("relayed to", "relayed over", "RDMA", "TCP mode", "listens on",
                                           "GPU host is gone", " ended: ")):
                    print(f"RDMA-LOG {case} {who}: {line.split('] ', 1)[-1]}")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    command, options = argv[0], {name: value for name, _, value in (arg.partition("=") for arg in argv[1:])}
    native = options.get("native", "")  # native=PATH
    if command == "relay":
        return relay(native=native)
    if command == "check":
        return check(native)
    return {"stream": stream, "bench": bench}[command]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
