"""Read-only folders that stay read-only for root too.

chmod alone does not stop root: the CAP_DAC_OVERRIDE capability writes through permission bits, and these
tests often run as root (containers, CI machines). `read_only(folder)` clears the folder's write bits and,
where the process still can write in it, drops CAP_DAC_OVERRIDE from the calling thread's effective
capabilities for the block (capset(2); the permitted set keeps it, so it comes back after): writes there then
fail with the kernel's own EACCES, as they do for a user without root. CAP_DAC_READ_SEARCH stays, so root
still reads everything. Capabilities are per thread: the block's Python code (main.main in this process) runs
without it; threads TensorFlow started before keep theirs."""
from __future__ import annotations

import contextlib
import ctypes
import os
import stat

import pytest

_CAP_DAC_OVERRIDE = 1
_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _capabilities(change=None):
    """This thread's capabilities ([2] _Data); with `change(data)`, applied first."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _Header(_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    if change is not None:
        change(data)
        if libc.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
    return data


def _can_write_in(folder) -> bool:
    probe = os.path.join(folder, f".probe-{os.getpid()}")
    try:
        open(probe, "w").close()
    except PermissionError:
        return False
    os.remove(probe)
    return True


@contextlib.contextmanager
def read_only(folder):
    """Inside the block `folder` and everything under it cannot be written by this thread; restored after."""
    folder = str(folder)
    for base, _, _ in os.walk(folder):
        os.chmod(base, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    dropped = False
    try:
        if _can_write_in(folder):  # root: drop CAP_DAC_OVERRIDE, if it is what writes through the bits
            def clear(data):
                data[0].effective &= ~(1 << _CAP_DAC_OVERRIDE)
            if os.name == "posix" and _capabilities()[0].effective & (1 << _CAP_DAC_OVERRIDE):
                _capabilities(clear)
                dropped = True
            if _can_write_in(folder):
                pytest.skip("this process writes in a folder without write permission (a file system that "
                            "ignores the bits?)")
        yield folder
    finally:
        if dropped:
            def restore(data):
                data[0].effective |= 1 << _CAP_DAC_OVERRIDE
            _capabilities(restore)
        for base, _, _ in os.walk(folder):
            os.chmod(base, stat.S_IRWXU)
