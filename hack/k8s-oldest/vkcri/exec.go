package main

// The kubelet API the library serves for this provider: exec through the runtime's streaming
// server (so `pods/exec` and `kubectl exec` reach the container), logs from the runtime's log
// files. With --aci, exec as azure-aci does it; with --exec-quota, a limit on calls a minute.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// execQuota allows perMinute calls in any minute (a sliding window), as a provider's API
// quota does (Alibaba ECI: 500 exec calls a minute per account).
type execQuota struct {
	perMinute int
	mu        sync.Mutex
	calls     []time.Time
}

func (q *execQuota) take(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.calls[:0]
	for _, t := range q.calls {
		if now.Sub(t) < time.Minute {
			kept = append(kept, t)
		}
	}
	q.calls = kept
	if len(q.calls) >= q.perMinute {
		return false
	}
	q.calls = append(q.calls, now)
	return true
}

// runningContainer: the id of the named container's current attempt while it runs.
func (p *provider) runningContainer(namespace, name, container string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pods[key(namespace, name)]
	if !ok {
		return "", errdefs.NotFoundf("pod %s/%s is not known", namespace, name)
	}
	for i, c := range r.pod.Spec.Containers {
		if c.Name == container {
			run := r.containers[i]
			if run.status == nil || run.status.State != criapi.ContainerState_CONTAINER_RUNNING {
				return "", errdefs.InvalidInputf("container %s of pod %s/%s is not running", container, namespace, name)
			}
			return run.id, nil
		}
	}
	return "", errdefs.NotFoundf("pod %s/%s has no container %s", namespace, name, container)
}

func (p *provider) RunInContainer(ctx context.Context, namespace, name, container string, cmd []string, attach api.AttachIO) error {
	if p.quota != nil && !p.quota.take(time.Now()) {
		return fmt.Errorf("exec quota exceeded: %d calls a minute", p.quota.perMinute)
	}
	id, err := p.runningContainer(namespace, name, container)
	if err != nil {
		return err
	}
	if p.o.aci {
		cmd = aciCommand(cmd)
	}
	tty := attach.TTY()
	resp, err := p.cri.runtime.Exec(ctx, &criapi.ExecRequest{
		ContainerId: id, Cmd: cmd, Tty: tty,
		Stdin: attach.Stdin() != nil, Stdout: attach.Stdout() != nil, Stderr: attach.Stderr() != nil && !tty && !p.o.aci,
	})
	if err != nil {
		return err
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		return err
	}
	executor, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	if err != nil {
		return err
	}
	opts := remotecommand.StreamOptions{Tty: tty}
	if in := attach.Stdin(); in != nil {
		opts.Stdin = in
	}
	if out := attach.Stdout(); out != nil {
		opts.Stdout = out
	}
	if errOut := attach.Stderr(); errOut != nil && !tty && !p.o.aci {
		opts.Stderr = errOut
	}
	if tty {
		opts.TerminalSizeQueue = sizeQueue(attach.Resize())
	}
	err = executor.StreamWithContext(ctx, opts)
	if p.o.aci {
		// azure-aci copies ACI's exec WebSocket to stdout until it closes and returns nothing
		// of how the command ended (aci.go:667-689): every exec succeeds for the caller.
		return nil
	}
	return err
}

// aciCommand: azure-aci joins the arguments into ACI's one command string (aci.go:609-616),
// which ACI starts as a single process, without arguments (Azure's documentation of
// `az container exec`: "you cannot pass command arguments").
func aciCommand(cmd []string) []string {
	return []string{strings.Join(cmd, " ")}
}

type resizes <-chan api.TermSize

func sizeQueue(ch <-chan api.TermSize) remotecommand.TerminalSizeQueue { return resizes(ch) }

func (r resizes) Next() *remotecommand.TerminalSize {
	size, ok := <-r
	if !ok {
		return nil
	}
	return &remotecommand.TerminalSize{Width: size.Width, Height: size.Height}
}

// GetContainerLogs reads the container's CRI log file (its previous attempt's with
// `previous`), each line's message without the runtime's timestamp and stream; `tail` and
// `limitBytes` as the kubelet applies them. Follow is not served: the log so far is returned.
func (p *provider) GetContainerLogs(_ context.Context, namespace, name, container string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	p.mu.Lock()
	r, ok := p.pods[key(namespace, name)]
	var path string
	if ok {
		for i, c := range append(append([]*containerRun{}, r.init...), r.containers...) {
			spec := podContainerName(r, i)
			if spec != container {
				continue
			}
			attempt := c.attempt
			if opts.Previous {
				if attempt == 0 {
					p.mu.Unlock()
					return nil, errdefs.InvalidInputf("container %s has no previous attempt", container)
				}
				attempt--
			}
			path = filepath.Join(r.dir, "logs", container, fmt.Sprintf("%d.log", attempt))
		}
	}
	p.mu.Unlock()
	if path == "" {
		return nil, errdefs.NotFoundf("pod %s/%s has no container %s", namespace, name, container)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var lines []string
	scanner := bufio.NewScanner(bytes.NewReader(raw))
	scanner.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for scanner.Scan() {
		// <RFC3339Nano> <stream> <P|F> <message>
		fields := strings.SplitN(scanner.Text(), " ", 4)
		if len(fields) < 4 {
			continue
		}
		message := fields[3]
		if fields[2] == "F" {
			message += "\n"
		}
		lines = append(lines, message)
	}
	if opts.Tail > 0 && opts.Tail < len(lines) {
		lines = lines[len(lines)-opts.Tail:]
	}
	out := strings.Join(lines, "")
	if opts.LimitBytes > 0 && opts.LimitBytes < len(out) {
		out = out[:opts.LimitBytes]
	}
	return io.NopCloser(strings.NewReader(out)), nil
}

// podContainerName: the name of the i-th of the pod's init containers then containers.
func podContainerName(r *podRun, i int) string {
	if i < len(r.pod.Spec.InitContainers) {
		return r.pod.Spec.InitContainers[i].Name
	}
	return r.pod.Spec.Containers[i-len(r.pod.Spec.InitContainers)].Name
}

var errNotServed = errdefs.InvalidInput("vk-cri does not serve this")

func (p *provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errNotServed
}

func (p *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errNotServed
}

func (p *provider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errNotServed
}
