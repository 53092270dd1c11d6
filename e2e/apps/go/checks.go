package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func checkPostgres(ctx context.Context, b binding, token string) (result, error) {
	var res result
	values := map[string]string{}
	for _, key := range []string{"host", "port", "username", "password", "database"} {
		v, err := b.entry(key)
		if err != nil {
			return res, err
		}
		values[key] = v
	}
	port, err := strconv.ParseUint(values["port"], 10, 16)
	if err != nil {
		return res, fmt.Errorf("binding %q: port %q: %w", b.GetName(), values["port"], err)
	}
	// verify-full whatever the `sslmode` entry says: the CA and the host name, no fallback.
	tlsConfig, err := b.tlsConfig(values["host"])
	if err != nil {
		return res, err
	}
	// pgx builds a ConnConfig only through ParseConfig; every field that matters is set below.
	config, err := pgx.ParseConfig("")
	if err != nil {
		return res, err
	}
	config.Host, config.Port = values["host"], uint16(port)
	config.User, config.Password, config.Database = values["username"], values["password"], values["database"]
	config.TLSConfig = tlsConfig
	config.Fallbacks = nil // ParseConfig's default sslmode=prefer would retry without TLS

	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if _, err := conn.Exec(ctx, "create table if not exists tokens (value text)"); err != nil {
		return res, err
	}
	if _, err := conn.Exec(ctx, "insert into tokens (value) values ($1)", token); err != nil {
		return res, err
	}
	if err := conn.QueryRow(ctx, "select value from tokens where value = $1 limit 1", token).Scan(&res.Token); err != nil {
		return res, err
	}
	err = conn.QueryRow(ctx, "select current_user, ssl from pg_stat_ssl where pid = pg_backend_pid()").Scan(&res.User, &res.TLS)
	return res, err
}

func checkRabbitMQ(ctx context.Context, b binding, token string) (result, error) {
	var res result
	uri, err := b.entry("uri")
	if err != nil {
		return res, err
	}
	parsed, err := amqp.ParseURI(uri)
	if err != nil {
		return res, fmt.Errorf("binding %q: uri: %w", b.GetName(), err)
	}
	// DialTLS uses its tls.Config only for amqps (DialConfig in connection.go): an amqp:// uri
	// would connect in plaintext.
	if parsed.Scheme != "amqps" {
		return res, fmt.Errorf("binding %q: uri scheme %q is not amqps: refusing a connection without TLS", b.GetName(), parsed.Scheme)
	}
	host, err := b.entry("host")
	if err != nil {
		return res, err
	}
	tlsConfig, err := b.tlsConfig(host)
	if err != nil {
		return res, err
	}
	conn, err := amqp.DialTLS(uri, tlsConfig)
	if err != nil {
		return res, err
	}
	defer conn.Close()
	res.User, res.TLS = parsed.Username, conn.ConnectionState().HandshakeComplete

	ch, err := conn.Channel()
	if err != nil {
		return res, err
	}
	queue, err := ch.QueueDeclare("check-"+token, false, true, true, false, nil)
	if err != nil {
		return res, err
	}
	err = ch.PublishWithContext(ctx, "", queue.Name, false, false, amqp.Publishing{ContentType: "text/plain", Body: []byte(token)})
	if err != nil {
		return res, err
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		msg, ok, err := ch.Get(queue.Name, true)
		if err != nil {
			return res, err
		}
		if ok {
			res.Token = string(msg.Body)
			return res, nil
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the message published to queue %q did not arrive within 5 s", queue.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func checkMongo(ctx context.Context, b binding, token string) (result, error) {
	var res result
	uri, err := b.entry("uri")
	if err != nil {
		return res, err
	}
	database, err := b.entry("database")
	if err != nil {
		return res, err
	}
	// No ServerName: the driver sets it to each host it dials, the uri's and the replica set's
	// members alike (configureTLS in x/mongo/driver/topology/connection.go).
	tlsConfig, err := b.tlsConfig("")
	if err != nil {
		return res, err
	}
	// The driver tells nothing of a connection's TLS: a completed verification is the proof.
	var verified atomic.Bool
	tlsConfig.VerifyConnection = func(tls.ConnectionState) error {
		verified.Store(true)
		return nil
	}
	opts := options.Client().ApplyURI(uri).SetTLSConfig(tlsConfig).
		SetServerSelectionTimeout(8 * time.Second).SetConnectTimeout(8 * time.Second)
	client, err := mongo.Connect(opts)
	if err != nil {
		return res, err
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()

	tokens := client.Database(database).Collection("tokens")
	if _, err := tokens.InsertOne(ctx, bson.D{{Key: "token", Value: token}}); err != nil {
		return res, err
	}
	var found struct {
		Token string `bson:"token"`
	}
	if err := tokens.FindOne(ctx, bson.D{{Key: "token", Value: token}}).Decode(&found); err != nil {
		return res, err
	}
	var status struct {
		AuthInfo struct {
			AuthenticatedUsers []struct {
				User string `bson:"user"`
				DB   string `bson:"db"`
			} `bson:"authenticatedUsers"`
		} `bson:"authInfo"`
	}
	if err := client.Database(database).RunCommand(ctx, bson.D{{Key: "connectionStatus", Value: 1}}).Decode(&status); err != nil {
		return res, err
	}
	if len(status.AuthInfo.AuthenticatedUsers) == 0 {
		return res, errors.New("connectionStatus names no authenticated user")
	}
	res.User, res.TLS, res.Token = status.AuthInfo.AuthenticatedUsers[0].User, verified.Load(), found.Token
	return res, nil
}
