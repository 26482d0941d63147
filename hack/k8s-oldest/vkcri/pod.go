package main

// One pod's life on the runtime: its sandbox, its init containers one after the other (each to
// completion, as azure-aci runs them: no native sidecars), then its containers, watched and
// restarted by the pod's restartPolicy; stopped with the grace period on deletion.

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podRun is what the provider knows of a pod; its fields are guarded by provider.mu but for
// pod, the pod as it was created, which nothing changes (the pod's goroutine reads it freely).
type podRun struct {
	pod *corev1.Pod
	// meta: the pod's metadata as the library last gave it (UpdatePod, DeletePod).
	meta      metav1.ObjectMeta
	dir       string
	volumes   map[string]string
	start     time.Time
	sandboxID string
	sandbox   *criapi.PodSandboxConfig
	ip        string
	// init and containers follow the spec's order.
	init, containers []*containerRun
	initDone         bool
	// failure: why the pod cannot run (its phase is then Failed).
	failure  string
	deleting bool
	// gone: every container and the sandbox stopped (after deletion).
	gone   bool
	cancel context.CancelFunc
	done   chan struct{}
}

// containerRun is one container of the spec across its restarts.
type containerRun struct {
	id       string
	attempt  uint32
	restarts int32
	// status: the runtime's last answer for the current container.
	status *criapi.ContainerStatus
	// last: the previous container's end, as the kubelet's lastState.
	last *corev1.ContainerStateTerminated
	// waiting: why no container runs (an error creating it, or a back-off).
	waiting string
}

const pollEvery = 500 * time.Millisecond

func (p *provider) run(ctx context.Context, r *podRun) {
	defer close(r.done)
	if err := p.startSandbox(ctx, r); err != nil {
		p.fail(r, "sandbox: "+err.Error())
		return
	}
	for i := range r.pod.Spec.InitContainers {
		if !p.runInit(ctx, r, i) {
			return
		}
	}
	p.mu.Lock()
	r.initDone = true
	p.mu.Unlock()
	for i := range r.pod.Spec.Containers {
		p.startOne(ctx, r, &r.pod.Spec.Containers[i], r.containers[i])
	}
	p.changed(r)
	p.supervise(ctx, r)
}

func (p *provider) startSandbox(ctx context.Context, r *podRun) error {
	logDir := filepath.Join(r.dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	cgroup := ""
	if p.o.cgroupParent != "" {
		cgroup = filepath.Join(p.o.cgroupParent, "pod"+string(r.pod.UID))
	}
	config := sandboxConfig(r.pod, logDir, cgroup)
	resp, err := p.cri.runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: config})
	if err != nil {
		return err
	}
	status, err := p.cri.runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId})
	if err != nil {
		return err
	}
	p.mu.Lock()
	r.sandboxID, r.sandbox = resp.PodSandboxId, config
	if status.Status.GetNetwork() != nil {
		r.ip = status.Status.Network.Ip
	}
	p.mu.Unlock()
	p.logf(r, "sandbox %s at %s", resp.PodSandboxId[:12], r.ip)
	return nil
}

