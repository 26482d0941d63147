#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/seed-*) from every annotation
value in the files given: the examples, and any text holding test vectors (the corpora
committed were seeded from the project's protocol notes too). Run from the repository root:
python3 fuzz/seed.py examples/*.yaml [FILE...]"""
import hashlib
import json
import pathlib
import re
import sys

spec = "\n".join(pathlib.Path(p).read_text() for p in sys.argv[1:])
arrays = []
for quoted in re.findall(r"'(\[\{.*?\}\]|\{.*?\})'", spec) + re.findall(r"^(\[\{.*\}\])$", spec, re.M):
    try:
        value = json.loads(quoted)
    except json.JSONDecodeError:
        continue
    entries = value if isinstance(value, list) else [value]
    if all(isinstance(e, dict) and "name" in e for e in entries):
        arrays.append(entries)


def write(target, data):
    out = pathlib.Path("fuzz/corpus") / target
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(data).hexdigest()[:12]
    (out / f"seed-{digest}").write_bytes(data)


def ppm(entries):
    probes = [dict(e, markerPolicy=[{"state": "Succeeded", "labels": {"idle": "true"}},
                                    {"state": "Failed", "annotations": {"controller.kubernetes.io/pod-deletion-cost": "100"}}])
              for e in entries]
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "ppm", "namespace": "games"},
            "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": probes}}


def review(obj, kind, resource):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                        "kind": {"group": kind[0], "version": kind[1], "kind": kind[2]},
                        "resource": {"group": kind[0], "version": kind[1], "resource": resource},
                        "namespace": "games", "operation": "CREATE",
                        "userInfo": {"username": "admin"}, "object": obj}}


for entries in arrays:
    text = json.dumps(entries, separators=(",", ":"))
    write("annotation", text.encode())
    write("go_json", text.encode())
    write("downward_api", f"kruise.io/podprobe={json.dumps(text)}\napp=\"game\"\n".encode())
    write("ppm_validation", json.dumps(ppm(entries)).encode())
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "gs-0", "namespace": "games", "labels": {"app": "game"},
                        "annotations": {"kruise.io/podprobe": text}},
           "spec": {"containers": [{"name": "main", "ports": [{"name": "main-port", "containerPort": 80}]}]},
           "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    write("admission_review", json.dumps(review(pod, ("", "v1", "Pod"), "pods")).encode())
    write("admission_review", json.dumps(review(ppm(entries), ("apps.kruise.io", "v1alpha1", "PodProbeMarker"), "podprobemarkers")).encode())
print(f"{len(arrays)} annotation vectors")
