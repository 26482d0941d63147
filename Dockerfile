# podprobe's two images, for amd64 and arm64: static (musl) binaries on an empty base, non-root
# (65532, the "nonroot" of hack/image/etc), no shell, nothing written to the root filesystem.
#
#   docker buildx build --platform linux/amd64,linux/arm64 --target sidecar -t REPO/podprobe:TAG .
#   docker buildx build --platform linux/amd64,linux/arm64 --target manager -t REPO/podprobe-manager:TAG .
#
# The `binaries` stage runs on the build machine's platform and cross-compiles
# (hack/build-static.sh). To build the images from binaries built elsewhere with that script,
# replace the stage with a directory holding dist/podprobe and dist/podprobe-manager:
# `--build-context binaries=DIR` (docker buildx, buildah). The tests and hack/release.sh do
# that; see README "Install".
#
# Exec probes in `local` mode run in the sidecar's own container, so commands such as
# `sh -c ...` need a base with a shell: --build-arg SIDECAR_BASE=busybox:1.37-musl. The
# `procfs` and `api` exec modes run the command in the target container instead.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG SIDECAR_BASE=scratch

FROM --platform=$BUILDPLATFORM ${RUST_IMAGE} AS binaries
ARG TARGETARCH
WORKDIR /src
COPY hack/build-static.sh hack/
RUN hack/build-static.sh --toolchain ${TARGETARCH}
COPY . .
RUN hack/build-static.sh ${TARGETARCH} /dist

FROM ${SIDECAR_BASE} AS sidecar
COPY hack/image/etc/ /etc/
COPY --from=binaries /dist/podprobe /usr/local/bin/podprobe
# The exec agent alone, which `podprobe install-agent` copies into app containers.
COPY --from=binaries /dist/podprobe-agent /usr/local/bin/podprobe-agent
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podprobe"]
CMD ["run"]

FROM scratch AS manager
COPY hack/image/etc/ /etc/
COPY --from=binaries /dist/podprobe-manager /usr/local/bin/podprobe-manager
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podprobe-manager"]
CMD ["run"]
