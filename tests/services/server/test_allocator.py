"""``gymckpt serve`` tunes glibc's allocator (an hour's soak once saw resident memory grew as malloc's free-but-kept
bytes): blocks of 64 KB and more get their own mapping, returned to the system when freed; a setting the
environment gives is left alone. Each case runs in a fresh interpreter, as a server starts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")

PROBE = r"""
import ctypes, ctypes.util, json, sys

from gym_services.server.allocator import tune_allocator

applied = tune_allocator() if sys.argv[1] == "tune" else {}
libc = ctypes.CDLL(ctypes.util.find_library("c"))

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2().hblks
blocks = [libc.malloc(100_000) for _ in range(40)]
mapped = libc.mallinfo2().hblks - before
for block in blocks:
    libc.free(block)
print(json.dumps({"applied": applied, "mapped": mapped}))
"""


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_large_blocks_get_their_own_mapping_once_tuned() -> None:
    untuned, tuned = probe("plain"), probe("tune")
    assert untuned["applied"] == {} and untuned["mapped"] == 0  # glibc's default: 100 KB blocks come from the heap
    assert tuned["applied"] == {"mmap_threshold": 64 * 1024, "arena_max": 2}
    assert tuned["mapped"] >= 30  # a few may still fit the heap's free top


@pytest.mark.parametrize(
    ("env", "applied"),
    [
        ({"MALLOC_MMAP_THRESHOLD_": "1048576"}, {"arena_max": 2}),
        ({"MALLOC_ARENA_MAX": "4"}, {"mmap_threshold": 64 * 1024}),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576:glibc.malloc.arena_max=4"}, {}),
    ],
)
def test_a_setting_the_environment_gives_is_left_alone(env: dict[str, str], applied: dict[str, int]) -> None:
    result = probe("tune", **env)
    assert result["applied"] == applied
    if "mmap_threshold" not in applied:
        assert result["mapped"] == 0  # the operator's 1 MB threshold holds: 100 KB blocks stay in the heap


TRIM_PROBE = r"""
import ctypes, ctypes.util, json, sys, time

from gym_services.server.allocator import Trimmer, tune_allocator

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

tune_allocator()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
# 64 MB of 4 KB blocks, touched; all freed but the last, which pins the heap's top: free pages below it stay resident
blocks = [libc.malloc(4096) for _ in range(16384)]
for block in blocks:
    libc.memset(block, 1, 4096)
for block in blocks[:-1]:
    libc.free(block)
freed = rss_kib()
if sys.argv[1] == "thread":
    trimmer = Trimmer.start(0.05)
    deadline = time.monotonic() + 30
    while trimmer.trims == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    trimmer.stop()
    trims = trimmer.trims
elif sys.argv[1] == "once":
    Trimmer(30, libc).trim()
    trims = 1
else:
    time.sleep(0.2)
    trims = 0
print(json.dumps({"freed_kib": freed, "after_kib": rss_kib(), "trims": trims, "off": Trimmer.start(0) is None}))
"""


def trim_probe(mode: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", TRIM_PROBE, mode], env=clean, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_trimmer_gives_free_pages_below_the_heaps_top_back() -> None:
    """64 MB freed below one live block stay resident until a trim; the trimmer's thread returns them (and an
    interval of 0 starts no trimmer)."""
    kept, once, thread = trim_probe("none"), trim_probe("once"), trim_probe("thread")
    assert kept["freed_kib"] - kept["after_kib"] < 8 * 1024  # without a trim the freed pages stay
    for trimmed in (once, thread):
        assert trimmed["trims"] >= 1 and trimmed["off"]
        assert trimmed["freed_kib"] - trimmed["after_kib"] > 48 * 1024
