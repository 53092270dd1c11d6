package io.statefleet.bindingapp;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import org.springframework.context.SmartLifecycle;

/** The JDK's HTTP server: /healthz and /check/&lt;binding&gt;?token=&lt;t&gt;. */
final class CheckServer implements SmartLifecycle {

	private static final Logger log = LoggerFactory.getLogger(CheckServer.class);

	private final BindingChecks checks;

	private final int port;

	private HttpServer server;

	private ExecutorService executor;

	CheckServer(BindingChecks checks, int port) {
		this.checks = checks;
		this.port = port;
	}

	/** Made on the first check, not at start: /healthz answers sooner. */
	private static final class Json {

		static final ObjectMapper MAPPER = new ObjectMapper();

	}

	@Override
	public void start() {
		try {
			this.server = HttpServer.create(new InetSocketAddress("0.0.0.0", this.port), 64);
		}
		catch (IOException ex) {
			throw new IllegalStateException("cannot listen on port " + this.port, ex);
		}
		this.executor = Executors.newFixedThreadPool(4);
		this.server.setExecutor(this.executor);
		this.server.createContext("/", this::handle);
		this.server.start();
		log.info("listening on 0.0.0.0:{}", this.port);
	}

	@Override
	public void stop() {
		this.server.stop(0);
		this.executor.shutdownNow();
		this.server = null;
	}

	@Override
	public boolean isRunning() {
		return this.server != null;
	}

	private void handle(HttpExchange exchange) throws IOException {
		long started = System.nanoTime();
		String path = exchange.getRequestURI().getRawPath();
		int status;
		String detail = "";
		try {
			if (!exchange.getRequestMethod().equals("GET")) {
				status = send(exchange, 405, "text/plain", "method not allowed\n");
			}
			else if (path.equals("/healthz")) {
				status = send(exchange, 200, "text/plain", "ok");
			}
			else if (path.startsWith("/check/") && path.length() > "/check/".length()) {
				String binding = URLDecoder.decode(path.substring("/check/".length()), StandardCharsets.UTF_8);
				String token = queryParameter(exchange.getRequestURI().getRawQuery(), "token");
				Map<String, Object> body;
				if (token == null || token.isEmpty()) {
					body = new LinkedHashMap<>();
					body.put("binding", binding);
					body.put("error", "the token query parameter is missing");
					body.put("kind", "other");
					status = 400;
				}
				else {
					try {
						body = this.checks.check(binding, token);
						status = 200;
					}
					catch (Exception | LinkageError ex) {
						body = new LinkedHashMap<>();
						body.put("binding", binding);
						body.put("error", ErrorKinds.describe(ex));
						body.put("kind", (ex instanceof BindingChecks.BindingProblem) ? "other" : ErrorKinds.kind(ex));
						status = 500;
					}
				}
				detail = (status == 200) ? " user=" + body.get("user") + " tls=" + body.get("tls")
						: " kind=" + body.get("kind") + " error=" + body.get("error");
				status = send(exchange, status, "application/json", Json.MAPPER.writeValueAsString(body));
			}
			else {
				status = send(exchange, 404, "text/plain", "not found\n");
			}
		}
		finally {
			exchange.close();
		}
		log.info("{} {} -> {} in {} ms{}", exchange.getRequestMethod(), path, status,
				(System.nanoTime() - started) / 1_000_000, detail);
	}

	private static int send(HttpExchange exchange, int status, String type, String body) throws IOException {
		byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
		exchange.getResponseHeaders().set("Content-Type", type + "; charset=utf-8");
		exchange.sendResponseHeaders(status, bytes.length);
		try (OutputStream out = exchange.getResponseBody()) {
			out.write(bytes);
		}
		return status;
	}

	private static String queryParameter(String rawQuery, String name) {
		if (rawQuery == null) {
			return null;
		}
		for (String pair : rawQuery.split("&")) {
			int eq = pair.indexOf('=');
			String key = URLDecoder.decode((eq < 0) ? pair : pair.substring(0, eq), StandardCharsets.UTF_8);
			if (key.equals(name)) {
				return (eq < 0) ? "" : URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8);
			}
		}
		return null;
	}

}
