//! The docker CLI, one bounded call at a time: which container serves a master's URL, and
//! what can be done to it.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Longest any one docker command may take; `docker kill` or `start` take well under a
/// second here, so this only stops a wedged daemon from hanging the run.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The container behind one master's published port.
#[derive(Clone, Debug)]
pub struct Container {
    /// The container's name, e.g. `redlock_redis1_1`.
    pub name: String,
    /// The URL clients use, e.g. `redis://127.0.0.1:7001`.
    pub url: String,
    /// The compose service, if any: reconnecting keeps it as the DNS alias.
    service: String,
    /// The networks it was on when found, to reconnect it to after a disconnect.
    networks: Vec<String>,
}

impl Container {
    /// The one running container that publishes the port of `url` on this machine.
    pub async fn behind(url: &str) -> Result<Container, String> {
        let port = loopback_port(url)?;
        let ids = docker(&["ps", "-q", "--filter", &format!("publish={port}")]).await?;
        let id = match ids.split_whitespace().collect::<Vec<_>>()[..] {
            [id] => id.to_owned(),
            [] => return Err(format!("no running container publishes port {port} ({url})")),
            _ => return Err(format!("several containers publish port {port}: {ids}")),
        };
        let format = "{{.Name}}|{{index .Config.Labels \"com.docker.compose.service\"}}|\
                      {{range $net, $_ := .NetworkSettings.Networks}}{{$net}} {{end}}";
        let inspected = docker(&["inspect", "-f", format, &id]).await?;
        let mut fields = inspected.splitn(3, '|');
        let (Some(name), Some(service), Some(networks)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("unexpected docker inspect output: {inspected}"));
        };
        Ok(Container {
            name: name.trim_start_matches('/').to_owned(),
            url: url.to_owned(),
            service: service.to_owned(),
            networks: networks.split_whitespace().map(str::to_owned).collect(),
        })
    }

    /// Freezes every process in it (the cgroup freezer): connections stay open, nothing
    /// answers.
    pub async fn pause(&self) -> Result<(), String> {
        docker(&["pause", &self.name]).await.map(drop)
    }

    /// Thaws it.
    pub async fn unpause(&self) -> Result<(), String> {
        docker(&["unpause", &self.name]).await.map(drop)
    }

    /// SIGKILL: a crash. Returns once the container has exited, so that the fault is in
    /// force; the restart policy (`unless-stopped`) leaves a killed container down.
    pub async fn kill(&self) -> Result<(), String> {
        docker(&["kill", &self.name]).await?;
        docker(&["wait", &self.name]).await.map(drop)
    }

    /// Starts it again, on the same volume.
    pub async fn start(&self) -> Result<(), String> {
        docker(&["start", &self.name]).await.map(drop)
    }

    /// Takes it off every network it was on: its published port goes away with them.
    pub async fn disconnect(&self) -> Result<(), String> {
        for network in &self.networks {
            docker(&["network", "disconnect", network, &self.name]).await?;
        }
        Ok(())
    }

    /// Puts it back on its networks; the published port comes back.
    pub async fn connect(&self) -> Result<(), String> {
        for network in &self.networks {
            self.connect_to(network).await?;
        }
        Ok(())
    }

    /// Undoes any fault, ignoring what was not in force: the clean-up after a failure.
    pub async fn heal_everything(&self) {
        let _ = self.unpause().await;
        let _ = self.start().await;
        let attached = self.attached_networks().await.unwrap_or_default();
        for network in self.networks.iter().filter(|network| !attached.contains(network)) {
            let _ = self.connect_to(network).await;
        }
    }

    async fn connect_to(&self, network: &str) -> Result<(), String> {
        let mut args = vec!["network", "connect"];
        if !self.service.is_empty() {
            args.extend(["--alias", &self.service]);
        }
        args.extend([network, &self.name]);
        docker(&args).await.map(drop)
    }

    async fn attached_networks(&self) -> Result<Vec<String>, String> {
        let format = "{{range $net, $_ := .NetworkSettings.Networks}}{{$net}} {{end}}";
        let out = docker(&["inspect", "-f", format, &self.name]).await?;
        Ok(out.split_whitespace().map(str::to_owned).collect())
    }
}

/// Runs `docker ARGS`, bounded by [`CALL_TIMEOUT`]; its trimmed stdout, or what went wrong.
async fn docker(args: &[&str]) -> Result<String, String> {
    let shown = format!("docker {}", args.join(" "));
    let mut command = Command::new("docker");
    command.args(args).stdin(Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(CALL_TIMEOUT, command.output())
        .await
        .map_err(|_| format!("{shown}: no answer within {CALL_TIMEOUT:?}"))?
        .map_err(|err| format!("{shown}: {err}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!("{shown}: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// The port of a `redis://host:port[/db]` URL whose host is this machine's loopback: the
/// faults act on local containers, so other hosts cannot be meant.
fn loopback_port(url: &str) -> Result<u16, String> {
    let authority = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|authority| authority.rsplit('@').next())
        .ok_or_else(|| format!("not a redis:// URL: {url}"))?;
    let (host, port) = authority.rsplit_once(':').ok_or_else(|| format!("no port in {url}"))?;
    if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
        return Err(format!("{url}: the faults need containers on this machine's loopback"));
    }
    port.parse().map_err(|_| format!("bad port in {url}"))
}

#[cfg(test)]
mod tests {
    use super::loopback_port;

    #[test]
    fn takes_the_port_of_a_loopback_url() {
        assert_eq!(loopback_port("redis://127.0.0.1:7001"), Ok(7001));
        assert_eq!(loopback_port("redis://localhost:7002/0"), Ok(7002));
        assert_eq!(loopback_port("redis://user:pw@127.0.0.1:7003"), Ok(7003));
    }

    #[test]
    fn refuses_other_hosts_and_schemes() {
        assert!(loopback_port("redis://10.0.0.1:6379").is_err());
        assert!(loopback_port("rediss://127.0.0.1:6379").is_err());
        assert!(loopback_port("redis://127.0.0.1").is_err());
    }
}
