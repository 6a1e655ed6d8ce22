#!/usr/bin/env python3
"""Where a tensor-copy kernel launch spends its time, block by block, from globaltimer stamps.

Input: the file that a diagnostics build of `convd-bench-kernels` writes (configure with
`-DCMAKE_CUDA_FLAGS=-DCONVD_MMA_TRACE -DCMAKE_C_FLAGS=-DCONVD_MMA_TRACE`, run with
`CONVD_TRACE_OUT=FILE --family mma`): one line per stamp, `shape dtype block event sm ns`, from
the second of two back-to-back launches of each shape. Events (thread 0 of each block,
conv_mma.hip's MMA_TR): 0 entry, 1 grid dependency resolved, 2 first weights in shared memory,
3 + 3i item i's halo landed, 4 + 3i its k loop done, 5 + 3i its output copy issued, 63 end.

Prints, per shape, the minimum, 10th percentile, median and maximum over blocks of each event's
time after the earliest entry (us), and of each item's compute and staging durations.
"""
import argparse
import collections


def quant(v):
    if not v:
        return "-"
    v = sorted(v)
    n = len(v)
    return "%6.2f %6.2f %6.2f %6.2f" % (v[0] / 1e3, v[n // 10] / 1e3, v[n // 2] / 1e3, v[-1] / 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="CONVD_TRACE_OUT file")
    ap.add_argument("--items", type=int, default=4, help="items to show per block (default 4)")
    args = ap.parse_args()
    shapes = collections.OrderedDict()
    for line in open(args.trace, encoding="utf-8"):
        f = line.split()
        if len(f) != 6:
            continue
        key = (f[0], f[1])
        shapes.setdefault(key, collections.defaultdict(dict))[int(f[2])][int(f[3])] = int(f[5])
    for (shape, dtype), blocks in shapes.items():
        t0 = min(ev[0] for ev in blocks.values() if 0 in ev)
        ends = [ev[63] for ev in blocks.values() if 63 in ev]
        span = (max(ends) - t0) / 1e3 if ends else float("nan")
        print(f"== {shape} {dtype}: {len(blocks)} blocks, {span:.2f} us from first entry to last end")
        print("   (us after the first entry: min p10 median max)")

        def rel(e):
            return [ev[e] - t0 for ev in blocks.values() if e in ev]

        def dur(a, b):
            return [ev[b] - ev[a] for ev in blocks.values() if a in ev and b in ev]

        print("   entry              ", quant(rel(0)))
        print("   dependency resolved", quant(rel(1)))
        print("   weights in smem    ", quant(rel(2)))
        for i in range(args.items):
            e = 3 + 3 * i
            if not rel(e):
                break
            print(f"   item {i} halo landed ", quant(rel(e)))
            print(f"          k loop      ", quant(dur(e, e + 1)))
            print(f"          staging     ", quant(dur(e + 1, e + 2)))
        print("   end                ", quant(rel(63)))


if __name__ == "__main__":
    main()
