package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/nebhale/client-go/bindings"
)

// The library hands out entries only (bindings.Get / GetAsBytes), no driver configuration: each
// check maps the entries to its driver's settings itself, as little as the driver needs.
type binding struct {
	bindings.Binding
	typ string // one of the keys of checks, as the library's Filter matched it
}

// resolve finds the binding folder `name` through the library, read anew from disk.
func resolve(name string) (binding, error) {
	// FromServiceBindingRoot answers an empty list, silently, when the variable is unset or the
	// folder unreadable (bindings.go): say which.
	root, ok := os.LookupEnv(bindings.ServiceBindingRoot)
	if !ok {
		return binding{}, errors.New("SERVICE_BINDING_ROOT is not set")
	}
	// Not bindings.Cached: every entry is read from the projected files when it is asked for.
	all := bindings.FromServiceBindingRoot()

	// Filter returns every binding of a type (a pod may mount go-pg and go-pg-bad-ca): the folder
	// name the request gives decides, compared as the library's Find compares (case-insensitively).
	var found []binding
	for typ := range checks {
		for _, b := range bindings.Filter(all, typ) {
			if strings.EqualFold(b.GetName(), name) {
				found = append(found, binding{Binding: b, typ: typ})
			}
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		if b, ok := bindings.Find(all, name); ok {
			t, err := bindings.GetType(b)
			if err != nil {
				return binding{}, fmt.Errorf("binding %q: %w", name, err)
			}
			return binding{}, fmt.Errorf("binding %q has type %q: this app checks %s", name, t, strings.Join(supported(), ", "))
		}
		return binding{}, fmt.Errorf("no binding %q under %s (found: %s)", name, root, strings.Join(names(all), ", "))
	default:
		var which []string
		for _, b := range found {
			which = append(which, fmt.Sprintf("%s (%s)", b.GetName(), b.typ))
		}
		return binding{}, fmt.Errorf("binding name %q is ambiguous under %s: %s all match it", name, root, strings.Join(which, ", "))
	}
}

func supported() []string {
	var types []string
	for t := range checks {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

func names(all []bindings.Binding) []string {
	out := []string{}
	for _, b := range all {
		out = append(out, b.GetName())
	}
	return out
}

// entry is a required entry; bindings.Get trims surrounding whitespace.
func (b binding) entry(key string) (string, error) {
	v, ok := bindings.Get(b, key)
	if !ok || v == "" {
		return "", fmt.Errorf("binding %q has no %q entry", b.GetName(), key)
	}
	return v, nil
}

// tlsConfig verifies the server against the binding's own CA (its `ca.crt` entry, which the
// library reads but gives no driver a use for) and, by Go's defaults, the host name in
// serverName; an empty serverName is left for the driver to set per host it dials.
func (b binding) tlsConfig(serverName string) (*tls.Config, error) {
	pem, ok := b.GetAsBytes("ca.crt")
	if !ok {
		return nil, fmt.Errorf("binding %q has no %q entry: the server cannot be verified", b.GetName(), "ca.crt")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("binding %q: %q holds no PEM certificate", b.GetName(), "ca.crt")
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}
