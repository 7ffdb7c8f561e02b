//! The report: the table of what the run found, printed, and in a whole
//! run written to `BENCHMARKS.md` (anything below its `<!-- notes -->`
//! line kept) with the chart `benchmarks.svg` beside it.

mod chart;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use crate::harness::goal::Goal;
use crate::harness::{narrowed, quick, rounds, CONCURRENCY};
use chart::{chart, CHART};

/// One row of the result table.
pub struct Row {
    id: &'static str,
    backend: &'static str,
    what: String,
    measured: String,
    goal: String,
    met: Option<bool>,
}

impl Row {
    /// A row whose goal is met by `value` (in `unit`), against the
    /// reference's figure where the goal names one.
    pub fn judged(
        (id, backend): (&'static str, &'static str),
        what: String,
        measured: String,
        (goal, unit): (Goal, &str),
        (value, reference): (f64, Option<f64>),
    ) -> Row {
        let met = goal.met(value, reference);
        // A miss that rounds to its goal (0.966 against 0.97) shows its
        // third digit, so that "0.97, >= 0.97, no" never reads as a
        // contradiction.
        let measured = match goal {
            Goal::AtLeast(g) | Goal::AtMost(g) | Goal::Above(g)
                if met == Some(false) && format!("{value:.2}") == format!("{g:.2}") =>
            {
                measured.replacen(&format!("{value:.2}"), &format!("{value:.3}"), 1)
            }
            _ => measured,
        };
        Row {
            id,
            backend,
            what,
            measured,
            goal: goal.text(unit),
            met,
        }
    }
}

/// What the bench found, for the table and the chart.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// B1, bare INSERT: (backend and mode, idem's ratio, the reference's).
    pub b1: Vec<(String, f64, Option<f64>)>,
    /// B7: tasks, and the calls per second of plain, the reference, idem.
    pub b7: Vec<(usize, f64, Option<f64>, f64)>,
}

/// What the report says of the run beside its rows, taken as it starts.
pub struct Run {
    /// Whether the load average fell low enough before the run started.
    quiet: bool,
    started: Instant,
    date: String,
    load_before: String,
}

impl Run {
    pub fn start(quiet: bool) -> Run {
        Run {
            quiet,
            started: Instant::now(),
            date: cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            load_before: load_average(),
        }
    }

    /// Prints the table of `report`; in a whole run, writes it to
    /// `BENCHMARKS.md` with the run's circumstances, and the chart.
    pub fn finish(self, report: &Report) {
        let load_after = load_average();
        let table = table(report);
        println!("{table}");
        if narrowed() {
            eprintln!(
                "IDEM_BENCH_ONLY or IDEM_BENCH_CASES narrowed this run: BENCHMARKS.md is left as it is"
            );
            return;
        }
        self.write(report, &table, &load_after);
    }

