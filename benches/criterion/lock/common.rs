//! Shared by the benchmark modules.

use std::time::Duration;

use criterion::BenchmarkGroup;
use criterion::measurement::Measurement;
use redlock_benches::{Client, Impl, Settings};

/// Short enough for the whole suite to finish in a few minutes on a 2-core machine.
pub fn short<M: Measurement>(group: &mut BenchmarkGroup<'_, M>) {
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
}

/// A connected client of `imp`, or `None` (with a message) when it cannot connect.
pub fn client(runtime: &tokio::runtime::Runtime, imp: Impl, urls: &[String]) -> Option<Client> {
    match runtime.block_on(Client::connect(imp, urls, Settings::default())) {
        Ok(client) => Some(client),
        Err(err) => {
            eprintln!("{imp}: skipped, cannot connect: {err}");
            None
        }
    }
}
