package main

// The pod's volumes, as azure-aci v1.6.4 makes them (pkg/provider/aci_volumes.go getVolumes):
// emptyDir; secret and configMap copied once, at creation, from the library's informer (a
// missing one skipped unless the pod says `optional: false`, which refuses the pod); projected with its
// serviceAccountToken sources filled from the account's legacy token Secret (none since
// Kubernetes 1.24: then no token file) and its downwardAPI sources skipped; a downwardAPI
// volume, or any other kind, refused. Each is a directory under the pod's own, bound into
// the containers that mount it.

import (
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

type volumeSource struct {
	secrets    corev1listers.SecretLister
	configMaps corev1listers.ConfigMapLister
}

// make writes every volume of pod under dir; each volume's directory by name.
func (v volumeSource) make(pod *corev1.Pod, dir string) (map[string]string, error) {
	paths := map[string]string{}
	for _, vol := range pod.Spec.Volumes {
		path := filepath.Join(dir, vol.Name)
		if err := os.MkdirAll(path, 0o777); err != nil {
			return nil, err
		}
		// As the kubelet's emptyDir: writable by any user the containers run as.
		if err := os.Chmod(path, 0o777); err != nil {
			return nil, err
		}
		var err error
		switch {
		case vol.EmptyDir != nil:
		case vol.Secret != nil:
			err = v.secret(pod.Namespace, vol.Secret.SecretName, vol.Secret.Items, skipMissing(vol.Secret.Optional), path)
		case vol.ConfigMap != nil:
			err = v.configMap(pod.Namespace, vol.ConfigMap.Name, vol.ConfigMap.Items, skipMissing(vol.ConfigMap.Optional), path)
		case vol.Projected != nil:
			err = v.projected(pod, vol.Projected, path)
		default:
			err = fmt.Errorf("pod %s/%s requires volume %s which is of an unsupported type", pod.Namespace, pod.Name, vol.Name)
		}
		if err != nil {
			return nil, err
		}
		paths[vol.Name] = path
	}
	return paths, nil
}

// skipMissing: azure-aci skips a missing Secret or ConfigMap unless the pod says `optional:
// false` (aci_volumes.go:131-136, 156-161, 222, 251); a kubelet would wait for it instead.
func skipMissing(optional *bool) bool { return optional == nil || *optional }

func (v volumeSource) secret(ns, name string, items []corev1.KeyToPath, optional bool, dir string) error {
	secret, err := v.secrets.Secrets(ns).Get(name)
	if apierrors.IsNotFound(err) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("secret %s/%s: %w", ns, name, err)
	}
	return writeItems(secret.Data, items, dir)
}

func (v volumeSource) configMap(ns, name string, items []corev1.KeyToPath, optional bool, dir string) error {
	cm, err := v.configMaps.ConfigMaps(ns).Get(name)
	if apierrors.IsNotFound(err) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", ns, name, err)
	}
	data := map[string][]byte{}
	for k, s := range cm.Data {
		data[k] = []byte(s)
	}
	for k, b := range cm.BinaryData {
		data[k] = b
	}
	return writeItems(data, items, dir)
}

func (v volumeSource) projected(pod *corev1.Pod, projected *corev1.ProjectedVolumeSource, dir string) error {
	for _, source := range projected.Sources {
		var err error
		switch {
		case source.ServiceAccountToken != nil:
			err = v.legacyToken(pod, source.ServiceAccountToken.Path, dir)
		case source.Secret != nil:
			err = v.secret(pod.Namespace, source.Secret.Name, source.Secret.Items, skipMissing(source.Secret.Optional), dir)
		case source.ConfigMap != nil:
			err = v.configMap(pod.Namespace, source.ConfigMap.Name, source.ConfigMap.Items, skipMissing(source.ConfigMap.Optional), dir)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// legacyToken: the `token` of the pod's service account's `kubernetes.io/service-account-token`
// Secret, bound to no pod, where one exists.
func (v volumeSource) legacyToken(pod *corev1.Pod, path, dir string) error {
	account := pod.Spec.ServiceAccountName
	if account == "" {
		account = "default"
	}
	secrets, err := v.secrets.Secrets(pod.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	for _, s := range secrets {
		if s.Type == corev1.SecretTypeServiceAccountToken && s.Annotations[corev1.ServiceAccountNameKey] == account {
			return writeFile(filepath.Join(dir, path), s.Data[corev1.ServiceAccountTokenKey])
		}
	}
	return nil
}

func writeItems(data map[string][]byte, items []corev1.KeyToPath, dir string) error {
	if len(items) == 0 {
		for k, b := range data {
			if err := writeFile(filepath.Join(dir, k), b); err != nil {
				return err
			}
		}
		return nil
	}
	for _, item := range items {
		b, ok := data[item.Key]
		if !ok {
			return fmt.Errorf("no key %s", item.Key)
		}
		if err := writeFile(filepath.Join(dir, item.Path), b); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
