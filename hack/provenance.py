#!/usr/bin/env python3
"""provenance.json for hack/release.sh: an in-toto statement (v1) with a SLSA provenance v1
predicate, unsigned. Its subjects are every artifact release.sh wrote to RELEASE_OUT, by
digest: the image lists of images.txt, the chart package, the plugin's archives and manifest,
the SBOMs. release.sh passes everything else it knows in RELEASE_* variables."""

import datetime, glob, hashlib, json, os

env = os.environ
out = env["RELEASE_OUT"]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


subjects = []
if os.path.exists(f"{out}/images.txt"):
    for line in open(f"{out}/images.txt").read().split():
        ref, digest = line.split("@", 1)
        algorithm, hex_digest = digest.split(":", 1)
        subjects.append({"name": ref, "digest": {algorithm: hex_digest}})
files = sorted(
    glob.glob(f"{out}/*.tgz") + glob.glob(f"{out}/*.tar.gz") + glob.glob(f"{out}/*.cdx.json")
    + [f"{out}/podprobe.yaml"]
)
subjects += [{"name": os.path.basename(f), "digest": {"sha256": sha256(f)}} for f in files]

dependencies = [{"name": "Cargo.lock", "digest": {"sha256": sha256("Cargo.lock")}}]
if env["RELEASE_COMMIT"]:
    source = {"uri": f"git+{env['RELEASE_ORIGIN']}" if env["RELEASE_ORIGIN"] else "git",
              "digest": {"gitCommit": env["RELEASE_COMMIT"]}}
    if env["RELEASE_DIRTY"]:
        source["annotations"] = {"uncommittedChanges": True}
    dependencies.insert(0, source)

statement = {
    "_type": "https://in-toto.io/Statement/v1",
    "subject": subjects,
    "predicateType": "https://slsa.dev/provenance/v1",
    "predicate": {
        "buildDefinition": {
            "buildType": "https://github.com/podprobe/podprobe/blob/main/hack/release.sh",
            "externalParameters": {
                "version": env["RELEASE_VERSION"],
                "registry": env["RELEASE_REGISTRY"],
                "push": env["RELEASE_PUSH"],
                "destination": env["RELEASE_DEST"],
            },
            "internalParameters": {
                "rustc": env["RELEASE_RUSTC"],
                "buildah": env["RELEASE_BUILDAH"],
                "helm": env["RELEASE_HELM"],
                "syft": env["RELEASE_SYFT"],
            },
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": "https://github.com/podprobe/podprobe/blob/main/hack/release.sh"},
            "metadata": {
                "startedOn": env["RELEASE_STARTED"],
                "finishedOn": datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            },
        },
    },
}
with open(f"{out}/provenance.json", "w") as f:
    json.dump(statement, f, indent=2)
    f.write("\n")
print(f"{len(subjects)} subjects")
