'use strict';
// servicebinding.io test application: every connection setting comes from kube-service-bindings.
const fs = require('fs');
const http = require('http');
const path = require('path');
const { getBinding } = require('kube-service-bindings');
// Not in the package's index, but a plain file of it (its package.json has no "exports").
const { getBindingData } = require('kube-service-bindings/utils/index.js');
const pg = require('pg');
const amqp = require('amqplib');
const { MongoClient, MongoServerError } = require('mongodb');

const ROOT = process.env.SERVICE_BINDING_ROOT || '/bindings';
const TIMEOUT_MS = 10000;
// A binding's `type` -> the library's service type and client.
const CLIENTS = { postgresql: ['POSTGRESQL', 'pg'], rabbitmq: ['AMQP', 'rhea'], mongodb: ['MONGODB', 'mongodb'] };

class BindingError extends Error {}

// getBinding(type, client) finds a folder by its `type` only (utils/index.js getBindingDataPath):
// the first of that type wins, and its `aliases` table, which has only amqp, throws (silently
// caught: "No Binding Found") for postgresql and mongodb as soon as a folder of another type
// comes first; its `id` option is a substring match (node-pg would also take node-pg-bad-ca). So
// the folder is picked by name here, read by the library's own reader (no client needed: none of
// these clients' mappings reads an entry as a file path), and the library still maps it for the
// driver (getBinding's `bindingData` option).
function load(name) {
  const dir = path.join(ROOT, name);
  if (!/^[a-z0-9][a-z0-9.-]*$/.test(name) || !fs.existsSync(dir)) {
    throw new BindingError(`no binding folder ${dir}`);
  }
  const entries = Object.fromEntries(getBindingData(dir)); // skips the kubelet's ..data links
  const client = CLIENTS[entries.type];
  if (!client) throw new BindingError(`binding ${name} has type '${entries.type}', not one of ${Object.keys(CLIENTS)}`);
  const config = getBinding(...client, { bindingData: entries });
  // The CA as the binding gives it: the mappings keep unmapped entries (no filter for these clients).
  const ca = config['ca.crt'];
  if (!ca) throw new BindingError(`binding ${name} has no ca.crt`);
  return { type: entries.type, config, ca };
}

const checks = {
  async postgresql({ config }, token) {
    // The pg mapping gives user/password/host/port/database and ssl.ca (from root.crt); node-postgres
    // sets servername to the host name, and the identity check is node's: verify-full.
    if (!config.ssl?.ca) throw new BindingError('binding has no root.crt: no TLS for node-postgres');
    const client = new pg.Client({ ...config, ssl: { ...config.ssl, rejectUnauthorized: true }, connectionTimeoutMillis: TIMEOUT_MS });
    client.on('error', () => {}); // a late socket error must not end the process
    try {
      await client.connect();
      await client.query('create table if not exists tokens (value text)');
      await client.query('insert into tokens (value) values ($1)', [token]);
      const read = await client.query('select value from tokens where value = $1 limit 1', [token]);
      const me = await client.query('select current_user, ssl from pg_stat_ssl where pid = pg_backend_pid()');
      return { user: me.rows[0].current_user, tls: me.rows[0].ssl, token: read.rows[0]?.value };
    } finally {
      await client.end().catch(() => {});
    }
  },

  async rabbitmq({ config, ca }, token) {
    // The library's only AMQP mapping is rhea's (host/port/username/password); amqplib wants
    // hostname and vhost, and the CA as a socket option (it sets servername to the hostname itself).
    const conn = await amqp.connect(
      {
        protocol: config.ssl === 'true' ? 'amqps' : 'amqp',
        hostname: config.host,
        port: Number(config.port),
        username: config.username,
        password: config.password,
        vhost: config['virtual-host'],
      },
      { ca: [ca], timeout: TIMEOUT_MS },
    );
    conn.on('error', () => {});
    try {
      const ch = await conn.createChannel();
      const queue = `check-${token}`;
      await ch.assertQueue(queue, { exclusive: true, autoDelete: true });
      ch.sendToQueue(queue, Buffer.from(token));
      let msg = false;
      for (let i = 0; i < 50 && !msg; i++) {
        msg = await ch.get(queue, { noAck: true });
        if (!msg) await new Promise((r) => setTimeout(r, 100));
      }
      if (!msg) throw new Error(`no message on ${queue} after 5 s`);
      return { user: config.username, tls: conn.connection.stream.encrypted === true, token: msg.content.toString() };
    } finally {
      await conn.close().catch(() => {});
    }
  },

  async mongodb({ config, ca }, token) {
    // The mongodb mapping gives url (mongodb://user:pw@host:port) and auth; it leaves out the
    // database (the auth source, as in the binding's uri), TLS and the CA.
    const client = new MongoClient(config.url, {
      ...config.connectionOptions,
      authSource: config.database,
      tls: config.tls === 'true',
      ca,
      serverSelectionTimeoutMS: TIMEOUT_MS,
      connectTimeoutMS: TIMEOUT_MS,
    });
    try {
      const db = client.db(config.database);
      await db.collection('tokens').insertOne({ token });
      const read = await db.collection('tokens').findOne({ token });
      const status = await db.command({ connectionStatus: 1 });
      const user = status.authInfo?.authenticatedUsers?.[0]?.user;
      return { user, tls: client.options.tls, token: read?.token };
    } finally {
      await client.close().catch(() => {});
    }
  },
};

