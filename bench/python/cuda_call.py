#!/usr/bin/env python3
"""Where one convolution of a patched model spends its time: a CUDA tensor handed to convd,
against F.conv2d in the same process, batch 1, fp16, channels_last.

    cuda_call.py --socket PATH [--calls 2000] [--every 16] [--json OUT.json]

Needs torch with a CUDA device and a GPU daemon on PATH's socket (bench/python/models-h200.sh
runs it in its convd phases, under MPS and not). For each problem, one figure per mode, the
median over --calls calls after a warm-up, in microseconds per call.

Stream-ordered (docs/python.md, "Stream ordering"; a daemon of protocol 3, unless
$CONVD_STREAM_ORDERED is 0): the call queues the request on the stream and returns, so there is
no synchronisation to split off; what a call costs is its CPU time, and what a convolution takes
is the time per call of a run of calls that synchronises now and then:

  issue       client.conv2d(x, w) alone: the CPU time of one call, issued in bursts of --every
              calls with a torch.cuda.synchronize() between bursts (not timed), so that the
              calls never wait for a free slot
  every 1     (client.conv2d + torch.cuda.synchronize()) per call: one convolution's latency
  every N     (N x client.conv2d, then torch.cuda.synchronize()) / N, N = --every: the time per
              convolution when the CPU runs ahead of the GPU, as in a model's forward
  torch 1, torch N   the same two for F.conv2d

Synchronous (stream_ordered=False: the path before protocol 3), the old split:

  torch       F.conv2d + torch.cuda.synchronize(): what PyTorch's own call costs when its
              result is waited for
  convd       client.conv2d(x, w): the whole call (the package synchronises the stream, names
              the tensors' allocations, submits and waits)
  sync        torch.cuda.current_stream().synchronize() on an idle stream
  locate      the package's lookup of the input's, weight's and output's allocations
              (three driver attribute queries and a dictionary)
  empty       torch.empty of the output, channels_last
  rest        convd - sync - locate - empty: the request's round trip through the daemon (its
              queue and exec, below) and the package's own code around it

and, for each path, the daemon's mean queue and exec per request over its calls (its metrics),
and for the stream-ordered one the mean time its requests that reached the daemon before their
stream's ready write waited for it (convd_gate_wait_seconds; "-" when none had to). With the
daemon's batch_timing, "daemon device" is a batch's mean time on the device
(convd_device_seconds, "-" without it): exec less device is the host's part of a batch.

With --split, the stream-ordered call's CPU time is split too (one problem, rx50_s1_3x3_g32,
each step alone in bursts as "issue" is; medians in us):

  module      convd.torch.Conv2d(x): the patched layer, as a model calls it
  torch mod   the same nn.Conv2d unpatched: PyTorch's own layer call
  conv2d      client.conv2d(x, w, b)
  empty       torch.empty of the output, channels_last
  stream      the caller's current stream's handle
  locate      the package's lookup of the four tensors' allocations (x, w, b, out)
  order       the ready write and the done wait queued on the stream (two driver calls, with
              the context check), on words that are already satisfied
  batched     the same two operations through one cuStreamBatchMemOp
  ctypes      one trivial driver call through ctypes (cuCtxGetCurrent): the floor of a call
  forward     the patched layer's forward() called directly, without nn.Module's __call__
  call_tuples conv2d's inner call with the layer's argument forms (tuples, a layout word)
  identity    an nn.Identity layer: the floor of nn.Module's __call__

and with --profile N, cProfile's top functions over N calls of the patched layer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# The package of this tree, or of $CONVD_PYTHON_DIR (another version of it, for an A/B run).
sys.path.insert(0, os.environ.get("CONVD_PYTHON_DIR")
                or str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convd  # noqa: E402

# name: N, C, H, W, K, R, S, stride, pad, groups (resnext50_32x4d's first stage, and layer 3)
PROBLEMS = {
    "rx50_s1_1x1_in": (1, 256, 56, 56, 128, 1, 1, 1, 0, 1),
    "rx50_s1_3x3_g32": (1, 128, 56, 56, 128, 3, 3, 1, 1, 32),
    "rx50_s1_1x1_out": (1, 128, 56, 56, 256, 1, 1, 1, 0, 1),
    "rx50_s3_3x3_g32": (1, 512, 14, 14, 512, 3, 3, 1, 1, 32),
}

METRICS = ("queue", "exec", "gate_wait", "device")


def median_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def burst_issue_us(fn, calls: int, every: int) -> float:
    """The median CPU time of one call, in bursts of `every` calls separated by an untimed
    torch.cuda.synchronize()."""
    times = []
    while len(times) < calls:
        torch.cuda.synchronize()
        for _ in range(min(every, calls - len(times))):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def every_us(fn, calls: int, every: int) -> float:
    """The median over runs of (`every` calls, then torch.cuda.synchronize()) / every."""
    runs = []
    for _ in range(max(1, calls // every)):
        t0 = time.perf_counter_ns()
        for _ in range(every):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter_ns() - t0) / every)
    return statistics.median(runs) / 1e3


def metric_sums(client) -> dict:
    """(sum, count) of the daemon's queue, exec and gate wait histograms."""
    want = {f"convd_{m}_seconds_{p}" for m in METRICS for p in ("sum", "count")}
    out = {}
    for line in client.metrics().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in want:
            out[parts[0]] = float(parts[1])
    return out


