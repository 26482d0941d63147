package main

// The library's provider: pods kept by namespace/name, each run by a goroutine of its own
// (pod.go), their status built from what the runtime last said (status.go) and sent to the
// library on each change and every --status-interval, whole, as azure-aci's tracker does.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

type provider struct {
	o       options
	cri     *criClients
	client  kubernetes.Interface
	volumes volumeSource
	quota   *execQuota
	// informer: the library's pods, as the apiserver last had them.
	informer corev1listers.PodLister

	mu     sync.Mutex
	pods   map[string]*podRun
	notify func(*corev1.Pod)
}

func newPodProvider(o options, cri *criClients, client kubernetes.Interface, cfg nodeutil.ProviderConfig) *provider {
	p := &provider{
		o: o, cri: cri, client: client,
		volumes:  volumeSource{secrets: cfg.Secrets, configMaps: cfg.ConfigMaps},
		informer: cfg.Pods,
		pods:     map[string]*podRun{},
		notify:   func(*corev1.Pod) {},
	}
	if o.execQuota > 0 {
		p.quota = &execQuota{perMinute: o.execQuota}
	}
	return p
}

func key(namespace, name string) string { return namespace + "/" + name }

// CreatePod refuses what the node's rules refuse and makes the volumes at once (so a refusal
// is the library's ProviderFailed with its reason), then runs the pod in the background.
func (p *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	if p.o.aci {
		if err := aciRules(pod); err != nil {
			return err
		}
	}
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	_, known := p.pods[k]
	p.mu.Unlock()
	if known {
		return nil
	}
	dir := filepath.Join(p.o.root, "pods", string(pod.UID))
	volumes, err := p.volumes.make(pod, filepath.Join(dir, "volumes"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return errdefs.AsInvalidInput(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &podRun{
		pod: pod.DeepCopy(), meta: *pod.ObjectMeta.DeepCopy(), dir: dir, volumes: volumes,
		start:  time.Now().Truncate(time.Second),
		cancel: cancel, done: make(chan struct{}),
		init:       make([]*containerRun, len(pod.Spec.InitContainers)),
		containers: make([]*containerRun, len(pod.Spec.Containers)),
	}
	for i := range r.init {
		r.init[i] = &containerRun{}
	}
	for i := range r.containers {
		r.containers[i] = &containerRun{}
	}
	p.mu.Lock()
	p.pods[k] = r
	p.mu.Unlock()
	go p.run(ctx, r)
	return nil
}

// UpdatePod keeps the pod's new metadata; a running pod's spec does not change.
func (p *provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.pods[key(pod.Namespace, pod.Name)]; ok {
		r.meta = *pod.ObjectMeta.DeepCopy()
	}
	return nil
}

// DeletePod stops the pod in the background: each container with the pod's grace period,
// then the sandbox; the terminal status then goes to the library, which deletes the pod.
func (p *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	r, ok := p.pods[key(pod.Namespace, pod.Name)]
	if !ok {
		p.mu.Unlock()
		return errdefs.NotFoundf("pod %s/%s is not known", pod.Namespace, pod.Name)
	}
	if r.deleting {
		p.mu.Unlock()
		return nil
	}
	r.deleting = true
	r.meta = *pod.ObjectMeta.DeepCopy()
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.DeletionGracePeriodSeconds != nil {
		grace = *pod.DeletionGracePeriodSeconds
	}
	p.mu.Unlock()
	go p.stop(r, time.Duration(grace)*time.Second)
	return nil
}

func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known", namespace, name)
	}
	return p.podWithStatus(r), nil
}

func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(p.pods))
	for _, r := range p.pods {
		pods = append(pods, p.podWithStatus(r))
	}
	return pods, nil
}

// NotifyPods: the library's callback for status changes (so the library does not poll).
func (p *provider) NotifyPods(_ context.Context, notify func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = notify
}

// changed sends r's status to the library now.
func (p *provider) changed(r *podRun) {
	p.mu.Lock()
	pod, notify := p.podWithStatus(r), p.notify
	p.mu.Unlock()
	notify(pod)
}

// track sends every pod's status, built anew, every --status-interval, as azure-aci's
// podsTracker does (podsTracker.go:59-121): the pod as the informer has it, its status
// replaced whole, whether anything changed or not; pods that are terminal or being deleted
// are left alone. The library writes it when it differs from the last it was sent.
func (p *provider) track(ctx context.Context) {
	ticker := time.NewTicker(p.o.statusInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		p.mu.Lock()
		pods := make([]*corev1.Pod, 0, len(p.pods))
		for _, r := range p.pods {
			if r.deleting {
				continue
			}
			pod := p.podWithStatus(r)
			if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			if current, err := p.informer.Pods(pod.Namespace).Get(pod.Name); err == nil && current.UID == pod.UID {
				status := pod.Status
				pod = current.DeepCopy()
				pod.Status = status
			}
			pods = append(pods, pod)
		}
		notify := p.notify
		p.mu.Unlock()
		for _, pod := range pods {
			notify(pod)
		}
	}
}

// podWithStatus: the pod as the library last gave it, with the status this provider builds.
// Called with p.mu held.
func (p *provider) podWithStatus(r *podRun) *corev1.Pod {
	pod := r.pod.DeepCopy()
	pod.ObjectMeta = *r.meta.DeepCopy()
	pod.Status = p.status(r)
	return pod
}

func (p *provider) logf(r *podRun, format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "vk-cri: pod %s/%s: %s\n", r.pod.Namespace, r.pod.Name, fmt.Sprintf(format, args...))
}
