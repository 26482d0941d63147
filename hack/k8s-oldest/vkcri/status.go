package main

// The status this provider reports, built from its own state only, as azure-aci builds it from
// the container group (pkg/provider/containergroup_to_pod.go): the phase and the containers'
// states from the runtime; the conditions Ready, Initialized and PodScheduled while the pod
// runs or has succeeded, none otherwise ([Ready] alone with --ready-only, as interLink); no
// condition the pod had from anyone else. The library writes it over the pod's whole status.

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// status builds r's status; called with provider.mu held.
func (p *provider) status(r *podRun) corev1.PodStatus {
	started := metav1.NewTime(r.start)
	s := corev1.PodStatus{
		Phase:     p.phase(r),
		HostIP:    p.o.nodeIP,
		StartTime: &started,
	}
	if r.ip != "" {
		s.PodIP = r.ip
		s.PodIPs = []corev1.PodIP{{IP: r.ip}}
	}
	if r.failure != "" {
		s.Reason, s.Message = "ProviderFailed", r.failure
	}
	for i, c := range r.pod.Spec.InitContainers {
		s.InitContainerStatuses = append(s.InitContainerStatuses, containerStatus(&c, r.init[i], r.gone))
	}
	ready := r.initDone
	for i, c := range r.pod.Spec.Containers {
		cs := containerStatus(&c, r.containers[i], r.gone)
		ready = ready && cs.Ready
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	if s.Phase != corev1.PodRunning && s.Phase != corev1.PodSucceeded {
		return s
	}
	condition := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		status := corev1.ConditionTrue
		if !ok {
			status = corev1.ConditionFalse
		}
		return corev1.PodCondition{Type: t, Status: status, LastTransitionTime: started}
	}
	s.Conditions = []corev1.PodCondition{condition(corev1.PodReady, ready)}
	if !p.o.readyOnly {
		s.Conditions = append(s.Conditions,
			condition(corev1.PodInitialized, true), condition(corev1.PodScheduled, true))
	}
	return s
}

func (p *provider) phase(r *podRun) corev1.PodPhase {
	if r.failure != "" {
		return corev1.PodFailed
	}
	if !r.initDone && !r.gone {
		return corev1.PodPending
	}
	exited, failed := 0, 0
	for _, c := range r.containers {
		if c.status == nil {
			if r.gone {
				exited++
				continue
			}
			return corev1.PodPending
		}
		if c.status.State == criapi.ContainerState_CONTAINER_EXITED {
			exited++
			if c.status.ExitCode != 0 {
				failed++
			}
		}
	}
	done := exited == len(r.containers) && (r.gone || r.pod.Spec.RestartPolicy != corev1.RestartPolicyAlways)
	switch {
	case done && failed > 0:
		return corev1.PodFailed
	case done:
		return corev1.PodSucceeded
	default:
		return corev1.PodRunning
	}
}

func containerStatus(spec *corev1.Container, c *containerRun, gone bool) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{Name: spec.Name, Image: spec.Image, RestartCount: c.restarts}
	if c.last != nil {
		cs.LastTerminationState.Terminated = c.last
	}
	switch {
	case c.status == nil && gone:
		cs.State.Terminated = &corev1.ContainerStateTerminated{Reason: "PodDeleted", ExitCode: 0}
	case c.status == nil && c.waiting != "":
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: c.waiting}
	case c.status == nil:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	default:
		cs.ContainerID = "containerd://" + c.status.Id
		cs.ImageID = c.status.ImageRef
		switch c.status.State {
		case criapi.ContainerState_CONTAINER_RUNNING:
			cs.Ready = true
			started := true
			cs.Started = &started
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: nanos(c.status.StartedAt)}
		case criapi.ContainerState_CONTAINER_EXITED:
			cs.State.Terminated = terminated(c.status)
		default:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
	}
	return cs
}

func terminated(s *criapi.ContainerStatus) *corev1.ContainerStateTerminated {
	reason := s.Reason
	if reason == "" {
		reason = "Completed"
		if s.ExitCode != 0 {
			reason = "Error"
		}
	}
	return &corev1.ContainerStateTerminated{
		ExitCode: s.ExitCode, Reason: reason, Message: s.Message, ContainerID: "containerd://" + s.Id,
		StartedAt: nanos(s.StartedAt), FinishedAt: nanos(s.FinishedAt),
	}
}

func nanos(n int64) metav1.Time {
	if n == 0 {
		return metav1.Time{}
	}
	return metav1.NewTime(time.Unix(0, n).Truncate(time.Second))
}
