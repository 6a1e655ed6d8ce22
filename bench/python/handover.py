#!/usr/bin/env python3
"""How long one GPU stream takes to hand over to another through a 32-bit word, the way a
stream-ordered convolution crosses between a client and the daemon (docs/architecture.md,
"Lanes"): stream A writes `ping` (cuStreamWriteValue32) and waits for `pong` >= the same value
(cuStreamWaitValue32, GEQ); stream B waits for `ping` and writes `pong`. One round trip is two
hand-overs.

    handover.py [--rounds 100] [--repeats 15] [--json OUT]

Rows: the two streams in one process, and in two processes (the second a spawned child, as
a client and the daemon are), with the words in pinned host memory (a shared mapping
registered with cuMemHostRegister, as the gate slabs are) and in device memory (a CUDA
allocation the child opens by IPC). Run it under MPS to measure what convd's clients see there:
bench/python/handover-h200.sh starts one.

Each repeat queues `--rounds` round trips on both streams behind a start word (always in host
memory, stored by the CPU: a kernel storing it would queue behind the waits wherever streams
share a hardware queue), then opens it, so the host's queueing is not what is timed: A's
events around its rounds give the device time, whose median over the repeats per round trip
is reported, in microseconds.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
from ctypes import POINTER, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p
from multiprocessing import shared_memory

import torch
import torch.multiprocessing as mp

GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
PORTABLE_DEVICEMAP = 0x1 | 0x2  # CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
WORDS = 4096  # bytes of each word region: start at 0, ping at 256, pong at 512 (own lines)
START, PING, PONG = 0, 256, 512


class Driver:
    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")

        def sym(*names):
            for n in names:
                f = getattr(lib, n, None)
                if f is not None:
                    return f
            raise RuntimeError(f"libcuda.so.1 has none of {names}")

        self.write = sym("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self.wait = sym("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self.register = sym("cuMemHostRegister_v2", "cuMemHostRegister")
        self.unregister = sym("cuMemHostUnregister")
        self.dptr = sym("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
        for f, args in (
            (self.write, [c_void_p, c_uint64, c_uint32, c_uint]),
            (self.wait, [c_void_p, c_uint64, c_uint32, c_uint]),
            (self.register, [c_void_p, c_size_t, c_uint]),
            (self.unregister, [c_void_p]),
            (self.dptr, [POINTER(c_uint64), c_void_p, c_uint]),
        ):
            f.argtypes = args
            f.restype = c_int

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUDA driver error {rc}")


class HostWords:
    """A shared mapping, registered in this process; `addr` is its device address."""

    def __init__(self, drv, name=None):
        self.shm = (
            shared_memory.SharedMemory(name=name)
            if name
            else shared_memory.SharedMemory(create=True, size=WORDS)
        )
        self._anchor = ctypes.c_char.from_buffer(self.shm.buf)  # dropped before close
        self.host = ctypes.addressof(self._anchor)
        if name is None:
            ctypes.memset(self.host, 0, WORDS)
        drv.check(drv.register(self.host, WORDS, PORTABLE_DEVICEMAP), "cuMemHostRegister")
        d = c_uint64()
        drv.check(drv.dptr(ctypes.byref(d), self.host, 0), "cuMemHostGetDevicePointer")
        self.addr = d.value
        self.drv = drv

    def set(self, off, value):
        c_uint32.from_address(self.host + off).value = value

    def close(self, unlink):
        self.drv.unregister(self.host)
        del self._anchor
        self.shm.close()
        if unlink:
            self.shm.unlink()


def queue_side(drv, stream, start, addr, start_value, first, rounds):
    """Queues B's side of one repeat: wait for the start word (host), then `rounds` times wait
    for ping and write pong."""
    h = c_void_p(stream.cuda_stream)
    drv.check(drv.wait(h, start.addr + START, start_value, GEQ), "cuStreamWaitValue32")
    for i in range(first, first + rounds):
        drv.check(drv.wait(h, addr + PING, i, GEQ), "cuStreamWaitValue32")
        drv.check(drv.write(h, addr + PONG, i, 0), "cuStreamWriteValue32")


def child(conn, kind, shm_name, dev_words, rounds, repeats):
    """The second process: B's side of every repeat, queued as the parent asks."""
    torch.cuda.init()
    drv = Driver()
    stream = torch.cuda.Stream()
    words = HostWords(drv, shm_name)
    addr = words.addr if kind == "host" else dev_words.data_ptr()
    for r in range(repeats):
        conn.recv()  # the parent's "queue repeat r"
        queue_side(drv, stream, words, addr, r + 1, r * rounds + 1, rounds)
        conn.send("queued")
    stream.synchronize()
    conn.send("done")
    words.close(unlink=False)


def measure(kind, procs, rounds, repeats):
    drv = Driver()
    a = torch.cuda.Stream()
    words = HostWords(drv)
    dev_words = None
    if kind == "host":
        addr = words.addr
    else:
        dev_words = torch.zeros(WORDS // 4, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        addr = dev_words.data_ptr()
    proc = conn = b = None
    if procs == 2:
        ctx = mp.get_context("spawn")
        conn, cconn = ctx.Pipe()
        proc = ctx.Process(
            target=child,
            args=(cconn, kind, words.shm.name, dev_words, rounds, repeats),
        )
        proc.start()
    else:
        b = torch.cuda.Stream()
    per_round = []
    for r in range(repeats):
        first = r * rounds + 1
        if procs == 2:
            conn.send("queue")
            conn.recv()
        else:
            queue_side(drv, b, words, addr, r + 1, first, rounds)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h = c_void_p(a.cuda_stream)
        drv.check(drv.wait(h, words.addr + START, r + 1, GEQ), "cuStreamWaitValue32")
        e0.record(a)
        for i in range(first, first + rounds):
            drv.check(drv.write(h, addr + PING, i, 0), "cuStreamWriteValue32")
            drv.check(drv.wait(h, addr + PONG, i, GEQ), "cuStreamWaitValue32")
        e1.record(a)
        words.set(START, r + 1)
        e1.synchronize()
        if r > 0:  # the first repeat warms up
            per_round.append(e0.elapsed_time(e1) * 1000.0 / rounds)
    if procs == 2:
        assert conn.recv() == "done"
        proc.join(30)
    else:
        b.synchronize()
    words.close(unlink=True)
    del dev_words  # after the child has gone: it opened the allocation by IPC
    return statistics.median(per_round)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("handover.py: torch sees no CUDA device")
    mps = "under MPS" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "no MPS pipe directory set"
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {mps}; "
          f"{args.rounds} round trips a repeat, median of {args.repeats - 1} repeats\n")
    print("| streams | words | us per round trip | us per hand-over |")
    print("|---|---|---:|---:|")
    rows = []
    for procs in (1, 2):
        for kind in ("host", "device"):
            us = measure(kind, procs, args.rounds, args.repeats)
            where = "one process" if procs == 1 else "two processes"
            print(f"| {where} | {kind} memory | {us:.1f} | {us / 2:.1f} |", flush=True)
            rows.append({"procs": procs, "words": kind, "round_trip_us": us})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
