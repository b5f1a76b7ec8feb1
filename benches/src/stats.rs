//! Latency samples and their percentiles.

use std::time::Duration;

/// Latencies of successful operations, plus the number of failed ones.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// One entry per successful operation.
    pub latencies: Vec<Duration>,
    /// Operations that returned an error.
    pub errors: usize,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
    /// Successful operations over the time spent measuring (throughput batches).
    pub ops: u64,
    /// Time spent in throughput batches.
    pub busy: Duration,
    /// Acquisition attempts of ours that were not granted (handoff batches).
    pub failed_attempts: u64,
    /// CPU time of this process (every thread) during the batches.
    pub cpu: Duration,
}

impl Samples {
    /// Adds another batch's samples.
    pub fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.ops += other.ops;
        self.busy += other.busy;
        self.failed_attempts += other.failed_attempts;
        self.cpu += other.cpu;
    }

    /// Records one operation's outcome.
    pub fn record(&mut self, latency: Duration, result: Result<(), String>) {
        match result {
            Ok(()) => self.latencies.push(latency),
            Err(err) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(err);
                }
            }
        }
    }

    /// The `q` quantile (0..=1) of the latencies, nearest rank; `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let rank = (q * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    /// The median.
    pub fn p50(&self) -> Option<Duration> {
        self.quantile(0.50)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Option<Duration> {
        self.quantile(0.99)
    }

    /// This process's CPU time per successful operation.
    pub fn cpu_per_op(&self) -> Option<Duration> {
        let ops = u32::try_from(self.latencies.len()).ok().filter(|&n| n > 0)?;
        (!self.cpu.is_zero()).then(|| self.cpu / ops)
    }

    /// Successful operations per second over the throughput batches, if any ran.
    pub fn throughput(&self) -> Option<f64> {
        (!self.busy.is_zero()).then(|| self.ops as f64 / self.busy.as_secs_f64())
    }
}

/// A latency in the unit that reads best: µs below 10 ms (with a decimal below 100 µs),
/// ms above.
pub fn fmt_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 100.0 {
        format!("{us:.1} µs")
    } else if us < 10_000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

/// The CPU time this process (all its threads) has used so far.
pub fn process_cpu() -> Duration {
    cpu_time::ProcessTime::try_now().map_or(Duration::ZERO, |t| t.as_duration())
}
