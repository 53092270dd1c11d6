// The Go application of the servicebinding.io test matrix: every connection setting comes from
// the binding folders under $SERVICE_BINDING_ROOT through github.com/nebhale/client-go, and each
// /check opens a new, verified TLS connection (see e2e/test_binding_apps.py).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"
)

// A check must answer before the test's HTTP client gives up, failures included.
const checkTimeout = 25 * time.Second

type result struct {
	Binding string `json:"binding"`
	Type    string `json:"type"`
	User    string `json:"user"`
	TLS     bool   `json:"tls"`
	Token   string `json:"token"`
}

type failure struct {
	Binding string `json:"binding"`
	Error   string `json:"error"`
	Kind    string `json:"kind"`
}

var checks = map[string]func(ctx context.Context, b binding, token string) (result, error){
	"postgresql": checkPostgres,
	"rabbitmq":   checkRabbitMQ,
	"mongodb":    checkMongo,
}

func main() {
	// Only the image's smoke check listens elsewhere: the chroot shares the build host's ports.
	listen := flag.String("listen", "0.0.0.0:8080", "address to serve HTTP on")
	flag.Parse()
	log.SetOutput(os.Stdout)
	log.SetFlags(log.LstdFlags | log.LUTC | log.Lmicroseconds)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("GET /check/{binding}", handleCheck)

	server := &http.Server{
		Addr:              *listen,
		Handler:           logRequests(mux),
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Printf("listening on %s, bindings under %s=%q", server.Addr, "SERVICE_BINDING_ROOT", os.Getenv("SERVICE_BINDING_ROOT"))
	log.Fatal(server.ListenAndServe())
}

func handleCheck(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("binding")
	token := r.URL.Query().Get("token")
	if token == "" {
		writeJSON(w, http.StatusBadRequest, failure{Binding: name, Error: "the query parameter token is missing", Kind: "other"})
		return
	}
	// The folder is read anew on each request: a rotated password or a changed file counts at once.
	b, err := resolve(name)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, failure{Binding: name, Error: chain(err), Kind: "other"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), checkTimeout)
	defer cancel()
	res, err := checks[b.typ](ctx, b, token)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, failure{Binding: name, Error: chain(err), Kind: kindOf(err)})
		return
	}
	res.Binding, res.Type = name, b.typ
	writeJSON(w, http.StatusOK, res)
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	if rec, ok := w.(*statusRecorder); ok {
		if f, ok := body.(failure); ok {
			rec.kind = f.Kind
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // the chain's " <- " as written
	_ = enc.Encode(body)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	kind   string // of a failed check, for the log line
}

func (s *statusRecorder) WriteHeader(status int) {
	s.status = status
	s.ResponseWriter.WriteHeader(status)
}

func logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		line := fmt.Sprintf("%s %s %s %d %dms", r.RemoteAddr, r.Method, r.URL.Path, rec.status, time.Since(start).Milliseconds())
		if rec.kind != "" {
			line += " kind=" + rec.kind
		}
		log.Print(line)
	})
}