def daemon_means(before: dict, after: dict, prefix: str) -> dict:
    row = {}
    for what in METRICS:
        ds = after.get(f"convd_{what}_seconds_sum", 0) - before.get(f"convd_{what}_seconds_sum", 0)
        dn = after.get(f"convd_{what}_seconds_count", 0) - before.get(
            f"convd_{what}_seconds_count", 0
        )
        row[f"{prefix}daemon_{what}_us"] = ds / dn * 1e6 if dn else None
    return row


def tensors(spec):
    n, c, h, w_, k, r, s, stride, pad, groups = spec
    dev = torch.device("cuda")
    cl = torch.channels_last
    x = torch.randn(n, c, h, w_, device=dev, dtype=torch.float16).contiguous(memory_format=cl)
    wt = torch.randn(k, c // groups, r, s, device=dev, dtype=torch.float16)
    wt = wt.contiguous(memory_format=cl)
    return x, wt, dict(stride=stride, padding=pad, groups=groups)


def rel_err(out, x, wt, args) -> float:
    ref = F.conv2d(x, wt, **args).float()
    return float((out.float() - ref).norm() / ref.norm())


def measure_sync(client, name, spec, calls: int) -> dict:
    """The synchronous path, split (stream_ordered=False)."""
    x, wt, args = tensors(spec)
    dev = x.device
    cl = torch.channels_last
    torch.backends.cudnn.benchmark = True
    out = client.conv2d(x, wt, **args)
    err = rel_err(out, x, wt, args)
    stream = torch.cuda.current_stream()

    def plain():
        F.conv2d(x, wt, **args)
        torch.cuda.synchronize()

    def through():
        client.conv2d(x, wt, **args)

    regions = client._cuda  # the package's CUDA registrations, made by the call above

    def locate():
        regions.locate(x.data_ptr(), x.numel() * 2)
        regions.locate(wt.data_ptr(), wt.numel() * 2)
        regions.locate(out.data_ptr(), out.numel() * 2)

    def empty():
        torch.empty(out.shape, device=dev, dtype=out.dtype, memory_format=cl)

    for fn in (plain, through, stream.synchronize, locate, empty):
        for _ in range(max(50, calls // 10)):
            fn()
    before = metric_sums(client)
    row = {"problem": name, "calls": calls, "rel_err": err}
    row["convd_us"] = median_us(through, calls)
    after = metric_sums(client)
    row["torch_us"] = median_us(plain, calls)
    row["sync_us"] = median_us(stream.synchronize, calls)
    row["locate_us"] = median_us(locate, calls)
    row["empty_us"] = median_us(empty, calls)
    row["rest_us"] = row["convd_us"] - row["sync_us"] - row["locate_us"] - row["empty_us"]
    row.update(daemon_means(before, after, ""))
    return row


def measure_ordered(client, name, spec, calls: int, every: int) -> dict:
    """The stream-ordered path: CPU time per call issued, and time per call with a
    synchronisation every call and every `every` calls, against F.conv2d's."""
    x, wt, args = tensors(spec)
    torch.backends.cudnn.benchmark = True
    out = client.conv2d(x, wt, **args)
    client.synchronize()
    err = rel_err(out, x, wt, args)

    def plain():
        F.conv2d(x, wt, **args)

    def through():
        client.conv2d(x, wt, **args)

    for fn in (plain, through):
        for _ in range(max(50, calls // 10)):
            fn()
        torch.cuda.synchronize()
    client.synchronize()
    row = {"problem": name, "calls": calls, "every": every, "rel_err": err}
    before = metric_sums(client)
    row["issue_us"] = burst_issue_us(through, calls, every)
    row["every1_us"] = every_us(through, calls, 1)
    row["everyN_us"] = every_us(through, calls, every)
    client.synchronize()  # every completion taken, every failure raised
    after = metric_sums(client)
    row["torch_issue_us"] = burst_issue_us(plain, calls, every)
    row["torch_every1_us"] = every_us(plain, calls, 1)
    row["torch_everyN_us"] = every_us(plain, calls, every)
    row.update(daemon_means(before, after, ""))
    return row


def measure_split(client, calls: int, every: int, profile: int = 0) -> dict:
    """The stream-ordered call's CPU time, step by step (module docstring, --split)."""
    import ctypes

    import convd.torch  # noqa: F401  (a submodule: not imported by `import convd`)
    from convd import _client as cl
    from convd import _cuda as cu

    spec = PROBLEMS["rx50_s1_3x3_g32"]
    x, wt, args = tensors(spec)
    b = torch.randn(wt.shape[0], device=x.device, dtype=x.dtype)
    conv = torch.nn.Conv2d(spec[1], spec[4], spec[5], stride=spec[7], padding=spec[8],
                           groups=spec[9]).to(device=x.device, dtype=x.dtype)
    conv = conv.to(memory_format=torch.channels_last)
    mod = convd.torch.patch(torch.nn.Conv2d(spec[1], spec[4], spec[5], stride=spec[7],
                                            padding=spec[8], groups=spec[9]), client)
    mod = mod.to(device=x.device, dtype=x.dtype, memory_format=torch.channels_last)
    out = client.conv2d(x, wt, b, **args)
    client.synchronize()
    dev = x.device.index
    gates = client._gates
    cr = client._cuda
    drv = gates.drv
    stream = cl._current_stream(dev)
    plan = list(client._plans.values())[-1]  # the conv2d's just above: the newest
    a = plan.conv_args()
    shape = tuple(out.shape)
    spare = gates.dptr[dev] + 8 * gates.slots  # both words 0: the write and wait are no-ops

    batch = cu._sym(drv.lib, "cuStreamBatchMemOp_v2", "cuStreamBatchMemOp")
    ops = (ctypes.c_uint64 * 12)()  # two CUstreamBatchMemOpParams of 48 bytes
    ops[0] = 2  # CU_STREAM_MEM_OP_WRITE_VALUE_32
    ops[1] = spare
    ops[6] = 1  # CU_STREAM_MEM_OP_WAIT_VALUE_32
    ops[7] = spare + 4
    if batch is not None:
        batch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
        batch.restype = ctypes.c_int
    cur = ctypes.c_void_p()

    def locate():
        segs = []
        cl._locate_tensors(cr, plan, a, x, wt, b, out, segs)
        for s_ in segs:
            s_.inflight -= 1

    steps = {
        "module": lambda: mod(x),
        "torch_mod": lambda: conv(x),
        "conv2d": lambda: client.conv2d(x, wt, b, **args),
        "empty": lambda: torch.empty(shape, dtype=x.dtype, device=x.device,
                                     memory_format=torch.channels_last),
        "stream": lambda: cl._current_stream(dev),
        "locate": locate,
        "order": lambda: gates.order(dev, stream, gates.slots, 0),
        "ctypes": lambda: drv.lib.cuCtxGetCurrent(ctypes.byref(cur)),
    }
    if batch is not None:
        steps["batched"] = lambda: batch(stream, 2, ops, 0)
    # Where the patched layer's time goes beyond conv2d's: its forward without nn.Module's
    # __call__, and conv2d with the module's argument forms (tuples, a layout word).
    m_args = (mod.stride, mod.padding, mod.dilation, mod.groups, mod.convd_act, None)
    ident = torch.nn.Identity()
    steps["forward"] = lambda: mod.forward(x)
    steps["call_tuples"] = lambda: client._call(x, wt, b, *m_args, "nhwc", 0, True)
    steps["identity"] = lambda: ident(x)
    row = {"problem": "rx50_s1_3x3_g32", "path": "split"}
    for name, fn in steps.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        client.synchronize()
        row[f"{name}_us"] = burst_issue_us(fn, calls, every)
        client.synchronize()
    if profile:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for i in range(profile):
            mod(x)
            if i % every == every - 1:
                torch.cuda.synchronize()
        pr.disable()
        client.synchronize()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        row["profile"] = buf.getvalue()
    if batch is not None and batch(stream, 2, ops, 0) != 0:
        row["batched_us"] = None  # refused: the figure is of an error return
    torch.cuda.synchronize()
    return row


def fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--every", type=int, default=16,
                    help="calls between synchronisations in the stream-ordered 'every N' mode")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--split", action="store_true",
                    help="also split the stream-ordered call's CPU time step by step")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="with --split, print cProfile's top functions over N patched-layer calls")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 1
    dev_name = torch.cuda.get_device_name(0)
    rows = []
    ordered = convd.connect(a.socket)
    if ordered.stream_ordered:
        for name, spec in PROBLEMS.items():
            rows.append(dict(measure_ordered(ordered, name, spec, a.calls, a.every),
                             path="stream-ordered"))
        if a.split:
            rows.append(measure_split(ordered, a.calls, a.every, a.profile))
    proto = ordered.info["protocol_version"]
    ordered.close()
    sync = convd.connect(a.socket, stream_ordered=False)
    for name, spec in PROBLEMS.items():
        rows.append(dict(measure_sync(sync, name, spec, a.calls), path="synchronous"))
    sync.close()

    print(f"{dev_name}, torch {torch.__version__}, {a.calls} calls a mode; medians in us per call")
    print()
    ord_rows = [r for r in rows if r["path"] == "stream-ordered"]
    if ord_rows:
        n = a.every
        print(f"Stream-ordered (protocol {proto}): CPU time per call issued, and time per call "
              f"synchronising every call and every {n} calls")
        print()
        print(f"| problem | issue | every 1 | every {n} | torch issue | torch 1 | torch {n} | "
              "daemon queue | daemon exec | daemon device | gate wait | rel err |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in ord_rows:
            print(f"| {r['problem']} | {r['issue_us']:.1f} | {r['every1_us']:.1f} | "
                  f"{r['everyN_us']:.1f} | {r['torch_issue_us']:.1f} | "
                  f"{r['torch_every1_us']:.1f} | {r['torch_everyN_us']:.1f} | "
                  f"{fmt(r['daemon_queue_us'])} | {fmt(r['daemon_exec_us'])} | "
                  f"{fmt(r['daemon_device_us'])} | {fmt(r['daemon_gate_wait_us'])} | "
                  f"{r['rel_err']:.1e} |")
        print()
    else:
        why = ("CONVD_STREAM_ORDERED=0" if proto >= 3 else f"the daemon speaks protocol {proto}")
        print(f"Stream-ordered: not measured ({why}).")
        print()
    split = [r for r in rows if r["path"] == "split"]
    if split:
        names = ("module", "torch_mod", "conv2d", "empty", "stream", "locate", "order",
                 "batched", "ctypes", "forward", "call_tuples", "identity")
        print("Stream-ordered issue, step by step (rx50_s1_3x3_g32, CPU us per step)")
        print()
        print("| " + " | ".join(names) + " |")
        print("|" + "---:|" * len(names))
        print("| " + " | ".join(fmt(split[0].get(f"{n}_us")) for n in names) + " |")
        print()
        if split[0].get("profile"):
            print("```")
            print(split[0].pop("profile"))
            print("```")
            print()
    print("Synchronous (stream_ordered=False): one call, split")
    print()
    print("| problem | torch | convd | sync | locate | empty | rest | daemon queue | daemon exec "
          "| daemon device | rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["path"] != "synchronous":
            continue
        print(f"| {r['problem']} | {r['torch_us']:.1f} | {r['convd_us']:.1f} | {r['sync_us']:.1f} | "
              f"{r['locate_us']:.1f} | {r['empty_us']:.1f} | {r['rest_us']:.1f} | "
              f"{fmt(r['daemon_queue_us'])} | {fmt(r['daemon_exec_us'])} | "
              f"{fmt(r['daemon_device_us'])} | {r['rel_err']:.1e} |")
    if a.json:
        Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
