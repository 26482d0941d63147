# The node tests' own images (testkit::real::node::images), built with buildah like the
# shipped ones in ../Dockerfile; each stage copies from a directory the harness prepares and
# names with --build-context. Nothing here is pulled.

# Kubernetes' pause (build/pause/linux/pause.c of the pinned module), static.
FROM scratch AS pause
COPY --from=pause-binary /pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]

# The test game server (TCP 7777, HTTP 8080, gRPC 9090) with busybox for exec probes; root,
# like many game server images.
FROM scratch AS gameserver
COPY --from=gameserver-rootfs / /
ENV PATH=/bin:/usr/local/bin
ENTRYPOINT ["/usr/local/bin/gameserver"]