// runInit runs init container i to completion, again after a failure unless the pod's
// restartPolicy is Never (then the pod fails). False when the pod is not to go on.
func (p *provider) runInit(ctx context.Context, r *podRun, i int) bool {
	spec, c := &r.pod.Spec.InitContainers[i], r.init[i]
	backoff := time.Second
	for {
		p.startOne(ctx, r, spec, c)
		p.changed(r)
		for {
			if !sleep(ctx, pollEvery) {
				return false
			}
			exited, code := p.refresh(ctx, r, c)
			if !exited {
				continue
			}
			p.changed(r)
			if code == 0 {
				return true
			}
			if r.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
				p.fail(r, "init container "+spec.Name+" failed")
				return false
			}
			break
		}
		if !sleep(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// supervise watches the containers and restarts those the restartPolicy restarts.
func (p *provider) supervise(ctx context.Context, r *podRun) {
	backoff := make([]time.Duration, len(r.containers))
	for {
		if !sleep(ctx, pollEvery) {
			return
		}
		any := false
		for i, c := range r.containers {
			spec := &r.pod.Spec.Containers[i]
			p.mu.Lock()
			notCreated := c.id == ""
			p.mu.Unlock()
			if notCreated { // its creation failed: again, after a back-off
				backoff[i] = min(max(2*backoff[i], time.Second), 10*time.Second)
				if !sleep(ctx, backoff[i]) {
					return
				}
				p.startOne(ctx, r, spec, c)
				any = true
				continue
			}
			exited, code := p.refresh(ctx, r, c)
			if !exited {
				continue
			}
			any = true
			restart := r.pod.Spec.RestartPolicy == corev1.RestartPolicyAlways ||
				(r.pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure && code != 0)
			if !restart {
				continue
			}
			backoff[i] = min(max(2*backoff[i], time.Second), 10*time.Second)
			p.changed(r)
			if !sleep(ctx, backoff[i]) {
				return
			}
			p.startOne(ctx, r, spec, c)
		}
		if any {
			p.changed(r)
		}
	}
}

// startOne starts the container's next attempt (the previous one's end kept as lastState).
func (p *provider) startOne(ctx context.Context, r *podRun, spec *corev1.Container, c *containerRun) {
	p.mu.Lock()
	if c.status != nil && c.status.State == criapi.ContainerState_CONTAINER_EXITED {
		c.last = terminated(c.status)
		c.restarts++
		c.attempt++
	}
	attempt, sandboxID, sandbox := c.attempt, r.sandboxID, r.sandbox
	p.mu.Unlock()
	cfg, err := containerConfig(r.pod, spec, attempt, r.volumes)
	id := ""
	if err == nil {
		id, err = p.cri.startContainer(ctx, sandboxID, sandbox, cfg)
	}
	var status *criapi.ContainerStatus
	if err == nil {
		status, err = p.cri.containerStatus(ctx, id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c.id, c.status, c.waiting = id, status, ""
	if err != nil {
		c.waiting = err.Error()
		p.logf(r, "container %s: %v", spec.Name, err)
	}
}

// refresh asks the runtime for c's state; whether it has exited since it was last seen
// running, and its exit code.
func (p *provider) refresh(ctx context.Context, r *podRun, c *containerRun) (bool, int32) {
	p.mu.Lock()
	id, before := c.id, c.status
	p.mu.Unlock()
	if id == "" {
		return false, 0
	}
	status, err := p.cri.containerStatus(ctx, id)
	if err != nil {
		return false, 0
	}
	p.mu.Lock()
	c.status = status
	p.mu.Unlock()
	wasRunning := before == nil || before.State != criapi.ContainerState_CONTAINER_EXITED
	return wasRunning && status.State == criapi.ContainerState_CONTAINER_EXITED, status.ExitCode
}

func (p *provider) fail(r *podRun, why string) {
	p.mu.Lock()
	r.failure = why
	p.mu.Unlock()
	p.logf(r, "failed: %s", why)
	p.changed(r)
}

// stop ends the pod: its goroutine first, then every container at once with the grace period
// (SIGTERM, SIGKILL after it), then the sandbox and the volumes; the terminal status goes to
// the library, and the pod is forgotten.
func (p *provider) stop(r *podRun, grace time.Duration) {
	r.cancel()
	<-r.done
	ctx, cancel := context.WithTimeout(context.Background(), grace+time.Minute)
	defer cancel()
	p.logf(r, "stopping with a grace period of %s", grace)
	var wg sync.WaitGroup
	for _, c := range append(append([]*containerRun{}, r.init...), r.containers...) {
		p.mu.Lock()
		id := c.id
		p.mu.Unlock()
		if id == "" {
			continue
		}
		wg.Add(1)
		go func(c *containerRun, id string) {
			defer wg.Done()
			if err := p.cri.stopContainer(ctx, id, grace); err != nil {
				p.logf(r, "stop container %s: %v", id[:12], err)
			}
			p.refresh(ctx, r, c)
		}(c, id)
	}
	wg.Wait()
	if r.sandboxID != "" {
		if err := p.cri.removeSandbox(ctx, r.sandboxID); err != nil {
			p.logf(r, "remove sandbox: %v", err)
		}
	}
	_ = os.RemoveAll(r.dir)
	p.mu.Lock()
	r.gone = true
	p.mu.Unlock()
	p.changed(r)
	p.mu.Lock()
	delete(p.pods, key(r.pod.Namespace, r.pod.Name))
	p.mu.Unlock()
	p.logf(r, "stopped")
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
