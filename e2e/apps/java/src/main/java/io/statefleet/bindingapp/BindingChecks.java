package io.statefleet.bindingapp;

import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import javax.sql.DataSource;

import com.mongodb.MongoClientSettings;
import com.mongodb.MongoTimeoutException;
import com.mongodb.client.MongoClient;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.MongoDatabase;
import com.mongodb.connection.ServerDescription;
import com.rabbitmq.client.GetResponse;
import org.bson.Document;

import org.springframework.amqp.rabbit.connection.CachingConnectionFactory;
import org.springframework.amqp.rabbit.connection.RabbitConnectionFactoryBean;
import org.springframework.amqp.rabbit.core.RabbitTemplate;
import org.springframework.boot.autoconfigure.amqp.CachingConnectionFactoryConfigurer;
import org.springframework.boot.autoconfigure.amqp.RabbitConnectionDetails;
import org.springframework.boot.autoconfigure.amqp.RabbitConnectionFactoryBeanConfigurer;
import org.springframework.boot.autoconfigure.amqp.RabbitProperties;
import org.springframework.boot.autoconfigure.jdbc.DataSourceProperties;
import org.springframework.boot.autoconfigure.mongo.MongoClientFactory;
import org.springframework.boot.autoconfigure.mongo.MongoClientSettingsBuilderCustomizer;
import org.springframework.boot.autoconfigure.mongo.MongoProperties;
import org.springframework.boot.autoconfigure.mongo.PropertiesMongoConnectionDetails;
import org.springframework.boot.autoconfigure.mongo.StandardMongoClientSettingsBuilderCustomizer;
import org.springframework.boot.autoconfigure.ssl.PropertiesSslBundle;
import org.springframework.boot.autoconfigure.ssl.SslProperties;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.boot.context.properties.source.MapConfigurationPropertySource;
import org.springframework.boot.io.ApplicationResourceLoader;
import org.springframework.boot.ssl.DefaultSslBundleRegistry;
import org.springframework.boot.ssl.SslBundle;
import org.springframework.boot.ssl.SslBundles;
import org.springframework.cloud.bindings.Binding;
import org.springframework.cloud.bindings.Bindings;
import org.springframework.cloud.bindings.boot.BindingsPropertiesProcessor;
import org.springframework.core.env.Environment;
import org.springframework.core.io.ResourceLoader;
import org.springframework.core.io.support.SpringFactoriesLoader;
import org.springframework.jdbc.datasource.SimpleDriverDataSource;

/**
 * One check per request: the binding's folder is read again, Spring Cloud Bindings' processors map
 * that binding alone to Spring Boot properties, and Boot's own property classes and configurers
 * make a new client from them.
 */
public final class BindingChecks {

	/** A binding that cannot be used at all (missing, no type, unknown type): kind "other". */
	static final class BindingProblem extends RuntimeException {

		BindingProblem(String message) {
			super(message);
		}

	}

	/** A Mongo failure whose reason sits in the cluster's server descriptions, not in its cause. */
	static final class MongoServerProblem extends RuntimeException {

		MongoServerProblem(MongoTimeoutException timeout, Throwable serverException) {
			super(timeout.getClass().getName() + ": " + timeout.getMessage(), serverException);
		}

	}

	private final Environment environment;

	private final List<BindingsPropertiesProcessor> processors;

	private final ResourceLoader resourceLoader = ApplicationResourceLoader.get();

	BindingChecks(Environment environment) {
		this.environment = environment;
		// The same list Spring Cloud Bindings' BindingSpecificEnvironmentPostProcessor runs (its
		// RabbitMQ processor is package-private: it is reachable only this way), plus ours.
		this.processors = SpringFactoriesLoader.loadFactories(BindingsPropertiesProcessor.class,
				getClass().getClassLoader());
	}

	public Map<String, Object> check(String name, String token) throws Exception {
		// Bindings() lists $SERVICE_BINDING_ROOT afresh and reads every entry, so a rotated password
		// or CA (the kubelet swaps the projected files) is seen on the next request.
		Binding binding = new Bindings().findBinding(name);
		if (binding == null) {
			throw new BindingProblem("no binding named '" + name + "' under $SERVICE_BINDING_ROOT");
		}
		Map<String, Object> properties = new HashMap<>();
		Bindings one = new Bindings(binding);
		this.processors.forEach((processor) -> processor.process(this.environment, one, properties));
		Binder binder = new Binder(new MapConfigurationPropertySource(properties));
		Map<String, Object> result = new LinkedHashMap<>();
		result.put("binding", name);
		result.put("type", binding.getType());
		switch (binding.getType().toLowerCase()) {
			case "postgresql" -> checkPostgres(binder, token, result);
			case "rabbitmq" -> checkRabbit(binder, token, result);
			case "mongodb" -> checkMongo(binder, token, result);
			default -> throw new BindingProblem("binding '" + name + "' has type '" + binding.getType()
					+ "', which this application does not check");
		}
		return result;
	}

