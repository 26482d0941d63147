//go:build !vk_v1_14

package main

// What differs between the two trees this source builds on: this file on the library v1.11.0
// and cri-api v0.30 (hack/k8s-oldest), compat_v1_14.go on v1.14.1 and cri-api v0.37 (hack/k8s,
// -tags vk_v1_14). The library moved its stats types to k8s.io/kubelet; CRI's env values
// became bytes.

import (
	"context"

	"github.com/virtual-kubelet/virtual-kubelet/node/api/statsv1alpha1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func envVar(name, value string) *criapi.KeyValue { return &criapi.KeyValue{Key: name, Value: value} }

func (p *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errNotServed
}
