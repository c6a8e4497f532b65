"""ajet/own_thread.py: torch work in a thread that ends with it."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from ajet.own_thread import in_own_thread


def test_the_result_comes_back_from_another_thread():
    names = []

    def work(a, *, b):
        names.append(threading.current_thread().name)
        return a + b

    assert in_own_thread(work, 2, b=3) == 5
    assert names == ["ajet-work"]
    assert names[0] != threading.current_thread().name


def test_an_exception_is_raised_in_the_caller_with_its_type():
    def fails():
        raise ValueError("bad sample at row 3")

    with pytest.raises(ValueError, match="bad sample at row 3"):
        in_own_thread(fails)


# In a fresh interpreter: how many OS threads exist before, after a matmul in its own thread, and
# after the same matmul in the main thread (which keeps its OpenMP pool for the process's life).
_COUNT = """
import os, time, torch
from ajet.own_thread import in_own_thread
torch.set_num_threads(2)
count = lambda: len(os.listdir("/proc/self/task"))
x = torch.randn(512, 512)
before = count()
in_own_thread(lambda: [x @ x for _ in range(20)])
for _ in range(100):  # the pool's workers exit just after the thread does
    if count() == before:
        break
    time.sleep(0.05)
passing = count()
[x @ x for _ in range(20)]
print(before, passing, count())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_the_openmp_pool_of_a_own_thread_ends_with_it():
    out = subprocess.run([sys.executable, "-c", _COUNT], capture_output=True, text=True, timeout=120, check=True)
    before, passing, direct = (int(v) for v in out.stdout.split())
    assert passing == before  # the pool of the own thread is gone
    assert direct > before  # the same work in a long-lived thread leaves its pool behind


def test_ctrl_c_waits_for_the_work_to_finish_then_interrupts():
    import signal
    import time

    finished = []

    def update():
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: KeyboardInterrupt in the main thread's join
        time.sleep(0.2)
        finished.append(True)  # e.g. the optimizer step completes: the weights stay whole
        return "metrics"

    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a run, whatever ran before
    try:
        with pytest.raises(KeyboardInterrupt):
            in_own_thread(update)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert finished == [True]
