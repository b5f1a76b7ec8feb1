//! Nodes with a password and ACL users.

use redlock_testkit::{Cluster, FaultyCluster, NodeConfig, RedisNode};

const PASSWORD: &str = "p@ss:w/rd";

fn get(client: &redis::Client, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query(&mut client.get_connection()?)
}

#[test]
fn a_node_with_a_password_refuses_anonymous_clients_and_the_testkit_authenticates() {
    let node = RedisNode::start_with(NodeConfig::new().requirepass(PASSWORD)).unwrap();
    assert_eq!(node.url(), format!("redis://:p%40ss%3Aw%2Frd@127.0.0.1:{}", node.port()));
    assert!(!format!("{node:?}").contains(PASSWORD), "the password is not printed");

    let anonymous = redis::Client::open(format!("redis://127.0.0.1:{}", node.port())).unwrap();
    let err = get(&anonymous, "k").unwrap_err();
    assert_eq!(err.code(), Some("NOAUTH"), "{err}");
    let wrong = redis::Client::open(format!("redis://:wrong@127.0.0.1:{}", node.port())).unwrap();
    assert!(get(&wrong, "k").is_err());

    // The node's URL carries the password; the testkit's own reads use it.
    let client = redis::Client::open(node.url()).unwrap();
    let () =
        redis::cmd("SET").arg("k").arg("v").query(&mut client.get_connection().unwrap()).unwrap();
    assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));

    // Restarts, clusters and proxies keep the password.
    let mut cluster =
        FaultyCluster::start_with(2, NodeConfig::new().requirepass(PASSWORD)).unwrap();
    let through_proxy = redis::Client::open(cluster.urls()[1].as_str()).unwrap();
    assert_eq!(get(&through_proxy, "k").unwrap(), None);
    cluster.cluster_mut().node_mut(1).restart().unwrap();
    cluster.cluster().node(1).set("k", "v").unwrap();
    assert_eq!(cluster.cluster().nodes_with_key("k").unwrap(), [1]);
}

#[test]
fn an_acl_user_can_run_exactly_its_commands_on_its_keys() {
    let node = RedisNode::start().unwrap();
    node.acl_setuser("app", "s3cret", &["~app:*", "+get", "+set"]).unwrap();
    assert_eq!(
        node.url_as("app", "s3cret"),
        format!("redis://app:s3cret@127.0.0.1:{}", node.port())
    );
    let app = node.client_as("app", "s3cret").unwrap();
    let mut con = app.get_connection().unwrap();

    let () = redis::cmd("SET").arg("app:1").arg("v").query(&mut con).unwrap();
    let got: String = redis::cmd("GET").arg("app:1").query(&mut con).unwrap();
    assert_eq!(got, "v");
    let other_key = redis::cmd("SET").arg("other:1").arg("v").query::<()>(&mut con).unwrap_err();
    assert_eq!(other_key.code(), Some("NOPERM"), "{other_key}");
    let other_command = redis::cmd("DEL").arg("app:1").query::<()>(&mut con).unwrap_err();
    assert_eq!(other_command.code(), Some("NOPERM"), "{other_command}");
    assert!(!node.exists("other:1").unwrap() && node.exists("app:1").unwrap());

    // A wrong password is refused; replacing the user resets its rules.
    assert!(node.client_as("app", "wrong").unwrap().get_connection().is_err());
    node.acl_setuser("app", "s3cret", &["~app:*", "+del"]).unwrap();
    let mut con = node.client_as("app", "s3cret").unwrap().get_connection().unwrap();
    assert!(redis::cmd("GET").arg("app:1").query::<Option<String>>(&mut con).is_err());
    let deleted: i64 = redis::cmd("DEL").arg("app:1").query(&mut con).unwrap();
    assert_eq!(deleted, 1);
}

#[test]
fn a_cluster_of_password_nodes_is_inspected_with_the_password() {
    let cluster = Cluster::start_with(3, NodeConfig::new().requirepass(PASSWORD)).unwrap();
    cluster.node(2).command(&["HSET", "h", "f", "1"]).unwrap();
    assert_eq!(cluster.nodes_with_key("h").unwrap(), [2]);
    assert_eq!(cluster.hash_fields("h").unwrap()[2].as_ref().unwrap()["f"], "1");
}
