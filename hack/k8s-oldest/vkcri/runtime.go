package main

// The CRI side: a pod's sandbox and containers on containerd, as the kubelet's
// kuberuntime asks for them (the same messages, far fewer of their options).

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type criClients struct {
	runtime criapi.RuntimeServiceClient
	images  criapi.ImageServiceClient
}

func dialCRI(ctx context.Context, socket string) (*criClients, error) {
	//nolint:staticcheck // DialContext: the same call on both gRPC versions this source builds with.
	conn, err := grpc.DialContext(ctx, "unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	c := &criClients{runtime: criapi.NewRuntimeServiceClient(conn), images: criapi.NewImageServiceClient(conn)}
	version, err := c.runtime.Version(ctx, &criapi.VersionRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	fmt.Printf("vk-cri: runtime %s %s\n", version.RuntimeName, version.RuntimeVersion)
	return c, nil
}

// namespaces: the pod's network and IPC shared by its containers; its PIDs too when the pod
// asks for shareProcessNamespace.
func namespaces(pod *corev1.Pod) *criapi.NamespaceOption {
	pid := criapi.NamespaceMode_CONTAINER
	if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		pid = criapi.NamespaceMode_POD
	}
	return &criapi.NamespaceOption{Network: criapi.NamespaceMode_POD, Pid: pid, Ipc: criapi.NamespaceMode_POD}
}

func sandboxConfig(pod *corev1.Pod, logDir, cgroupParent string) *criapi.PodSandboxConfig {
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	return &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Hostname:     hostname,
		LogDirectory: logDir,
		Labels: map[string]string{
			"io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": pod.Namespace,
			"io.kubernetes.pod.uid": string(pod.UID),
		},
		Linux: &criapi.LinuxPodSandboxConfig{
			CgroupParent:    cgroupParent,
			SecurityContext: &criapi.LinuxSandboxSecurityContext{NamespaceOptions: namespaces(pod)},
		},
	}
}

// containerConfig: the container as the pod spec gives it; `command` and `args` as the
// kubelet passes them (an empty command keeps the image's entrypoint); env already resolved
// by the library (podutils); each volume mount a bind of the pod's volume directory.
func containerConfig(pod *corev1.Pod, c *corev1.Container, attempt uint32, volumes map[string]string) (*criapi.ContainerConfig, error) {
	cfg := &criapi.ContainerConfig{
		Metadata:   &criapi.ContainerMetadata{Name: c.Name, Attempt: attempt},
		Image:      &criapi.ImageSpec{Image: c.Image},
		Command:    c.Command,
		Args:       c.Args,
		WorkingDir: c.WorkingDir,
		LogPath:    filepath.Join(c.Name, fmt.Sprintf("%d.log", attempt)),
		Stdin:      c.Stdin,
		StdinOnce:  c.StdinOnce,
		Tty:        c.TTY,
		Labels: map[string]string{
			"io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": pod.Namespace,
			"io.kubernetes.pod.uid": string(pod.UID), "io.kubernetes.container.name": c.Name,
		},
		Linux: &criapi.LinuxContainerConfig{SecurityContext: securityContext(pod, c)},
	}
	for _, e := range c.Env {
		cfg.Envs = append(cfg.Envs, envVar(e.Name, e.Value))
	}
	for _, m := range c.VolumeMounts {
		host, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("container %s mounts volume %s, which the pod does not have", c.Name, m.Name)
		}
		if m.SubPath != "" {
			host = filepath.Join(host, m.SubPath)
		}
		cfg.Mounts = append(cfg.Mounts, &criapi.Mount{ContainerPath: m.MountPath, HostPath: host, Readonly: m.ReadOnly})
	}
	return cfg, nil
}

func securityContext(pod *corev1.Pod, c *corev1.Container) *criapi.LinuxContainerSecurityContext {
	sc := &criapi.LinuxContainerSecurityContext{NamespaceOptions: namespaces(pod)}
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			sc.RunAsUser = &criapi.Int64Value{Value: *psc.RunAsUser}
		}
		if psc.RunAsGroup != nil {
			sc.RunAsGroup = &criapi.Int64Value{Value: *psc.RunAsGroup}
		}
		sc.SupplementalGroups = psc.SupplementalGroups
	}
	csc := c.SecurityContext
	if csc == nil {
		return sc
	}
	if csc.RunAsUser != nil {
		sc.RunAsUser = &criapi.Int64Value{Value: *csc.RunAsUser}
	}
	if csc.RunAsGroup != nil {
		sc.RunAsGroup = &criapi.Int64Value{Value: *csc.RunAsGroup}
	}
	if csc.ReadOnlyRootFilesystem != nil {
		sc.ReadonlyRootfs = *csc.ReadOnlyRootFilesystem
	}
	if csc.AllowPrivilegeEscalation != nil {
		sc.NoNewPrivs = !*csc.AllowPrivilegeEscalation
	}
	if csc.Capabilities != nil {
		sc.Capabilities = &criapi.Capability{}
		for _, cap := range csc.Capabilities.Add {
			sc.Capabilities.AddCapabilities = append(sc.Capabilities.AddCapabilities, string(cap))
		}
		for _, cap := range csc.Capabilities.Drop {
			sc.Capabilities.DropCapabilities = append(sc.Capabilities.DropCapabilities, string(cap))
		}
	}
	return sc
}

// startContainer creates and starts one container in the sandbox; its id.
func (r *criClients) startContainer(ctx context.Context, sandboxID string, sandbox *criapi.PodSandboxConfig, cfg *criapi.ContainerConfig) (string, error) {
	if _, err := r.images.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: cfg.Image}); err != nil {
		return "", fmt.Errorf("image %s: %w", cfg.Image.Image, err)
	}
	created, err := r.runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
		PodSandboxId: sandboxID, Config: cfg, SandboxConfig: sandbox,
	})
	if err != nil {
		return "", fmt.Errorf("create container %s: %w", cfg.Metadata.Name, err)
	}
	if _, err := r.runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		return created.ContainerId, fmt.Errorf("start container %s: %w", cfg.Metadata.Name, err)
	}
	return created.ContainerId, nil
}

func (r *criClients) containerStatus(ctx context.Context, id string) (*criapi.ContainerStatus, error) {
	resp, err := r.runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

// stopContainer: the runtime sends the image's stop signal (SIGTERM by default), then SIGKILL
// once grace has passed.
func (r *criClients) stopContainer(ctx context.Context, id string, grace time.Duration) error {
	_, err := r.runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: int64(grace.Seconds())})
	return err
}

func (r *criClients) removeSandbox(ctx context.Context, id string) error {
	if _, err := r.runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return err
	}
	_, err := r.runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id})
	return err
}
