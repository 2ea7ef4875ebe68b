"""The stop request oriond's loop polls is set safely from a signal handler (host_agent/stop.py says why an
Event would not be)."""
import os
import signal

from host_agent.stop import StopRequest


def test_a_signal_sets_the_request_and_cuts_a_wait_short() -> None:
    stop = StopRequest().on_signals(signal.SIGUSR1)
    try:
        assert not stop.is_set()
        assert stop.wait(0.001) is False
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.wait(30.0) is True  # the flag is read before sleeping: no 30 s wait
        assert stop.is_set()
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
