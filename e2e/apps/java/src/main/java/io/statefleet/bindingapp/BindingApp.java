package io.statefleet.bindingapp;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.SpringBootConfiguration;
import org.springframework.context.annotation.Bean;
import org.springframework.core.env.Environment;

/**
 * The servicebinding.io test application: GET /check/&lt;binding&gt; connects anew through the
 * binding's folder, as Spring Cloud Bindings maps it to Spring Boot's properties.
 *
 * No auto-configuration on purpose: the clients are made per request from ONE binding's properties
 * (see {@link BindingChecks}); Spring Cloud Bindings' own EnvironmentPostProcessor still runs (it is
 * registered in its spring.factories, not as an auto-configuration) and maps every binding at start.
 */
@SpringBootConfiguration(proxyBeanMethods = false)
public class BindingApp {

	public static void main(String[] args) {
		SpringApplication.run(BindingApp.class, args);
	}

	@Bean
	BindingChecks bindingChecks(Environment environment) {
		return new BindingChecks(environment);
	}

	@Bean
	CheckServer checkServer(BindingChecks checks, Environment environment) {
		return new CheckServer(checks, environment.getProperty("server.port", Integer.class, 8080));
	}

}
