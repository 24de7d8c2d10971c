from __future__ import annotations

import os
import resource
import signal
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def writes_stay_in_tmp(tmp_path_factory, monkeypatch):
    """No test here may replace, rename, link or remove a file outside pytest's temporary folders.

    The hostile tests aim outputs at /dev/null and at files outside a model's folder; if a
    refusal ever broke, this guard fails the test instead of letting it damage the machine.
    """
    base = Path(tmp_path_factory.getbasetemp()).resolve()
    monkeypatch.setattr(tempfile, "tempdir", os.fspath(base))  # scratch files too

    def guarded(real, *positions):
        def call(*args, **kwargs):
            for i in positions if kwargs.get("dir_fd") is None else ():  # rmtree's own walk: inside its folder
                target = Path(os.path.abspath(os.fsdecode(args[i])))
                parent = target.parent.resolve()
                if not parent.is_relative_to(base):
                    raise AssertionError(f"a test wrote outside its tmp folder: {real.__name__}({target})")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "replace", guarded(os.replace, 1))
    monkeypatch.setattr(os, "rename", guarded(os.rename, 1))
    monkeypatch.setattr(os, "link", guarded(os.link, 1))
    monkeypatch.setattr(os, "unlink", guarded(os.unlink, 0))


#: Each hostile case runs under these: a defect that hangs or eats memory fails its test instead of the machine.
CASE_SECONDS = 300
CASE_ADDRESS_SPACE = 16 * 2**30


@pytest.fixture(autouse=True)
def bounded_case():
    """A time limit (SIGALRM) and an address-space limit (RLIMIT_AS, inherited by the commands a case starts)
    per case; both are put back afterwards."""

    def ran_too_long(signum, frame):
        raise AssertionError(f"a hostile case ran past its {CASE_SECONDS} s limit")

    previous_handler = signal.signal(signal.SIGALRM, ran_too_long)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = CASE_ADDRESS_SPACE if hard == resource.RLIM_INFINITY else min(CASE_ADDRESS_SPACE, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