	private void checkPostgres(Binder binder, String token, Map<String, Object> result) throws Exception {
		DataSourceProperties properties = binder.bind("spring.datasource", DataSourceProperties.class)
			.orElseThrow(() -> new BindingProblem("Spring Cloud Bindings gave no spring.datasource properties"));
		properties.setBeanClassLoader(getClass().getClassLoader());
		properties.afterPropertiesSet();
		// The url carries sslmode=verify-full and sslrootcert=<binding folder>/ca.crt: pgJDBC checks
		// the chain against that CA and the host name itself. Unpooled: a new connection each time.
		DataSource dataSource = properties.initializeDataSourceBuilder().type(SimpleDriverDataSource.class).build();
		String got;
		try (Connection connection = dataSource.getConnection()) {
			try (Statement statement = connection.createStatement()) {
				statement.execute("create table if not exists tokens (value text)");
			}
			try (PreparedStatement insert = connection.prepareStatement("insert into tokens (value) values (?)")) {
				insert.setString(1, token);
				insert.executeUpdate();
			}
			try (PreparedStatement select = connection
				.prepareStatement("select value from tokens where value = ? limit 1")) {
				select.setString(1, token);
				try (ResultSet rows = select.executeQuery()) {
					got = rows.next() ? rows.getString(1) : null;
				}
			}
			try (Statement statement = connection.createStatement();
					ResultSet rows = statement.executeQuery(
							"select current_user, ssl from pg_stat_ssl where pid = pg_backend_pid()")) {
				rows.next();
				result.put("user", rows.getString(1));
				result.put("tls", rows.getBoolean(2));
			}
		}
		result.put("token", got);
	}

	private void checkRabbit(Binder binder, String token, Map<String, Object> result) throws Exception {
		RabbitProperties properties = binder.bind("spring.rabbitmq", RabbitProperties.class)
			.orElseThrow(() -> new BindingProblem("Spring Cloud Bindings gave no spring.rabbitmq properties"));
		SslBundles sslBundles = sslBundles(binder);
		RabbitConnectionDetails details = rabbitConnectionDetails(properties, sslBundles);
		SslBundle sslBundle = details.getSslBundle();
		RabbitConnectionFactoryBean factoryBean = new RabbitConnectionFactoryBean() {
			@Override
			protected void setUpSSL() {
				if (sslBundle == null) {
					super.setUpSSL();
					return;
				}
				// What Boot's package-private SslBundleRabbitConnectionFactoryBean does, except that
				// the host name is always verified: Boot 3.5's RabbitConnectionFactoryBeanConfigurer
				// maps spring.rabbitmq.ssl.verify-hostname only when no bundle is used, so with a
				// bundle the host name would go unchecked.
				this.connectionFactory.useSslProtocol(sslBundle.createSslContext());
				this.connectionFactory.enableHostnameVerification();
			}
		};
		new RabbitConnectionFactoryBeanConfigurer(this.resourceLoader, properties, details, sslBundles)
			.configure(factoryBean);
		// configure() set useSSL from the bundle; without one, from spring.rabbitmq.ssl / amqps://.
		factoryBean.afterPropertiesSet();
		com.rabbitmq.client.ConnectionFactory rabbitFactory = factoryBean.getObject();
		CachingConnectionFactory connectionFactory = new CachingConnectionFactory(rabbitFactory);
		new CachingConnectionFactoryConfigurer(properties, details).configure(connectionFactory);
		try {
			String queue = "check-" + token;
			String got = new RabbitTemplate(connectionFactory).execute((channel) -> {
				channel.queueDeclare(queue, false, true, true, null);
				channel.basicPublish("", queue, null, token.getBytes(StandardCharsets.UTF_8));
				long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
				while (true) {
					GetResponse response = channel.basicGet(queue, true);
					if (response != null) {
						return new String(response.getBody(), StandardCharsets.UTF_8);
					}
					if (System.nanoTime() > deadline) {
						return null;
					}
					Thread.sleep(50);
				}
			});
			result.put("user", details.getUsername());
			result.put("tls", rabbitFactory.isSSL());
			result.put("token", got);
		}
		finally {
			connectionFactory.destroy();
		}
	}

