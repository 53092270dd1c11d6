"""servicebinding.io test application, Python: reads each binding with pyservicebinding and
checks it with the ecosystem's usual driver (psycopg, pika, pymongo) over verified TLS.

GET /healthz                 -> 200 ok
GET /check/<binding>?token=t -> a new connection from the folder $SERVICE_BINDING_ROOT/<binding>,
                                read again on every request; 200 or 500 JSON as the e2e test
                                (e2e/test_binding_apps.py) expects.
"""

import json
import logging
import os
import re
import signal
import ssl
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import pika
import pika.exceptions
import psycopg
import pymongo
import pymongo.errors
from pyservicebinding import binding

PORT = int(os.environ.get("PORT", "8080"))  # another port only for a run outside the image
TIMEOUT_S = 5
APP_NAME = "statefleet-binding-app-python"
# A Kubernetes object name: no "/" nor "..", so it names one folder under the root.
BINDING_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
NAME_MISMATCH_CODES = {62, 64}
# Their texts (X509_verify_cert_error_string), where only the message is left.
NAME_MISMATCH_REASONS = {"Hostname mismatch", "IP address mismatch"}
SSL_VERIFY_FAILED = re.compile(
    r"\[SSL: CERTIFICATE_VERIFY_FAILED\] certificate verify failed: ([^,(]+?)\s*[,(]"
)


class BindingError(Exception):
    """The binding folder is missing or unusable (kind "other")."""


def read_binding(name):
    """(folder, entries) of $SERVICE_BINDING_ROOT/<name>, the entries read by the library."""
    sb = binding.ServiceBinding()  # raises ServiceBindingRootMissingError without the variable
    folder = os.path.join(sb.root, name)
    # pyservicebinding only reads whole roots: bindings(type) and all_bindings() list every folder
    # under the root and return each one's entries without the folder's name
    # (pyservicebinding/binding.py, ServiceBinding.bindings/all_bindings), and the root comes only
    # from SERVICE_BINDING_ROOT (ServiceBinding.__init__). So the library is given a root of its
    # own holding nothing but a link to the one folder asked for.
    with tempfile.TemporaryDirectory(prefix="binding-") as one_root:
        os.symlink(folder, os.path.join(one_root, name))
        sb.root = one_root
        found = sb.all_bindings()
    if not found:
        raise BindingError(f"no binding folder {folder}")
    entries = found[0]
    if "type" not in entries:
        raise BindingError(f"binding folder {folder} has no type entry")
    return folder, entries


def entry(entries, key):
    try:
        return entries[key]
    except KeyError:
        raise BindingError(f"the binding has no {key!r} entry") from None


# The library gives a dict of entries and no driver configuration at all, so each check maps
# the servicebinding.io entries to its driver's settings by hand.


def check_postgresql(folder, entries, token):
    # libpq wants the CA as a file: the binding's sslrootcert entry names it relative to the
    # binding folder. sslmode is set here, not taken from the binding: never less than verify-full.
    sslrootcert = os.path.join(folder, entries.get("sslrootcert", "ca.crt"))
    with psycopg.connect(
        host=entry(entries, "host"),
        port=entry(entries, "port"),
        user=entry(entries, "username"),
        password=entry(entries, "password"),
        dbname=entry(entries, "database"),
        sslmode="verify-full",
        sslrootcert=sslrootcert,
        connect_timeout=TIMEOUT_S,
        application_name=APP_NAME,
    ) as conn:
        conn.execute("create table if not exists tokens (value text)")
        conn.execute("insert into tokens (value) values (%s)", (token,))
        (got,) = conn.execute("select value from tokens where value = %s limit 1", (token,)).fetchone()
        user, tls = conn.execute(
            "select current_user, ssl from pg_stat_ssl where pid = pg_backend_pid()"
        ).fetchone()
    return {"user": user, "tls": tls, "token": got}


def check_rabbitmq(folder, entries, token):
    # pika takes an SSLContext: the CA is the binding's ca.crt entry (PEM text, as the library
    # read it); the default context verifies the chain and the host name.
    context = ssl.create_default_context(cadata=entry(entries, "ca.crt"))
    host = entry(entries, "host")
    user = entry(entries, "username")
    params = pika.ConnectionParameters(
        host=host,
        port=int(entry(entries, "port")),
        virtual_host=entries.get("virtual-host", "/"),
        credentials=pika.PlainCredentials(user, entry(entries, "password")),
        ssl_options=pika.SSLOptions(context, server_hostname=host),
        connection_attempts=1,
        socket_timeout=TIMEOUT_S,
        stack_timeout=TIMEOUT_S * 2,
        blocked_connection_timeout=TIMEOUT_S,
        client_properties={"connection_name": APP_NAME},
    )
    conn = pika.BlockingConnection(params)
    try:
        channel = conn.channel()
        queue = channel.queue_declare(queue=f"check-{token}", exclusive=True).method.queue
        channel.basic_publish(exchange="", routing_key=queue, body=token.encode())
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            _method, _props, body = channel.basic_get(queue, auto_ack=True)
            if body is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the message published to {queue} did not come back")
            conn.sleep(0.1)
    finally:
        conn.close()
    # pika exposes no state of its socket; with ssl_options it speaks TLS or fails.
    return {"user": user, "tls": params.ssl_options is not None, "token": body.decode()}


