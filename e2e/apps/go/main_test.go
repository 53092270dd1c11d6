package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nebhale/client-go/bindings"
	amqp "github.com/rabbitmq/amqp091-go"
)

func writeBinding(t *testing.T, root, name string, entries map[string]string) {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range entries {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResolvePicksTheNamedFolderAmongBindingsOfOneType(t *testing.T) {
	root := t.TempDir()
	t.Setenv("SERVICE_BINDING_ROOT", root)
	writeBinding(t, root, "go-pg", map[string]string{"type": "postgresql\n"})
	writeBinding(t, root, "go-pg-bad-ca", map[string]string{"type": "postgresql"})
	writeBinding(t, root, "other", map[string]string{"type": "redis"})

	b, err := resolve("go-pg-bad-ca")
	if err != nil || b.GetName() != "go-pg-bad-ca" || b.typ != "postgresql" {
		t.Fatalf("got %v %q %v", b.Binding, b.typ, err)
	}
	if _, err := resolve("missing"); err == nil || !strings.Contains(err.Error(), "no binding") {
		t.Fatalf("missing: %v", err)
	}
	if _, err := resolve("other"); err == nil || !strings.Contains(err.Error(), `type "redis"`) {
		t.Fatalf("unsupported type: %v", err)
	}
	writeBinding(t, root, "GO-PG", map[string]string{"type": "postgresql"})
	if _, err := resolve("go-pg"); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Fatalf("ambiguous: %v", err)
	}
}

func TestResolveWithoutRoot(t *testing.T) {
	t.Setenv("SERVICE_BINDING_ROOT", "")
	os.Unsetenv("SERVICE_BINDING_ROOT")
	if _, err := resolve("go-pg"); err == nil || !strings.Contains(err.Error(), "not set") {
		t.Fatalf("got %v", err)
	}
}

// issue makes a certificate for names, signed by parent (self-signed when parent is nil).
func issue(t *testing.T, parent *tls.Certificate, isCA bool, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: names, IsCA: isCA, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	signer, signerKey := template, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, template, signer, key.Public(), signerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// handshake dials a local TLS server the way the checks do: the binding's CA, its host name.
func handshake(t *testing.T, server tls.Certificate, ca tls.Certificate, serverName string) error {
	listener, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{server}})
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	go func() {
		if conn, err := listener.Accept(); err == nil {
			_ = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()
	root := t.TempDir()
	writeBinding(t, root, "x", map[string]string{
		"ca.crt": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate[0]})),
	})
	config, err := binding{Binding: bindings.ConfigTreeBinding{Root: filepath.Join(root, "x")}}.tlsConfig(serverName)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", listener.Addr().String(), config)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	return conn.Close()
}

func TestKindOfTLSFailures(t *testing.T) {
	ca, otherCA := issue(t, nil, true), issue(t, nil, true)
	server := issue(t, &ca, false, "pg-rw.apps.svc")
	if err := handshake(t, server, ca, "pg-rw.apps.svc"); err != nil {
		t.Fatalf("good: %v", err)
	}
	if err := handshake(t, server, otherCA, "pg-rw.apps.svc"); kindOf(err) != "certificate" {
		t.Fatalf("other CA: %s %v", kindOf(err), chain(err))
	}
	if err := handshake(t, server, ca, "10.96.0.12"); kindOf(err) != "name" {
		t.Fatalf("by IP: %s %v", kindOf(err), chain(err))
	}
}

func TestKindOfDriverCodes(t *testing.T) {
	pg := fmt.Errorf("failed to connect: %w", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"})
	if kindOf(pg) != "auth" {
		t.Fatal(chain(pg))
	}
	if kindOf(amqp.ErrCredentials) != "auth" {
		t.Fatal(chain(amqp.ErrCredentials))
	}
	if got := chain(pg); !strings.Contains(got, "*fmt.wrapError: failed to connect") || !strings.Contains(got, " <- *pgconn.PgError: ") {
		t.Fatal(got)
	}
	if kindOf(errors.New("boom")) != "other" {
		t.Fatal("other")
	}
}
