package main

// azure-aci v1.6.4's pod rules, as its provider applies them in CreatePod before it asks Azure
// for a container group (github.com/virtual-kubelet/azure-aci, tag v1.6.4). Each rule cites the
// file and line it restates; the messages are the provider's own. The provider cannot be
// imported here: it needs Azure clients to construct, and its package imports
// virtual-kubelet's node/api/statsv1alpha1, which later library versions removed.
//
// Not restated, because nothing podprobe injects meets them: GPU settings, the CSI driver's
// name (only file.csi.azure.com), probe handlers' named ports, Windows.

import (
	"fmt"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
)

func aciRules(pod *corev1.Pod) error {
	if err := aciVolumes(pod); err != nil {
		return err
	}
	for i := range pod.Spec.InitContainers {
		if err := aciInitContainer(&pod.Spec.InitContainers[i]); err != nil {
			return err
		}
	}
	for i := range pod.Spec.Containers {
		if err := aciContainer(&pod.Spec.Containers[i]); err != nil {
			return err
		}
	}
	return nil
}

// pkg/provider/aci_volumes.go:60-288 getVolumes: csi, azureFile, emptyDir, gitRepo, secret,
// configMap and projected volumes; anything else fails the pod (l.284).
func aciVolumes(pod *corev1.Pod) error {
	for _, v := range pod.Spec.Volumes {
		s := v.VolumeSource
		if s.CSI != nil || s.AzureFile != nil || s.EmptyDir != nil || s.GitRepo != nil ||
			s.Secret != nil || s.ConfigMap != nil || s.Projected != nil {
			continue
		}
		return fmt.Errorf("pod %s requires volume %s which is of an unsupported type", pod.Name, v.Name)
	}
	return nil
}

// pkg/provider/aci.go:1045-1050 verifyContainer.
func aciVerifyContainer(c *corev1.Container) error {
	if len(c.Command) == 0 && len(c.Args) > 0 {
		return errdefs.InvalidInput("ACI does not support providing args without specifying the command. Please supply both command and args to the pod spec.")
	}
	return nil
}

// pkg/provider/aci.go:1093-1144 getInitContainers (the init-container feature flag is on by
// default, pkg/featureflag/feature_flag.go). restartPolicy is never read: a native sidecar is
// an ordinary init container there, run to completion before the group's containers.
func aciInitContainer(c *corev1.Container) error {
	if err := aciVerifyContainer(c); err != nil {
		return err
	}
	switch {
	case c.Ports != nil:
		return errdefs.InvalidInput("azure container instances initContainers do not support ports")
	case c.Resources.Requests != nil || c.Resources.Limits != nil:
		return errdefs.InvalidInput("azure container instances initContainers do not support resources")
	case c.LivenessProbe != nil || c.ReadinessProbe != nil || c.StartupProbe != nil:
		return errdefs.InvalidInput("azure container instances initContainers do not support probes")
	case c.Lifecycle != nil:
		return errdefs.InvalidInput("azure container instances initContainers do not support lifecycle hooks")
	}
	return nil
}

// pkg/provider/aci.go:1146-1281 getContainers and l.1326-1332 getProbe.
func aciContainer(c *corev1.Container) error {
	if err := aciVerifyContainer(c); err != nil {
		return err
	}
	if c.Lifecycle != nil && (c.Lifecycle.PostStart != nil || c.Lifecycle.PreStop != nil) {
		return errdefs.InvalidInput("ACI does not support lifecycle hooks")
	}
	if c.StartupProbe != nil {
		return errdefs.InvalidInput("ACI does not support startup probes")
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p != nil && (p.Exec == nil) == (p.HTTPGet == nil) {
			return errdefs.InvalidInput("probe must specify one of \"exec\" and \"httpGet\"")
		}
	}
	return nil
}
