package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// causes lists err and everything it wraps, outermost first.
func causes(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(out) >= 64 {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
		// A server selection error wraps only its timeout; why no server could be selected (a
		// failed TLS handshake) is each server's last error in the topology it carries.
		if sel, ok := e.(topology.ServerSelectionError); ok {
			for _, server := range sel.Desc.Servers {
				walk(server.LastError)
			}
		}
	}
	walk(err)
	return out
}

// chain is the whole cause chain: each cause's type and message, joined with " <- ".
func chain(err error) string {
	var parts []string
	for _, e := range causes(err) {
		parts = append(parts, fmt.Sprintf("%T: %s", e, e.Error()))
	}
	return strings.Join(parts, " <- ")
}

// kindOf classifies by the drivers' and crypto/x509's error types and codes.
func kindOf(err error) string {
	all := causes(err)
	for _, e := range all {
		var unknownAuthority x509.UnknownAuthorityError
		var invalid x509.CertificateInvalidError
		var verification *tls.CertificateVerificationError
		if errors.As(e, &unknownAuthority) || errors.As(e, &invalid) {
			return "certificate"
		}
		if errors.As(e, &verification) && !isHostname(verification.Err) {
			return "certificate"
		}
	}
	for _, e := range all {
		if isHostname(e) {
			return "name"
		}
	}
	for _, e := range all {
		var pg *pgconn.PgError
		var broker *amqp.Error
		var command mongo.CommandError
		var server driver.Error
		switch {
		// Class 28, invalid authorization specification: 28P01 a wrong password, 28000 refused.
		case errors.As(e, &pg) && strings.HasPrefix(pg.Code, "28"):
			return "auth"
		// 403 ACCESS_REFUSED: the broker's connection.close, or the driver's own ErrCredentials
		// when the broker drops the socket at start-ok, as RabbitMQ does here: amqp091 replaces
		// the client capabilities and never asks for authentication_failure_close (openStart).
		case errors.As(e, &broker) && broker.Code == amqp.AccessRefused:
			return "auth"
		// 18: AuthenticationFailed.
		case errors.As(e, &command) && command.HasErrorCode(18), errors.As(e, &server) && server.Code == 18:
			return "auth"
		}
	}
	return "other"
}

func isHostname(err error) bool {
	var hostname x509.HostnameError
	return errors.As(err, &hostname)
}
