//! Measuring: calls per second, and measures run side by side in rounds
//! whose order alternates, reported as the median of per-round ratios.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::{FutureExt, LocalBoxFuture};

use super::{rounds, CONCURRENCY};

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// How long a throughput measurement runs.
#[derive(Clone, Copy)]
pub enum Span {
    /// This many calls in all.
    Calls(usize),
    /// New calls start until this much time has passed.
    For(Duration),
}

/// Calls per second of `op` run by `tasks` tasks for `span`.
pub async fn throughput_of<F, Fut>(tasks: usize, span: Span, op: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut calls = 0;
                while match span {
                    Span::Calls(all) => calls < all / tasks,
                    Span::For(window) => start.elapsed() < window,
                } {
                    op().await;
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let mut calls = 0;
    for h in handles {
        calls += h.await.unwrap();
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

/// Operations per second of `ops` calls of `op` spread over
/// `CONCURRENCY` tasks.
pub async fn throughput<F, Fut>(ops: usize, op: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    throughput_of(CONCURRENCY, Span::Calls(ops), op).await
}

/// One measurement of an interleaved comparison.
pub type Measure<'a> = Box<dyn Fn() -> LocalBoxFuture<'a, f64> + 'a>;

pub fn measure<'a, F, Fut>(f: F) -> Measure<'a>
where
    F: Fn() -> Fut + 'a,
    Fut: Future<Output = f64> + 'a,
{
    Box::new(move || f().boxed_local())
}

/// Runs the measures in rounds, in an order that alternates (A B C, then
/// C B A); answers, for each, the median of its per-round ratios to the
/// first measure (the baseline) and its own median.
pub async fn interleave_all(measures: &[Measure<'_>]) -> Vec<(f64, f64)> {
    let mut values = vec![Vec::new(); measures.len()];
    for round in 0..rounds() {
        let mut order: Vec<usize> = (0..measures.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            values[i].push(measures[i]().await);
        }
    }
    let base = values[0].clone();
    values
        .into_iter()
        .map(|v| {
            let ratios = v.iter().zip(&base).map(|(s, b)| s / b).collect();
            (median(ratios), median(v))
        })
        .collect()
}

/// Median over rounds of subject / baseline, alternating which runs first.
/// Also answers the medians of both.
pub async fn interleave<A, B, FA, FB>(baseline: A, subject: B) -> (f64, f64, f64)
where
    A: Fn() -> FA,
    B: Fn() -> FB,
    FA: Future<Output = f64>,
    FB: Future<Output = f64>,
{
    let both = interleave_all(&[measure(baseline), measure(subject)]).await;
    (both[1].0, both[0].1, both[1].1)
}
