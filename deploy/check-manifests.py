#!/usr/bin/env python3
"""Checks the Kubernetes manifests under deploy/ (CI stage "deploy"): every file is valid YAML;
every document names its apiVersion, kind and metadata.name; in every pod template, containers
have a name and an image, probes run a command given as a list of strings, every volume mount
names a volume of the pod, and a DaemonSet's selector matches its template's labels. For convd's
own DaemonSet: the host's /run/convd is mounted at /run/convd, where convd's --socket points.

    deploy/check-manifests.py [FILE...]     (default: deploy/kubernetes/*.yaml)

Prints one line per problem and exits 1 if there is any, else prints what it checked."""
import glob
import os
import sys

import yaml


def pod_spec(doc):
    kind = doc.get("kind")
    if kind == "Pod":
        return doc.get("spec")
    if kind in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
        return doc.get("spec", {}).get("template", {}).get("spec")
    return None


def check_pod(where, spec, problems):
    if not isinstance(spec, dict):
        problems.append(f"{where}: no pod spec")
        return
    volumes = {v.get("name"): v for v in spec.get("volumes", []) or []}
    containers = spec.get("containers") or []
    if not containers:
        problems.append(f"{where}: no containers")
    for c in containers + (spec.get("initContainers") or []):
        name = c.get("name")
        if not name or not c.get("image"):
            problems.append(f"{where}: a container without a name or an image")
        for key in ("command", "args"):
            if key in c and not all(isinstance(a, str) for a in c[key]):
                problems.append(f"{where}/{name}: {key} holds something that is not a string")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            cmd = c.get(probe, {}).get("exec", {}).get("command") if probe in c else None
            if probe in c and "exec" in c[probe] and (
                    not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd)):
                problems.append(f"{where}/{name}: {probe}.exec.command is not a list of strings")
        for m in c.get("volumeMounts", []) or []:
            if m.get("name") not in volumes:
                problems.append(f"{where}/{name}: mounts volume '{m.get('name')}', "
                                "which the pod does not have")
    return volumes, containers


def check_convd(where, volumes, containers, problems):
    """The daemon's socket lies in the host's /run/convd."""
    host = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/run/convd"]
    if not host:
        problems.append(f"{where}: no hostPath volume for /run/convd")
        return
    for c in containers:
        argv = (c.get("command") or []) + (c.get("args") or [])
        if not argv or os.path.basename(argv[0]) != "convd":
            continue
        mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts", [])}
        if mounts.get("/run/convd") not in host:
            problems.append(f"{where}/{c.get('name')}: the host's /run/convd is not mounted "
                            "at /run/convd")
        sockets = [a.split("=", 1)[1] for a in argv if a.startswith("--socket=")]
        if not sockets or not sockets[0].startswith("/run/convd/"):
            problems.append(f"{where}/{c.get('name')}: --socket=/run/convd/... missing")


def main(files):
    problems, checked = [], 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{path}: not valid YAML: {e}")
            continue
        for i, doc in enumerate(docs):
            where = f"{path}#{i + 1}"
            if not isinstance(doc, dict):
                problems.append(f"{where}: not a mapping")
                continue
            name = (doc.get("metadata") or {}).get("name")
            if not doc.get("apiVersion") or not doc.get("kind") or not name:
                problems.append(f"{where}: apiVersion, kind or metadata.name missing")
                continue
            where = f"{path}: {doc['kind']} {name}"
            checked += 1
            spec = pod_spec(doc)
            if spec is None and doc["kind"] not in ("Namespace", "ConfigMap", "Service"):
                problems.append(f"{where}: a kind this check does not know")
                continue
            if spec is None:
                continue
            result = check_pod(where, spec, problems)
            if result is None:
                continue
            volumes, containers = result
            if doc["kind"] == "DaemonSet":
                selector = doc["spec"].get("selector", {}).get("matchLabels", {})
                labels = doc["spec"]["template"].get("metadata", {}).get("labels", {})
                if not selector or any(labels.get(k) != v for k, v in selector.items()):
                    problems.append(f"{where}: selector.matchLabels do not match the template")
                check_convd(where, volumes, containers, problems)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check-manifests: {len(files)} file(s), {checked} object(s), no problem")
    return 0


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.exit(main(sys.argv[1:] or sorted(glob.glob(os.path.join(here, "kubernetes", "*.yaml")))))