// The cause chain, with the server errors a MongoDB server selection failure holds.
function chain(err) {
  const out = [];
  for (let e = err; e && out.length < 10; ) {
    out.push(e);
    const servers = e.reason?.servers ? [...e.reason.servers.values()].map((s) => s.error).filter(Boolean) : [];
    e = e.cause || (servers[0] !== e ? servers[0] : undefined);
  }
  return out;
}

// OpenSSL's verify results for a certificate that does not lead to a trusted CA.
const UNTRUSTED = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_UNTRUSTED',
]);

function kind(e) {
  if (UNTRUSTED.has(e.code)) return 'certificate';
  if (e.code === 'ERR_TLS_CERT_ALTNAME_INVALID') return 'name';
  if (e instanceof pg.DatabaseError && (e.code === '28P01' || e.code === '28000')) return 'auth';
  if (e instanceof MongoServerError && e.code === 18) return 'auth'; // AuthenticationFailed
  // amqplib's handshake error has no code: connection.close's reply code 403 is in its message.
  if (/^Handshake terminated by server: 403 \(ACCESS-REFUSED\)/.test(e.message)) return 'auth';
  return undefined;
}

function describe(err) {
  const causes = chain(err);
  return {
    error: causes.map((e) => `${e.constructor?.name || e.name}${e.code !== undefined ? ` [${e.code}]` : ''}: ${e.message}`).join(' <- '),
    kind: (!(err instanceof BindingError) && causes.map(kind).find(Boolean)) || 'other',
  };
}

async function check(name, token) {
  try {
    const binding = load(name);
    return [200, { binding: name, type: binding.type, ...(await checks[binding.type](binding, token)) }];
  } catch (err) {
    return [500, { binding: name, ...describe(err) }];
  }
}

const server = http.createServer(async (req, res) => {
  const started = Date.now();
  const url = new URL(req.url, 'http://app');
  let status = 404;
  let body = 'not found\n';
  let match;
  if (req.method === 'GET' && url.pathname === '/healthz') {
    [status, body] = [200, 'ok'];
  } else if (req.method === 'GET' && (match = url.pathname.match(/^\/check\/([^/]+)$/))) {
    const token = url.searchParams.get('token');
    [status, body] = token ? await check(decodeURIComponent(match[1]), token) : [400, { error: 'token missing' }];
  }
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, { 'content-type': typeof body === 'string' ? 'text/plain' : 'application/json' });
  res.end(text);
  const note = status === 500 ? ` kind=${body.kind} ${body.error}` : '';
  console.log(`${new Date().toISOString()} ${req.method} ${req.url} ${status} ${Date.now() - started}ms${note}`);
});

server.listen(8080, '0.0.0.0', () => console.log(`listening on 0.0.0.0:8080, bindings in ${ROOT}`));
