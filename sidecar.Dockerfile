# The podprobe sidecar: one static (musl) binary on a distroless base, non-root, read-only
# root filesystem friendly (it writes nothing to disk).
#
#   docker build -f sidecar.Dockerfile -t podprobe:dev .
#
# The default base has no shell. Exec probes in `local` mode run in the sidecar's own container,
# so commands such as `sh -c ...` need a base with a shell: --build-arg BASE=busybox:1.37-musl.
# The `procfs` and `api` exec modes run the command in the target container instead.
ARG BASE=gcr.io/distroless/static-debian12:nonroot

FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --profile sidecar --locked --no-default-features --target x86_64-unknown-linux-musl -p podprobe --bin podprobe \
 && cp target/x86_64-unknown-linux-musl/sidecar/podprobe /podprobe

FROM ${BASE}
COPY --from=build /podprobe /usr/local/bin/podprobe
# distroless "nonroot"; matches runAsUser in the examples.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podprobe"]
CMD ["run"]