    fn write(self, report: &Report, table: &str, load_after: &str) {
        let Run {
            quiet,
            started,
            date,
            load_before,
        } = self;
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("unknown")
            .trim()
            .to_owned();
        let mem = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
            .unwrap_or_default();
        let nproc = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let pg_version = cmd("psql", &["-V"]);
        let my_version = cmd("mariadb", &["--version"]);
        // "mariadb  Ver 15.1 Distrib 10.11.19-MariaDB, for ...": the server release.
        let my_version = my_version
            .split("Distrib ")
            .nth(1)
            .and_then(|v| v.split(',').next())
            .map(|v| format!("MariaDB {v}"))
            .unwrap_or(my_version);
        // "Redis server v=7.0.15 sha=...": the release.
        let redis_version = cmd("redis-server", &["--version"]);
        let redis_version = redis_version
            .split("v=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .map(|v| format!("Redis {v}"))
            .unwrap_or(redis_version);
        let loadavg = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        let notes = std::fs::read_to_string("BENCHMARKS.md")
            .ok()
            .and_then(|old| old.find("<!-- notes -->").map(|i| old[i..].to_owned()))
            .unwrap_or_else(|| "<!-- notes -->\n".to_owned());
        let mut md = String::new();
        let _ = writeln!(md, "# Benchmarks\n");
        let _ = writeln!(
            md,
            "Made by `cargo bench --bench idem --features sqlite,postgres,mysql,redis,testing{}` on {date}, in {:.0} s.\n",
            if quick() { " (IDEM_BENCH_QUICK=1)" } else { "" },
            started.elapsed().as_secs_f64()
        );
        let _ = writeln!(md, "- machine: {nproc} CPUs ({cpu}), {mem} of memory");
        let _ = writeln!(
            md,
            "- servers: {pg_version}; {my_version}; SQLite (bundled with sqlx) on a file in WAL mode; {redis_version}, single and as a cluster of 3 primaries and 3 replicas on this machine"
        );
        let _ = writeln!(
            md,
            "- load average (1, 5, 15 min) before: {}; after: {}{}",
            loadavg(&load_before),
            loadavg(load_after),
            if quiet {
                ""
            } else {
                " (the run waited five minutes for a load of 1.5 or below, in vain: its figures are noisier than usual)"
            }
        );
        let _ = writeln!(
            md,
            "- every ratio is the median of {} per-round ratios, baseline and subject alternating (A B, B A, ...) in one run; throughput with {CONCURRENCY} tasks",
            rounds()
        );
        let pgbench = cmd("pgbench", &["--version"]);
        let _ = writeln!(
            md,
            "- reference: the statements the store sends for the same call, without idem's engine, in the same rounds, as a ratio to the same plain call: on PostgreSQL {pgbench} (`-M prepared -c <tasks> -j 2 -T 1`), and in B1 and B7 also the same statements sent by a sqlx loop on the pool, the client of the plain call and of idem (\"by a sqlx loop\"), on MariaDB and SQLite a sqlx loop on the pool (as long as idem's measurement), which in transactional mode reads the record beside the transaction before the claim, on another connection of the pool, as the store does there, and is measured without that read too (\"without the read beside\"); a body that takes time (B1's 20 ms) waits after the business INSERT there too (pgbench's `\\sleep`); a replay's reference is the one read by key (B2: its latency against the reference's first execution, one client); B3's is the record mode's statements by a sqlx loop on one connection held for the call, as check-then-act holds its own, and transactional mode's B1's, each as a ratio to check-then-act"
        );
        let _ = writeln!(
            md,
            "- Redis and Redis Cluster: the plain call, the baseline of B1 and B6, is the body's own write alone, one `INCRBY` on a key of its own (where the SQL backends' is their business INSERT), so that a ratio shows idem's cost on top of one round trip; record mode only (a Redis body has no transaction to be in); the reference is the scripts the store sends (claim, completion; a replay's read) in a loop through the store's own connection, around the same `INCRBY`\n"
        );
        let chart_written = chart(report, Path::new(CHART));
        match &chart_written {
            Ok(()) => {
                let _ = writeln!(
                    md,
                    "![B7: calls per second against tasks on PostgreSQL, plain, reference and idem; B1: idem's and the reference's ratios to plain calls]({CHART})\n"
                );
            }
            Err(e) => eprintln!("{CHART} not written: {e}"),
        }
        let _ = writeln!(md, "{table}");
        md.push_str(&notes);
        std::fs::write("BENCHMARKS.md", md).unwrap();
    }
}

/// The table of the rows, in Markdown.
fn table(report: &Report) -> String {
    let mut table = String::new();
    let _ = writeln!(table, "| | backend | measurement | measured | goal | met |");
    let _ = writeln!(table, "|---|---|---|---|---|---|");
    for r in &report.rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} |",
            r.id, r.backend, r.what, r.measured, r.goal, met
        );
    }
    table
}

/// `/proc/loadavg`, where there is one.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// The first line of what `program args` prints, or that it is unknown.
fn cmd(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{program}: unknown"))
}
