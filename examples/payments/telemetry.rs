//! `GET /metrics`: the library's counters in the Prometheus text format.
//!
//! The library emits through the `metrics` facade (`idem::metrics` lists
//! the names); a Prometheus recorder installed once per process collects
//! them, and the route renders it.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The process's recorder, installed on first use. If the host process
/// already has a global recorder, the handle renders nothing.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(idem::metrics::REPLAY_LATENCY.to_owned()),
                    &[
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    ],
                )
                .expect("the bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_ok() {
                let upkeep = handle.clone();
                // Histograms are drained into the rendering by upkeep.
                std::thread::spawn(move || loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                });
            }
            handle
        })
        .clone()
}