	private void checkMongo(Binder binder, String token, Map<String, Object> result) throws Exception {
		MongoProperties properties = binder.bind("spring.data.mongodb", MongoProperties.class)
			.orElseThrow(() -> new BindingProblem("Spring Cloud Bindings gave no spring.data.mongodb properties"));
		PropertiesMongoConnectionDetails details = new PropertiesMongoConnectionDetails(properties,
				sslBundles(binder));
		MongoClientSettingsBuilderCustomizer standard = new StandardMongoClientSettingsBuilderCustomizer(details,
				properties.getUuidRepresentation());
		MongoClientSettingsBuilderCustomizer checks = (target) -> target
			// A TLS failure surfaces only as a server selection time-out (30 s by default).
			.applyToClusterSettings((cluster) -> cluster.serverSelectionTimeout(5, TimeUnit.SECONDS))
			// The driver names the TLS peer with InetSocketAddress.getHostName() (SslHelper
			// .configureSslSocket): for a host given as an IP address that is a reverse DNS
			// look-up, whose cluster name could match the certificate. Keep the host as given.
			.inetAddressResolver(BindingChecks::resolveKeepingName);
		MongoClientSettings.Builder builder = MongoClientSettings.builder();
		standard.customize(builder);
		checks.customize(builder);
		MongoClientSettings settings = builder.build();
		try (MongoClient client = new MongoClientFactory(List.of()).createMongoClient(settings)) {
			try {
				MongoDatabase database = client.getDatabase(properties.getMongoClientDatabase());
				MongoCollection<Document> tokens = database.getCollection("tokens");
				tokens.insertOne(new Document("token", token));
				Document found = tokens.find(new Document("token", token)).first();
				Document status = database.runCommand(new Document("connectionStatus", 1));
				result.put("user", authenticatedUser(status));
				result.put("tls", settings.getSslSettings().isEnabled());
				result.put("token", (found != null) ? found.getString("token") : null);
			}
			catch (MongoTimeoutException ex) {
				for (ServerDescription server : client.getClusterDescription().getServerDescriptions()) {
					if (server.getException() != null) {
						throw new MongoServerProblem(ex, server.getException());
					}
				}
				throw ex;
			}
		}
	}

	private static List<InetAddress> resolveKeepingName(String host) throws UnknownHostException {
		List<InetAddress> addresses = new ArrayList<>();
		for (InetAddress address : InetAddress.getAllByName(host)) {
			addresses.add(InetAddress.getByAddress(host, address.getAddress()));
		}
		return addresses;
	}

	private static String authenticatedUser(Document status) {
		Document authInfo = status.get("authInfo", Document.class);
		if (authInfo != null) {
			List<Document> users = authInfo.getList("authenticatedUsers", Document.class);
			if (users != null && !users.isEmpty()) {
				return users.get(0).getString("user");
			}
		}
		return null;
	}

	/** The bundles that {@link CaBundleBindingsPropertiesProcessor} described, as Boot makes them. */
	private SslBundles sslBundles(Binder binder) {
		DefaultSslBundleRegistry registry = new DefaultSslBundleRegistry();
		binder.bind("spring.ssl", SslProperties.class)
			.ifBound((ssl) -> ssl.getBundle()
				.getPem()
				.forEach((name, pem) -> registry.registerBundle(name, PropertiesSslBundle.get(pem, this.resourceLoader))));
		return registry;
	}

	/**
	 * Boot's PropertiesRabbitConnectionDetails, which is package-private: addresses as
	 * RabbitProperties determines them, and the bundle that spring.rabbitmq.ssl.bundle names.
	 */
	private static RabbitConnectionDetails rabbitConnectionDetails(RabbitProperties properties,
			SslBundles sslBundles) {
		return new RabbitConnectionDetails() {
			@Override
			public String getUsername() {
				return properties.determineUsername();
			}

			@Override
			public String getPassword() {
				return properties.determinePassword();
			}

			@Override
			public String getVirtualHost() {
				return properties.determineVirtualHost();
			}

			@Override
			public List<Address> getAddresses() {
				List<Address> addresses = new ArrayList<>();
				for (String address : properties.determineAddresses()) {
					int colon = address.lastIndexOf(':');
					addresses.add(new Address(address.substring(0, colon),
							Integer.parseInt(address.substring(colon + 1))));
				}
				return addresses;
			}

			@Override
			public SslBundle getSslBundle() {
				RabbitProperties.Ssl ssl = properties.getSsl();
				if (!ssl.determineEnabled() || ssl.getBundle() == null) {
					return null;
				}
				return sslBundles.getBundle(ssl.getBundle());
			}
		};
	}

}
