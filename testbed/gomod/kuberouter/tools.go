//go:build tools

package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
