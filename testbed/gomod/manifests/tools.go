//go:build tools

package tools

import (
	_ "github.com/yannh/kubeconform/cmd/kubeconform"
	_ "github.com/zegl/kube-score/cmd/kube-score"
)
