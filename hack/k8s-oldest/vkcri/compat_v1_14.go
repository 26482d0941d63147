//go:build vk_v1_14

package main

// See compat_v1_11.go.

import (
	"context"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

func envVar(name, value string) *criapi.KeyValue {
	return &criapi.KeyValue{Key: name, Value: []byte(value)}
}

func (p *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errNotServed
}
