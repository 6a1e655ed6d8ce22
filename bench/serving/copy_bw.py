#!/usr/bin/env python3
"""Pinned host <-> device copy bandwidth for requests of a given size, through PyTorch.

The yardstick of convd's host-memory rows in bench/serving/serving-h200.sh: a request moves its
input to the GPU and its output back, so the copies are timed at exactly those sizes, from and to
pinned host memory (convd pins its clients' shared memory):

  h2d       input-sized copies host -> device, back to back on one stream
  d2h       output-sized copies device -> host
  request   one of each per iteration on one stream (input in, output out), in sequence
  bidir     the h2d copies on one stream and the d2h copies on another at the same time
  64mb      64 MB copies each way, for reference (the link without per-copy costs)

Each is the bytes moved / the time of --iters copies after a warm-up (CUDA events around the
loop). Prints one JSON line with GB/s (1e9 bytes per second) for each.

  python3 copy_bw.py --bytes-in 802816 --bytes-out 802816
"""
import argparse
import json
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes-in", type=int, required=True, help="bytes of one request's input")
    ap.add_argument("--bytes-out", type=int, required=True, help="bytes of one request's output")
    ap.add_argument("--iters", type=int, default=0,
                    help="copies per measurement (default: about 1 GB of traffic, >= 200)")
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args(argv)
    if a.bytes_in < 1 or a.bytes_out < 1:
        ap.error("--bytes-in and --bytes-out must be positive")
    iters = a.iters or max(200, (1 << 30) // (a.bytes_in + a.bytes_out))

    import torch

    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    h_in = torch.empty(a.bytes_in, dtype=torch.uint8).pin_memory()
    h_out = torch.empty(a.bytes_out, dtype=torch.uint8).pin_memory()
    d_in = torch.empty(a.bytes_in, dtype=torch.uint8, device=dev)
    d_out = torch.empty(a.bytes_out, dtype=torch.uint8, device=dev)
    h_in.fill_(1)
    d_out.fill_(2)
    s1 = torch.cuda.Stream(dev)
    s2 = torch.cuda.Stream(dev)

    def timed(fn, nbytes, count=None):
        count = count or iters
        for _ in range(min(20, count)):
            fn()
        torch.cuda.synchronize()
        cur = torch.cuda.current_stream()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record(cur)
        # The copy streams start after e0 and end before e1; nothing else is queued per copy.
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        for _ in range(count):
            fn()
        cur.wait_stream(s1)
        cur.wait_stream(s2)
        e1.record(cur)
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1)
        return nbytes * count / (ms / 1e3) / 1e9

    def h2d():
        with torch.cuda.stream(s1):
            d_in.copy_(h_in, non_blocking=True)

    def d2h():
        with torch.cuda.stream(s1):
            h_out.copy_(d_out, non_blocking=True)

    def request():
        with torch.cuda.stream(s1):
            d_in.copy_(h_in, non_blocking=True)
            h_out.copy_(d_out, non_blocking=True)

    def bidir():
        with torch.cuda.stream(s1):
            d_in.copy_(h_in, non_blocking=True)
        with torch.cuda.stream(s2):
            h_out.copy_(d_out, non_blocking=True)

    # Large copies, for reference: the link's rate when per-copy costs do not matter.
    big = 64 << 20
    hb = torch.empty(big, dtype=torch.uint8).pin_memory()
    db = torch.empty(big, dtype=torch.uint8, device=dev)

    def h2d_big():
        with torch.cuda.stream(s1):
            db.copy_(hb, non_blocking=True)

    def d2h_big():
        with torch.cuda.stream(s1):
            hb.copy_(db, non_blocking=True)

    res = {
        "bytes_in": a.bytes_in,
        "bytes_out": a.bytes_out,
        "iters": iters,
        "h2d_gbps": round(timed(h2d, a.bytes_in), 2),
        "d2h_gbps": round(timed(d2h, a.bytes_out), 2),
        "request_gbps": round(timed(request, a.bytes_in + a.bytes_out), 2),
        "bidir_gbps": round(timed(bidir, a.bytes_in + a.bytes_out), 2),
        "h2d_64mb_gbps": round(timed(h2d_big, big, 40), 2),
        "d2h_64mb_gbps": round(timed(d2h_big, big, 40), 2),
        "device_name": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
    }
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
