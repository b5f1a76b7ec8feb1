//! Nodes whose client logs in as an ACL user with a chosen set of rules, for the tests of
//! what each rule allows (the parallel ones in `it`, and those that read the log in
//! `process`).

use std::time::Duration;

use redlock::{Redlock, RedlockBuilder, Retry};
use redlock_testkit::Cluster;

use super::{MINIMAL_ACL, cluster};

/// The password of every ACL user made here.
pub const PASSWORD: &str = "acl-pass";

/// [`MINIMAL_ACL`] with `drop` left out and `add` added.
pub fn rules(drop: &[&str], add: &[&'static str]) -> Vec<&'static str> {
    let mut rules: Vec<&str> =
        MINIMAL_ACL.iter().copied().filter(|rule| !drop.contains(rule)).collect();
    rules.extend_from_slice(add);
    rules
}

/// Three nodes with the ACL user `name` and a builder connecting as it (prefix `app:`,
/// 500 ms node timeout, one attempt).
pub fn cluster_as(name: &str, rules: &[&str]) -> (Cluster, RedlockBuilder) {
    let cluster = cluster(3);
    let builder = builder_as(&cluster, name, rules);
    (cluster, builder)
}

/// [`cluster_as`] on nodes already started.
pub fn builder_as(cluster: &Cluster, name: &str, rules: &[&str]) -> RedlockBuilder {
    for node in cluster.nodes() {
        node.acl_setuser(name, PASSWORD, rules).unwrap();
    }
    let urls: Vec<String> =
        cluster.nodes().iter().map(|node| node.url_as(name, PASSWORD)).collect();
    Redlock::builder()
        .nodes(urls)
        .key_prefix("app:")
        .node_timeout(Duration::from_millis(500))
        .retry(Retry::never())
}
