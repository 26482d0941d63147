// Command vk-cri is a virtual-kubelet provider that runs its pods: each pod a CRI sandbox (its
// own network namespace, from the runtime's CNI) on a containerd it is given, its init
// containers in order, then its containers, restarted by the pod's restartPolicy, stopped with
// the pod's grace period (the runtime sends SIGTERM, then SIGKILL), exec and logs through CRI.
// It is how podprobe's tests meet a virtual node that runs the injected pod, with the
// behaviours of the providers users run selectable per node (see provider.go's flags):
//
//   - the status a provider builds from its own state, written whole by the library (as every
//     provider on the library does), the pod's other conditions dropped; renewed every
//     --status-interval (azure-aci's tracker: 5 s);
//   - --aci: azure-aci v1.6.4's pod rules (aci_rules.go, shared with vk-replacer), its volumes
//     (Secrets and ConfigMaps copied once from the informer at creation, a missing optional one
//     skipped; projected tokens from the account's legacy token Secret; no downward API) and
//     its exec (one command string, no exit status);
//   - --ready-only: the conditions [Ready] alone, as interLink reports them;
//   - --exec-quota N: at most N exec calls a minute, as Alibaba ECI documents 500.
//
// Built twice from this one source (hack/build-tools.sh): on the library v1.11.0 (azure-aci's)
// in hack/k8s-oldest, and on v1.14.1 in hack/k8s (a symlink to this directory).
//
//	KUBECONFIG=... vk-cri --nodename NAME --cri /run/containerd.sock --node-ip IP \
//	    --root DIR --cert C --key K --client-ca CA [--aci] [--ready-only] [--exec-quota N]
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/log"
	logruslogger "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// options are the node's behaviours, chosen per node.
type options struct {
	nodeName       string
	criSocket      string
	nodeIP         string
	port           int
	root           string
	cgroupParent   string
	cert, key, ca  string
	aci            bool
	readyOnly      bool
	execQuota      int
	statusInterval time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.nodeName, "nodename", "vk-cri", "the node's name")
	flag.StringVar(&o.criSocket, "cri", "", "containerd's CRI socket (a path)")
	flag.StringVar(&o.nodeIP, "node-ip", "", "the node's InternalIP: where the kubelet API listens and the apiserver dials it")
	flag.IntVar(&o.port, "port", 10250, "the kubelet API's port (exec, logs)")
	flag.StringVar(&o.root, "root", "", "the directory for the pods' volumes and logs")
	flag.StringVar(&o.cgroupParent, "cgroup-parent", "", "the cgroup under which each pod's cgroup is made (cgroupfs)")
	flag.StringVar(&o.cert, "cert", "", "the kubelet API's serving certificate (PEM)")
	flag.StringVar(&o.key, "key", "", "its key (PEM)")
	flag.StringVar(&o.ca, "client-ca", "", "the CA of client certificates (the apiserver's); callers are checked with TokenReview and SubjectAccessReview")
	flag.BoolVar(&o.aci, "aci", false, "azure-aci v1.6.4: its pod rules, volumes and exec (one command string, no exit status)")
	flag.BoolVar(&o.readyOnly, "ready-only", false, "report the condition Ready alone, as interLink does")
	flag.IntVar(&o.execQuota, "exec-quota", 0, "exec calls allowed a minute (Alibaba ECI: 500); 0: no limit")
	flag.DurationVar(&o.statusInterval, "status-interval", 5*time.Second, "how often every pod's status is built anew and sent to the library (azure-aci's tracker: 5 s)")
	flag.Parse()
	for name, value := range map[string]string{"cri": o.criSocket, "node-ip": o.nodeIP, "root": o.root, "cert": o.cert, "key": o.key, "client-ca": o.ca} {
		if value == "" {
			fmt.Fprintf(os.Stderr, "vk-cri: --%s is required\n", name)
			os.Exit(2)
		}
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "vk-cri:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	log.L = logruslogger.FromLogrus(logrus.NewEntry(logrus.StandardLogger()))
	client, err := nodeutil.ClientsetFromEnv(os.Getenv("KUBECONFIG"))
	if err != nil {
		return err
	}
	cri, err := dialCRI(ctx, o.criSocket)
	if err != nil {
		return err
	}
	var p *provider
	mux := http.NewServeMux()
	newProvider := func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		p = newPodProvider(o, cri, client, cfg)
		configureNode(o, cfg.Node)
		return p, nil, nil
	}
	n, err := nodeutil.NewNode(o.nodeName, newProvider,
		nodeutil.WithClient(client),
		func(cfg *nodeutil.NodeConfig) error {
			cfg.Handler = mux
			cfg.HTTPListenAddr = net.JoinHostPort(o.nodeIP, strconv.Itoa(o.port))
			cfg.NumWorkers = 4
			cfg.StreamIdleTimeout = 4 * time.Hour
			cfg.StreamCreationTimeout = 30 * time.Second
			return nil
		},
		// As the library's own agent with a client CA: callers of the kubelet API (the
		// apiserver's exec and logs) are authenticated and authorized by the apiserver.
		func(cfg *nodeutil.NodeConfig) error {
			auth, err := nodeutil.WebhookAuth(cfg.Client, o.nodeName, func(wc *nodeutil.WebhookAuthConfig) error {
				var err error
				wc.AuthnConfig.ClientCertificateCAContentProvider, err = dynamiccertificates.NewDynamicCAContentFromFile("client-ca", o.ca)
				return err
			})
			if err != nil {
				return err
			}
			cfg.Handler = api.InstrumentHandler(nodeutil.WithAuth(auth, cfg.Handler))
			return nil
		},
		nodeutil.WithTLSConfig(nodeutil.WithKeyPairFromPath(o.cert, o.key)),
		nodeutil.AttachProviderRoutes(mux),
	)
	if err != nil {
		return err
	}
	go n.Run(ctx) //nolint:errcheck
	if err := n.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	go p.track(ctx)
	fmt.Fprintf(os.Stderr, "vk-cri: node %s ready (aci=%t ready-only=%t exec-quota=%d status-interval=%s)\n",
		o.nodeName, o.aci, o.readyOnly, o.execQuota, o.statusInterval)
	select {
	case <-ctx.Done():
	case <-n.Done():
		return n.Err()
	}
	return nil
}

// configureNode registers the node as virtual nodes register: the library's type label and
// taint (which the chart's `podShape: auto`, kube-scheduler and kruise-manager read), the
// address the apiserver dials for exec and logs, a capacity of its own.
func configureNode(o options, n *corev1.Node) {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods:   resource.MustParse("1000"),
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["type"] = "virtual-kubelet"
	n.Labels["kubernetes.io/role"] = "agent"
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{
		Key: "virtual-kubelet.io/provider", Value: "vk-cri", Effect: corev1.TaintEffectNoSchedule,
	})
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: o.nodeIP},
		{Type: corev1.NodeHostName, Address: o.nodeName},
	}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(o.port)
	n.Status.NodeInfo.OperatingSystem = "linux"
	n.Status.NodeInfo.Architecture = runtime.GOARCH
	n.Status.NodeInfo.KubeletVersion = "vk-cri"
}
