//go:build tools

// Keeps kubevirt.io/kubevirt in go.mod: main.go reads its generated CRD
// validation file from the module's directory, without compiling the
// package that holds it (whose imports include modules the Go module
// proxy does not serve; decision 0033).
package main

import _ "kubevirt.io/kubevirt/pkg/pointer"
