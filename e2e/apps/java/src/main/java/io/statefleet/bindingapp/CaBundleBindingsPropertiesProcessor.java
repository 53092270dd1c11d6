package io.statefleet.bindingapp;

import java.util.Map;

import org.springframework.cloud.bindings.Binding;
import org.springframework.cloud.bindings.Bindings;
import org.springframework.cloud.bindings.boot.BindingsPropertiesProcessor;
import org.springframework.core.env.Environment;

/**
 * Makes a RabbitMQ or MongoDB binding's {@code ca.crt} an SSL bundle named after the binding and
 * points the client at it. Spring Cloud Bindings 2.0.4 maps no CA for these two types
 * (RabbitMqBindingsPropertiesProcessor, MongoDbBindingsPropertiesProcessor), so without this the
 * server would be checked against the JVM's public CAs and the statefleet CA refused.
 * PostgreSQL needs none: its processor puts sslrootcert (a file in the binding) into the JDBC URL.
 */
public final class CaBundleBindingsPropertiesProcessor implements BindingsPropertiesProcessor {

	static final String CA = "ca.crt";

	@Override
	public void process(Environment environment, Bindings bindings, Map<String, Object> properties) {
		for (Binding binding : bindings.getBindings()) {
			if (!binding.getSecret().containsKey(CA)) {
				continue;
			}
			String prefix;
			switch (binding.getType().toLowerCase()) {
				case "rabbitmq" -> prefix = "spring.rabbitmq.ssl.";
				case "mongodb" -> {
					prefix = "spring.data.mongodb.ssl.";
					// Boot's Mongo SSL is off unless enabled (a bundle alone does not turn it on).
					properties.put(prefix + "enabled", "true");
				}
				default -> {
					continue;
				}
			}
			// Brackets: a binding's name may hold dots, which would split the property name.
			String bundle = "binding-" + binding.getName();
			properties.put("spring.ssl.bundle.pem[" + bundle + "].truststore.certificate",
					binding.getSecretFilePath(CA).toString());
			properties.put(prefix + "bundle", bundle);
		}
	}

}
