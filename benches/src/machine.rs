//! The machine line printed with every result table.

/// `nproc`, the CPU model from `/proc/cpuinfo` and the Redis version of the node at `url`.
pub fn machine_line(url: &str) -> String {
    let nproc = std::thread::available_parallelism().map_or(0, usize::from);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let redis = redis_version(url).unwrap_or_else(|| "unknown".to_owned());
    format!("nproc {nproc}, {cpu}, redis-server {redis}")
}

fn redis_version(url: &str) -> Option<String> {
    let mut connection = redis::Client::open(url).ok()?.get_connection().ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut connection).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(|version| version.trim().to_owned())
}
