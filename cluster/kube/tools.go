//go:build tools

// Package kube pins the Kubernetes commands built by `make cluster-bins`
// (cluster/cluster.mk); it is never compiled into anything.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