def check_mongodb(folder, entries, token):
    # The uri has no CA and pymongo reads a CA only from a file: the binding's own ca.crt.
    # tls=True: the binding's tls entry and uri say so too, but never less.
    client = pymongo.MongoClient(
        entry(entries, "uri"),
        tls=True,
        tlsCAFile=os.path.join(folder, "ca.crt"),
        serverSelectionTimeoutMS=TIMEOUT_S * 1000,
        connectTimeoutMS=TIMEOUT_S * 1000,
        appname=APP_NAME,
    )
    try:
        db = client[entry(entries, "database")]
        try:
            db.tokens.insert_one({"token": token})
        except pymongo.errors.ServerSelectionTimeoutError as e:
            # The cause (TLS, DNS, refused) is the monitor's last error for each server.
            e.server_errors = [
                sd.error for sd in client.topology_description.server_descriptions().values() if sd.error
            ]
            raise
        got = db.tokens.find_one({"token": token})["token"]
        status = db.command("connectionStatus")
    finally:
        client.close()
    users = status.get("authInfo", {}).get("authenticatedUsers", [])
    return {"user": users[0]["user"] if users else None, "tls": True, "token": got}


CHECKS = {"postgresql": check_postgresql, "rabbitmq": check_rabbitmq, "mongodb": check_mongodb}


def cause_chain(exc):
    """exc and its causes, outermost first."""
    chain, todo = [], [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in chain):
            continue
        chain.append(e)
        todo.append(e.__cause__ or (None if e.__suppress_context__ else e.__context__))
        todo.extend(getattr(e, "server_errors", ()))  # set by check_mongodb
    return chain


def kind_of(chain):
    for e in chain:
        if isinstance(e, ssl.SSLCertVerificationError):
            return "name" if e.verify_code in NAME_MISMATCH_CODES else "certificate"
        if isinstance(e, (pika.exceptions.AuthenticationError, pika.exceptions.ProbableAuthenticationError)):
            return "auth"
        if isinstance(e, pymongo.errors.OperationFailure) and e.code == 18:  # AuthenticationFailed
            return "auth"
        if isinstance(e, pymongo.errors.ConnectionFailure):
            # pymongo's monitor drops the SSLCertVerificationError it wraps (pymongo/synchronous/
            # monitor.py: _sanitize clears __cause__ and __context__) and keeps only its text in
            # the AutoReconnect: Python's "certificate verify failed: <OpenSSL's reason>".
            verify = SSL_VERIFY_FAILED.search(str(e))
            if verify:
                return "name" if verify.group(1) in NAME_MISMATCH_REASONS else "certificate"
        if isinstance(e, psycopg.Error):
            if e.sqlstate in ("28P01", "28000"):  # invalid_password, invalid_authorization_specification
                return "auth"
            # libpq reports connection failures as text only (PQerrorMessage: psycopg's sqlstate
            # is None even for a refused password, seen on the test bed): match its fixed messages
            # (fe-secure-openssl.c, fe-secure-common.c) and the server's for 28P01 (auth.c).
            message = str(e)
            if "password authentication failed" in message:
                return "auth"
            if "does not match host name" in message:
                return "name"
            if "certificate verify failed" in message:
                return "certificate"
    return "other"


def check(name, token):
    """(status, body) for /check/<name>."""
    entries = {}
    try:
        if not BINDING_NAME.match(name):
            raise BindingError(f"not a binding name: {name!r}")
        folder, entries = read_binding(name)
        kind = entries["type"]
        if kind not in CHECKS:
            raise BindingError(f"binding type {kind!r} is not one of {sorted(CHECKS)}")
        result = CHECKS[kind](folder, entries, token)
        return 200, {"binding": name, "type": kind, **result}
    except Exception as e:
        chain = cause_chain(e)
        body = {
            "binding": name,
            "error": " <- ".join(f"{type(c).__name__}: {c}" for c in chain),
            "kind": "other" if isinstance(e, BindingError) else kind_of(chain),
        }
        if "type" in entries:
            body["type"] = entries["type"]
        return 500, body


class Handler(BaseHTTPRequestHandler):
    server_version = APP_NAME
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        started = time.monotonic()
        url = urlsplit(self.path)
        note = ""
        if url.path == "/healthz":
            status, body, ctype = 200, b"ok", "text/plain"
        elif url.path.startswith("/check/"):
            name = unquote(url.path[len("/check/") :])
            token = parse_qs(url.query).get("token", [""])[0]
            if token:
                status, result = check(name, token)
            else:
                status, result = (
                    400,
                    {"binding": name, "error": "the token parameter is missing", "kind": "other"},
                )
            note = result.get("kind", "")
            body, ctype = json.dumps(result).encode(), "application/json"
        else:
            status, body, ctype = 404, b"not found", "text/plain"
        self.send_response_only(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        ms = (time.monotonic() - started) * 1000
        print(
            f"{self.client_address[0]} GET {url.path} {status} {note} {ms:.0f}ms".replace("  ", " "),
            flush=True,
        )

    def log_message(self, format, *args):
        # Errors of the HTTP layer only; each request's line is printed by do_GET.
        print(f"{self.client_address[0]} {format % args}", flush=True)


def main():
    # pika logs each failed connection at ERROR; the JSON answer already carries it.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    # As PID 1, SIGTERM is ignored unless handled.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    print(f"listening on :{PORT}, bindings in {os.environ.get('SERVICE_BINDING_ROOT')}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
