module statefleet/e2e/apps/go

go 1.25.0

require (
	github.com/jackc/pgx/v5 v5.13.0
	github.com/nebhale/client-go v1.0.1
	github.com/rabbitmq/amqp091-go v1.17.0
	go.mongodb.org/mongo-driver/v2 v2.10.1
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
