//! What a node's refusal of this client itself says, in one line that names the cause and
//! what to change: a login refused, a certificate refused by the TLS handshake, or a port
//! where something other than Redis answers. Never a password.

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Value};

use crate::failure::Failure;

/// Where credentials go, for every login refusal.
const CREDENTIALS: &str = "credentials go in the node URL (`redis://user:password@host:port`), \
                           or in the URL of `REDLOCK_NODES` for the redlock command";

/// A node that requires a login answered a connection that gave none.
pub(crate) const NOAUTH: &str = "NOAUTH the node requires a password and the URL gives none: \
                                 credentials go in the node URL \
                                 (`redis://user:password@host:port`), or in the URL of \
                                 `REDLOCK_NODES` for the redlock command";

/// The refused login's own words: redis-rs reports every refused `AUTH` as "Password
/// authentication failed", so the node is asked once more, on a connection that does not
/// log in, what it says to the same `AUTH`. Only after a refusal: it costs a connect.
pub(crate) async fn login(client: &Client, config: &AsyncConnectionConfig) -> Failure {
    let info = client.get_connection_info();
    let settings = info.redis_settings();
    let (user, password) = (settings.username().map(str::to_owned), settings.password());
    let said = match password {
        Some(password) => ask(info.clone(), config, user.as_deref(), password).await,
        None => None,
    };
    let said = said.map(|said| match password {
        // A server that echoes what it was sent must not print the password.
        Some(password) if !password.is_empty() => said.replace(password, "***"),
        _ => said,
    });
    Failure::Denied(explain_login(user.as_deref(), said.as_deref()).into())
}

/// What the node says to `AUTH [user] password` sent on a connection opened without it.
async fn ask(
    info: redis::ConnectionInfo,
    config: &AsyncConnectionConfig,
    user: Option<&str>,
    password: &str,
) -> Option<String> {
    let anonymous = redis::RedisConnectionInfo::default()
        .set_protocol(info.redis_settings().protocol())
        .set_skip_set_lib_name();
    let client = Client::open(info.set_redis_settings(anonymous)).ok()?;
    let mut connection: MultiplexedConnection =
        client.get_multiplexed_async_connection_with_config(config).await.ok()?;
    let mut auth = redis::cmd("AUTH");
    if let Some(user) = user {
        auth.arg(user);
    }
    auth.arg(password);
    match connection.send_packed_command(&auth).await {
        Ok(Value::ServerError(err)) => Some(RedisError::from(err).to_string()),
        Err(err) => Some(err.to_string()),
        Ok(_) => None,
    }
}

/// The line for a login the node refused, from what it said to the `AUTH` (if it could be
/// asked).
fn explain_login(user: Option<&str>, said: Option<&str>) -> String {
    let said_line = said.map(|said| format!(" (the node said: {})", first_line(said)));
    let said_line = said_line.as_deref().unwrap_or("");
    match said {
        Some(said) if said.contains("without any password configured") => format!(
            "the URL gives a password but the node has none configured for {}: remove the \
             password from the URL, or set one on the node (`requirepass`, or an ACL user){said_line}",
            user.map_or_else(|| "the default user".to_owned(), |user| format!("user `{user}`"))
        ),
        _ => format!(
            "WRONGPASS the node refused the login{}: wrong user name or password, or the user is \
             disabled or unknown; {CREDENTIALS}{said_line}",
            user.map(|user| format!(" of user `{user}`")).unwrap_or_default()
        ),
    }
}

/// A certificate refused by the TLS handshake, either way: the node's, not trusted here,
/// or this client's, missing or not trusted by the node.
pub(crate) fn certificate(err: &RedisError) -> Option<Failure> {
    let text = err.to_string();
    let lower = text.to_ascii_lowercase();
    if !lower.contains("certificate") {
        return None;
    }
    Some(Failure::Denied(
        format!(
            "the TLS handshake refused a certificate: {}; trust the nodes' CA with \
             `tls_root_ca` (`REDLOCK_TLS_CA`), give a client certificate the nodes trust with \
             `tls_client_cert` (`REDLOCK_TLS_CERT`, `REDLOCK_TLS_KEY`)",
            first_line(&text)
        )
        .into(),
    ))
}

/// A reply that is not the Redis protocol at all: something else listens on the port.
pub(crate) fn not_redis(err: &RedisError) -> Option<Failure> {
    (err.kind() == redis::ErrorKind::Parse).then(|| {
        Failure::Unreachable(
            format!(
                "not a Redis server: what answered on that port does not speak the Redis \
                 protocol (an HTTP server, a proxy's admin port?): {}",
                first_line(&err.to_string())
            )
            .into(),
        )
    })
}

/// The first line of a message, at most 200 characters: a server's or parser's text can
/// run over many lines.
fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(200) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_refusal_names_the_cause_and_where_credentials_go() {
        let wrong = explain_login(Some("locker"), Some("WRONGPASS invalid username-password pair"));
        assert!(wrong.starts_with("WRONGPASS"), "{wrong}");
        assert!(wrong.contains("user `locker`") && wrong.contains("redis://user:password@"));
        let none = explain_login(
            None,
            Some("ERR AUTH <password> called without any password configured for the default user"),
        );
        assert!(none.contains("has none configured for the default user"), "{none}");
        assert!(none.contains("remove the password from the URL"), "{none}");
        assert!(explain_login(None, None).starts_with("WRONGPASS"));
    }

    #[test]
    fn a_long_message_is_cut_to_its_first_line() {
        assert_eq!(first_line("one\ntwo"), "one");
        assert_eq!(first_line(&"é".repeat(300)).chars().count(), 200);
    }
}
