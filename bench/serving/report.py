#!/usr/bin/env python3
"""The tables of bench/serving/serving-h200.sh from the files it wrote in OUTDIR.

  python3 bench/serving/report.py OUTDIR        markdown on stdout, OUTDIR/serving.csv

Reads (each optional; what is missing shows as a note):
  convd.jsonl       convctl bench --json lines: latency_b1_resnext, memory gpu and host, P x D
  copy-bw.json      copy_bw.py: pinned host <-> device copy bandwidth at one request's sizes
  daemon-n32.jsonl  convctl bench --json, n = 32, memory gpu, 4 clients x depth 2
  kernel-n32.csv    convd-bench-kernels --csv-out on the same n = 32 row
  torch.jsonl       torch_clients.py lines (modes alone, mps, batch)
Only the standard library is used.
"""
import csv
import json
import os
import sys

TARGET = 0.90  # daemon / kernel at batch 32, 4 clients x depth 2


def load_jsonl(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def fnum(v, fmt="%.0f"):
    return "n/a" if v is None else fmt % v


def fus(v):
    """Microseconds as the tables show them: us below 10 ms, else ms."""
    if v is None:
        return "n/a"
    if v >= 10000:
        return "%.1f ms" % (v / 1000)
    if v >= 100:
        return "%.0f us" % v
    return "%.1f us" % v


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: report.py OUTDIR\n")
        return 2
    out = argv[1]
    md = []
    csv_rows = []
    conv = load_jsonl(os.path.join(out, "convd.jsonl"))
    copy = load_jsonl(os.path.join(out, "copy-bw.json"))
    copy = copy[0] if copy else None
    torch_rows = load_jsonl(os.path.join(out, "torch.jsonl"))
    n32 = load_jsonl(os.path.join(out, "daemon-n32.jsonl"))
    n32 = n32[0] if n32 else None

    dev = next((r.get("device") for r in conv if r.get("device")), None)
    md.append("# convd serving benchmark")
    md.append("")
    if dev:
        md.append("Daemon device: %s. Shape: latency_b1_resnext (1x128x56x56, 128 filters 3x3, "
                  "32 groups, pad 1), fp16 NHWC." % dev)
        md.append("")

    # a. convd, with d. for the host rows.
    md.append("## convd: P client processes x D requests in flight")
    md.append("")
    if copy:
        md.append("Pinned copy bandwidth in this run, at one request's sizes (%d + %d bytes): "
                  "H2D %.1f GB/s, D2H %.1f GB/s, H2D then D2H on one stream %.1f GB/s "
                  "(the reference of the host rows), both directions at once %.1f GB/s; "
                  "64 MB copies: H2D %.1f, D2H %.1f GB/s."
                  % (copy["bytes_in"], copy["bytes_out"], copy["h2d_gbps"], copy["d2h_gbps"],
                     copy["request_gbps"], copy["bidir_gbps"], copy.get("h2d_64mb_gbps", 0),
                     copy.get("d2h_64mb_gbps", 0)))
    else:
        md.append("Pinned copy bandwidth: not measured (no copy-bw.json: no torch?).")
    md.append("")
    md.append("| memory | P | D | images/s | p50 | p99 | mean batch | exec (mean) | queue (mean) "
              "| daemon CPU/request | loop busy (launching) | host GB/s | of pinned copy | error |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    if not conv:
        md.append("| (no convd.jsonl rows) ||||||||||||||")
    for r in conv:
        gbps = frac = None
        if r.get("memory") == "host":
            moved = r.get("input_bytes", 0) + r.get("output_bytes", 0)
            gbps = moved * (r.get("req_per_s") or 0) / 1e9
            if copy and copy.get("request_gbps"):
                frac = gbps / copy["request_gbps"]
        loop = None
        if r.get("loop_busy") is not None:
            loop = "%.0f%% (%.0f%%)" % (100 * r["loop_busy"], 100 * (r.get("loop_launch") or 0))
        md.append("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r.get("memory"), r.get("clients", 0), r.get("depth", 0),
            fnum(r.get("images_per_s")), fus(r.get("p50_us")), fus(r.get("p99_us")),
            fnum(r.get("mean_batch"), "%.2f"), fus(r.get("exec_us")), fus(r.get("queue_us")),
            fus(r.get("daemon_cpu_us_per_req")), loop or "n/a", fnum(gbps, "%.1f"),
            fnum(frac, "%.2f"), r.get("error") or ""))
        csv_rows.append({
            "section": "convd", "memory": r.get("memory"), "procs": r.get("clients"),
            "depth": r.get("depth"), "batch": r.get("n"), "images_per_s": r.get("images_per_s"),
            "p50_us": r.get("p50_us"), "p99_us": r.get("p99_us"),
            "mean_batch": r.get("mean_batch"), "exec_us": r.get("exec_us"),
            "queue_us": r.get("queue_us"), "daemon_cpu_us_per_req":
            r.get("daemon_cpu_us_per_req"), "loop_busy": r.get("loop_busy"),
            "loop_launch": r.get("loop_launch"), "host_gbps": gbps, "frac_pinned": frac,
            "error": r.get("error")})
    md.append("")

    # b. PyTorch.
    md.append("## PyTorch: P processes, each with its own CUDA context")
    md.append("")
    md.append("F.conv2d + torch.cuda.synchronize() per call, cudnn.benchmark, fp16 channels_last; "
              "images/s = all processes' images / the longest process window; latency per call.")
    md.append("")
    md.append("| mode | processes | batch | images/s | p50 per call | p99 per call | error |")
    md.append("|---|---:|---:|---:|---:|---:|---|")
    if not torch_rows:
        md.append("| (no torch.jsonl rows: torch missing or not run) ||||||| ")
    names = {"alone": "alone (time-sliced)", "mps": "under MPS", "batch": "one process, batch P"}
    for r in torch_rows:
        md.append("| %s | %d | %d | %s | %s | %s | %s |" % (
            names.get(r.get("mode"), r.get("mode")), r.get("procs", 0), r.get("batch", 0),
            fnum(r.get("images_per_s")), fus(r.get("p50_us")), fus(r.get("p99_us")),
            r.get("error") or ""))
        csv_rows.append({
            "section": "torch-" + str(r.get("mode")), "memory": "gpu", "procs": r.get("procs"),
            "depth": 1, "batch": r.get("batch"), "images_per_s": r.get("images_per_s"),
            "p50_us": r.get("p50_us"), "p99_us": r.get("p99_us"), "error": r.get("error")})
    info = next((r for r in torch_rows if r.get("torch")), None)
    if info:
        md.append("")
        md.append("PyTorch %s, cuDNN %s, %s." % (info["torch"], info.get("cudnn"),
                                               info.get("device_name")))
    md.append("")

    # c. The kernel's own throughput at batch 32 against the daemon's.
    md.append("## Batch 32: the daemon against the kernel's own throughput")
    md.append("")
    kern_us = None
    kpath = os.path.join(out, "kernel-n32.csv")
    if os.path.exists(kpath):
        with open(kpath) as f:
            for row in csv.DictReader(f):
                try:
                    kern_us = float(row["ours_us"])
                except (KeyError, ValueError):
                    pass
                break
    kern_ips = 32 / kern_us * 1e6 if kern_us else None
    dmn_ips = n32.get("images_per_s") if n32 else None
    ratio = dmn_ips / kern_ips if dmn_ips and kern_ips else None
    md.append("| what | images/s | per batch of 32 | note |")
    md.append("|---|---:|---:|---|")
    md.append("| kernel alone (convd-bench-kernels, graph-timed device time) | %s | %s | |"
              % (fnum(kern_ips), fus(kern_us)))
    if n32:
        md.append("| daemon, memory gpu, 4 clients x depth 2 | %s | %s | p50 %s, p99 %s, mean "
                  "batch %.2f, exec %s, queue %s, daemon CPU %s/request%s |" % (
                      fnum(dmn_ips), fus(32 / dmn_ips * 1e6) if dmn_ips else "n/a",
                      fus(n32.get("p50_us")), fus(n32.get("p99_us")), n32.get("mean_batch") or 0,
                      fus(n32.get("exec_us")), fus(n32.get("queue_us")),
                      fus(n32.get("daemon_cpu_us_per_req")),
                      "; error: " + n32["error"] if n32.get("error") else ""))
    else:
        md.append("| daemon, memory gpu, 4 clients x depth 2 | n/a | n/a | no daemon-n32.jsonl |")
    md.append("")
    if ratio is not None:
        md.append("Daemon / kernel: **%.2f** (target >= %.2f: %s)."
                  % (ratio, TARGET, "met" if ratio >= TARGET else "MISSED"))
    else:
        md.append("Daemon / kernel: n/a (a measurement is missing; see the logs).")
    csv_rows.append({"section": "n32-kernel", "memory": "gpu", "procs": 1, "depth": 1,
                     "batch": 32, "images_per_s": kern_ips})
    csv_rows.append({"section": "n32-daemon", "memory": "gpu", "procs": 4, "depth": 2,
                     "batch": 32, "images_per_s": dmn_ips,
                     "p50_us": n32.get("p50_us") if n32 else None,
                     "p99_us": n32.get("p99_us") if n32 else None,
                     "mean_batch": n32.get("mean_batch") if n32 else None,
                     "exec_us": n32.get("exec_us") if n32 else None,
                     "queue_us": n32.get("queue_us") if n32 else None,
                     "daemon_cpu_us_per_req": n32.get("daemon_cpu_us_per_req") if n32 else None,
                     "frac_pinned": None, "error": n32.get("error") if n32 else None})
    md.append("")

    fields = ["section", "memory", "procs", "depth", "batch", "images_per_s", "p50_us", "p99_us",
              "mean_batch", "exec_us", "queue_us", "daemon_cpu_us_per_req", "loop_busy",
              "loop_launch", "host_gbps", "frac_pinned", "error"]
    with open(os.path.join(out, "serving.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in csv_rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    sys.stdout.write("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
