// Command vk-replacer is the smallest virtual-kubelet provider that does not notify: it runs
// no containers and only answers GetPodStatus, so the library (node/sync.go) copies the
// provider's status over every pod of its node every 5 s with UpdateStatus, the whole .status
// replaced. Its status holds Ready, Initialized and PodScheduled only, as azure-aci's
// provider reports them: any other condition on the pod (podprobe's) is dropped by the copy.
//
// Built from the virtual-kubelet library pinned in go.mod, for podprobe's measurements of
// what such a provider does to its conditions (issue 24). It is not a provider anyone runs.
//
// With --aci-rules it also refuses, in CreatePod, what azure-aci v1.6.4's provider refuses
// (aci_rules.go); the library then marks the pod ProviderFailed with the provider's message.
//
// With --ready-only its pods' conditions are [Ready] alone, as interLink 0.6.2 sets them once a
// pod runs (interlink-hq/interLink execute.go:1620, checkPodsStatus): no Initialized.
//
//	KUBECONFIG=... vk-replacer --nodename NAME [--pod-ip IP] [--aci-rules] [--ready-only]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/log"
	logruslogger "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/api/statsv1alpha1"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func main() {
	nodeName := flag.String("nodename", "vk-replacer", "the node's name")
	podIP := flag.String("pod-ip", "10.0.0.1", "the address every pod's status reports")
	aci := flag.Bool("aci-rules", false, "refuse the pods azure-aci v1.6.4 refuses")
	readyOnly := flag.Bool("ready-only", false, "report the condition Ready alone, as interLink does")
	flag.Parse()
	if err := run(*nodeName, *podIP, *aci, *readyOnly); err != nil {
		fmt.Fprintln(os.Stderr, "vk-replacer:", err)
		os.Exit(1)
	}
}

func run(nodeName, podIP string, aci, readyOnly bool) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	// The library's own log (sync errors, refused pods) to stderr, as the agents built on it
	// keep it; the library logs nothing by default.
	log.L = logruslogger.FromLogrus(logrus.NewEntry(logrus.StandardLogger()))
	client, err := nodeutil.ClientsetFromEnv(os.Getenv("KUBECONFIG"))
	if err != nil {
		return err
	}
	p := &replacer{podIP: podIP, aci: aci, readyOnly: readyOnly, pods: map[string]*corev1.Pod{}}
	newProvider := func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("16"),
			corev1.ResourceMemory: resource.MustParse("64Gi"),
			corev1.ResourcePods:   resource.MustParse("1000"),
		}
		cfg.Node.Status.Capacity = capacity
		cfg.Node.Status.Allocatable = capacity
		cfg.Node.Spec.Taints = append(cfg.Node.Spec.Taints, corev1.Taint{
			Key: "virtual-kubelet.io/provider", Value: "replacer", Effect: corev1.TaintEffectNoSchedule,
		})
		return p, nil, nil
	}
	n, err := nodeutil.NewNode(nodeName, newProvider, nodeutil.WithClient(client))
	if err != nil {
		return err
	}
	go n.Run(ctx) //nolint:errcheck
	if err := n.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "vk-replacer: node", nodeName, "ready")
	select {
	case <-ctx.Done():
	case <-n.Done():
		return n.Err()
	}
	return nil
}

// replacer keeps the pods it was given; their status is made up on each GetPodStatus.
type replacer struct {
	podIP     string
	aci       bool
	readyOnly bool
	mu        sync.Mutex
	pods      map[string]*corev1.Pod
}

func key(namespace, name string) string { return namespace + "/" + name }

func (r *replacer) CreatePod(_ context.Context, pod *corev1.Pod) error {
	if r.aci {
		if err := aciRules(pod); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	stored := pod.DeepCopy()
	stored.Status.StartTime = &metav1.Time{Time: time.Now().Truncate(time.Second)}
	r.pods[key(pod.Namespace, pod.Name)] = stored
	return nil
}

func (r *replacer) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := key(pod.Namespace, pod.Name)
	if old, ok := r.pods[k]; ok {
		updated := pod.DeepCopy()
		updated.Status.StartTime = old.Status.StartTime
		r.pods[k] = updated
	}
	return nil
}

func (r *replacer) DeletePod(_ context.Context, pod *corev1.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, key(pod.Namespace, pod.Name))
	return nil
}

func (r *replacer) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pod, ok := r.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known", namespace, name)
	}
	return pod.DeepCopy(), nil
}

// GetPodStatus is the whole status the library writes every 5 s: running, with the three
// conditions azure-aci's provider reports, and nothing else.
func (r *replacer) GetPodStatus(_ context.Context, namespace, name string) (*corev1.PodStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pod, ok := r.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known", namespace, name)
	}
	started := *pod.Status.StartTime
	status := &corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    "127.0.0.1",
		PodIP:     r.podIP,
		PodIPs:    []corev1.PodIP{{IP: r.podIP}},
		StartTime: &started,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: started},
		},
	}
	if r.readyOnly {
		status.Conditions = status.Conditions[:1]
	}
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, corev1.ContainerStatus{
			Name:        c.Name,
			Image:       c.Image,
			Ready:       true,
			ContainerID: "replacer://" + c.Name,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		})
	}
	return status, nil
}

func (r *replacer) GetPods(_ context.Context) ([]*corev1.Pod, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(r.pods))
	for _, pod := range r.pods {
		pods = append(pods, pod.DeepCopy())
	}
	return pods, nil
}

// The kubelet API is not served (no TLS configuration is given, so the library starts no
// HTTP server): logs, exec, attach, stats and port-forward have no caller.
var errNoKubeletAPI = errdefs.InvalidInput("vk-replacer serves no kubelet API")

func (r *replacer) GetContainerLogs(context.Context, string, string, string, api.ContainerLogOpts) (io.ReadCloser, error) {
	return nil, errNoKubeletAPI
}

func (r *replacer) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errNoKubeletAPI
}

func (r *replacer) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errNoKubeletAPI
}

func (r *replacer) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errNoKubeletAPI
}

func (r *replacer) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errNoKubeletAPI
}

func (r *replacer) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errNoKubeletAPI
}
