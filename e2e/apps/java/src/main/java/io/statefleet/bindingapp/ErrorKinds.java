package io.statefleet.bindingapp;

import java.security.cert.CertPathBuilderException;
import java.security.cert.CertPathValidatorException;
import java.security.cert.CertificateException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;

import com.mongodb.MongoSecurityException;
import com.rabbitmq.client.AuthenticationFailureException;
import com.rabbitmq.client.PossibleAuthenticationFailureException;
import org.postgresql.util.PSQLException;

import org.springframework.amqp.AmqpAuthenticationException;

/** The "error" and "kind" of a failed check, from the drivers' exception types and codes. */
final class ErrorKinds {

	private ErrorKinds() {
	}

	static List<Throwable> chain(Throwable error) {
		List<Throwable> chain = new ArrayList<>();
		Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());
		for (Throwable t = error; t != null && seen.add(t); t = t.getCause()) {
			chain.add(t);
		}
		return chain;
	}

	static String describe(Throwable error) {
		return chain(error).stream()
			.map((t) -> (t instanceof BindingChecks.MongoServerProblem) ? t.getMessage()
					: t.getClass().getName() + ": " + t.getMessage())
			.collect(Collectors.joining(" <- "));
	}

	static String kind(Throwable error) {
		List<Throwable> chain = chain(error);
		// The certificate first: a chain the CA does not sign fails before any name is looked at.
		for (Throwable t : chain) {
			if (t instanceof CertPathBuilderException || t instanceof CertPathValidatorException) {
				return "certificate"; // PKIX: no path from the server's certificate to the binding's CA
			}
		}
		for (Throwable t : chain) {
			if (isHostnameMismatch(t)) {
				return "name";
			}
		}
		for (Throwable t : chain) {
			if (t instanceof PSQLException psql && psql.getSQLState() != null
					&& (psql.getSQLState().equals("28P01") || psql.getSQLState().equals("28000"))) {
				return "auth"; // invalid_password, invalid_authorization_specification
			}
			if (t instanceof AuthenticationFailureException || t instanceof PossibleAuthenticationFailureException
					|| t instanceof AmqpAuthenticationException || t instanceof MongoSecurityException) {
				return "auth";
			}
		}
		return "other";
	}

	private static boolean isHostnameMismatch(Throwable t) {
		StackTraceElement[] stack = t.getStackTrace();
		String thrower = (stack.length > 0) ? stack[0].getClassName() + "." + stack[0].getMethodName() : "";
		if (t instanceof PSQLException) {
			// pgJDBC's own check after the handshake (MakeSSL.verifyPeerName): a CONNECTION_FAILURE
			// (08006) like any other, told apart only by where it was thrown (its message is translated).
			return thrower.equals("org.postgresql.ssl.MakeSSL.verifyPeerName");
		}
		if (t instanceof CertificateException) {
			// The JDK's endpoint identification (X509TrustManagerImpl.checkIdentity) throws a plain
			// CertificateException from its HostnameChecker: no subtype tells it apart.
			return thrower.startsWith("sun.security.util.HostnameChecker.")
					|| String.valueOf(t.getMessage()).startsWith("No subject alternative")
					|| String.valueOf(t.getMessage()).startsWith("No name matching");
		}
		return false;
	}

}
