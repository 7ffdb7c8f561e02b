//! The command line: `payments [serve] [OPTIONS]` and `payments demo
//! [OPTIONS]`.

use std::net::SocketAddr;
use std::time::Duration;

use super::app::{self, Config};
use super::demo;
use super::random::new_id;

const USAGE: &str = "\
usage: payments [serve] [OPTIONS]    serve the payments API
       payments demo [OPTIONS]     run a scripted storm of retries and print a table

options:
  --addr ADDR                  listen address (default 127.0.0.1:3000; demo: a free port)
  --database-url URL           sqlite://FILE, postgres://... or mysql://...
                               (default: $DATABASE_URL, else sqlite://payments.db;
                               demo: a SQLite file in a temporary directory)
  --no-http-layer              no idempotency layer: entity mode alone guards the charges
  --idempotency-store URL      keep the layer's records there rather than in the database:
                               redis://HOST:PORT (a Redis) or redis+cluster://HOST:PORT[,...]
                               (a Redis Cluster), keyed under `payments`; needs --features redis.
                               Entity mode stays on the database
  --gateway-latency-ms MS      time a call to the fake card gateway takes; a charge is
                               recorded half way through it (default 50; demo 100)
  --gateway-failure-rate RATE  share of charges that fail transiently, 0 to 1 (default 0; demo 0.1)
  --kafka-brokers HOSTS        relay the outbox's payment.created events to this Kafka cluster
                               (bootstrap servers, HOST:PORT[,...]; default: $KAFKA_BROKERS,
                               else none: the events wait in the outbox); needs --features kafka
  --events-topic TOPIC         the events' topic (default payment.created)
  -h, --help                   this help";

#[derive(Debug, PartialEq)]
enum Command {
    Serve,
    Demo,
    Help,
}

/// The options as given; the defaults depend on the command.
#[derive(Debug, Default)]
struct Options {
    addr: Option<SocketAddr>,
    database_url: Option<String>,
    no_http_layer: bool,
    idempotency_store: Option<String>,
    latency_ms: Option<u64>,
    failure_rate: Option<f64>,
    kafka_brokers: Option<String>,
    events_topic: Option<String>,
}

fn parse(args: Vec<String>) -> Result<(Command, Options), String> {
    let mut command = None;
    let mut options = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs {what}"))
        };
        match name.as_str() {
            "serve" | "demo" if command.is_none() => {
                command = Some(if name == "demo" {
                    Command::Demo
                } else {
                    Command::Serve
                });
            }
            "-h" | "--help" | "help" => return Ok((Command::Help, options)),
            "--addr" => {
                let addr = value("an address such as 127.0.0.1:3000")?;
                options.addr = Some(addr.parse().map_err(|e| format!("--addr {addr}: {e}"))?);
            }
            "--database-url" => options.database_url = Some(value("a URL")?),
            "--no-http-layer" => options.no_http_layer = true,
            "--idempotency-store" => options.idempotency_store = Some(value("a URL")?),
            "--kafka-brokers" => options.kafka_brokers = Some(value("bootstrap servers")?),
            "--events-topic" => options.events_topic = Some(value("a topic")?),
            "--gateway-latency-ms" => {
                let ms = value("a number of milliseconds")?;
                options.latency_ms = Some(
                    ms.parse()
                        .map_err(|e| format!("--gateway-latency-ms {ms}: {e}"))?,
                );
            }
            "--gateway-failure-rate" => {
                let rate = value("a rate between 0 and 1")?;
                let parsed: f64 = rate
                    .parse()
                    .map_err(|e| format!("--gateway-failure-rate {rate}: {e}"))?;
                if !(0.0..=1.0).contains(&parsed) {
                    return Err(format!(
                        "--gateway-failure-rate {rate}: not between 0 and 1"
                    ));
                }
                options.failure_rate = Some(parsed);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok((command.unwrap_or(Command::Serve), options))
}

/// Runs the command line; the answer is the process's exit status.
pub fn main(args: Vec<String>) -> u8 {
    let (command, options) = match parse(args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("payments: {message}\n\n{USAGE}");
            return 2;
        }
    };
    if command == Command::Help {
        println!("{USAGE}");
        return 0;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal; plain text into a file or
        // a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("payments: cannot start the runtime: {err}");
            return 1;
        }
    };
    match command {
        Command::Demo => runtime.block_on(demo_command(options)),
        _ => runtime.block_on(serve(options)),
    }
}

async fn serve(options: Options) -> u8 {
    let defaults = Config::default();
    let config = Config {
        addr: options.addr.unwrap_or(defaults.addr),
        database_url: options
            .database_url
            .or_else(|| std::env::var("DATABASE_URL").ok())
            .unwrap_or(defaults.database_url),
        http_layer: !options.no_http_layer,
        idempotency_store: options.idempotency_store,
        gateway_latency: options
            .latency_ms
            .map_or(defaults.gateway_latency, Duration::from_millis),
        gateway_failure_rate: options
            .failure_rate
            .unwrap_or(defaults.gateway_failure_rate),
        events_topic: options.events_topic.unwrap_or(defaults.events_topic),
        kafka_brokers: options
            .kafka_brokers
            .or_else(|| std::env::var("KAFKA_BROKERS").ok()),
    };
    let server = match app::start(&config).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("payments: {err}");
            return 1;
        }
    };
    println!("{}", banner(&config, &server));
    let url = server.url();
    tokio::select! {
        served = server.wait() => {
            if let Err(err) = served {
                eprintln!("payments: {err}");
                return 1;
            }
        }
        _ = tokio::signal::ctrl_c() => println!("payments: stopped ({url})"),
    }
    0
}

fn banner(config: &Config, server: &app::Server) -> String {
    let url = server.url();
    let layer = if config.http_layer {
        "idempotency layer on"
    } else {
        "no idempotency layer: entity mode alone"
    };
    format!(
        "payments: listening on {url} ({db}; {layer}; gateway latency {latency} ms, failure rate {rate})

Create a payment. Send the same command again: the answer is the first one,
replayed (Idempotent-Replayed: true), and the card is charged once.

  curl -i {url}/payments \\
    -H 'Content-Type: application/json' \\
    -H 'Idempotency-Key: {key}' \\
    -d '{{\"amount\": 2500, \"currency\": \"EUR\", \"card\": \"4242424242424242\", \"description\": \"Coffee beans\"}}'

The gateway's ledger, one charge per key:  curl {url}/gateway/charges
Each payment stored writes its {topic} event to the outbox: {events}.
Press Ctrl-C to stop.",
        db = server.app.db.description,
        latency = config.gateway_latency.as_millis(),
        rate = config.gateway_failure_rate,
        key = new_id("order"),
        topic = config.events_topic,
        events = server.events,
    )
}

async fn demo_command(options: Options) -> u8 {
    // A database of its own unless one is named, removed at the end.
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => {
            eprintln!("payments demo: cannot make a temporary directory: {err}");
            return 1;
        }
    };
    let database_url = options
        .database_url
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("demo.db").display()));
    let config = Config {
        addr: options
            .addr
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        database_url,
        http_layer: !options.no_http_layer,
        idempotency_store: options.idempotency_store,
        gateway_latency: Duration::from_millis(options.latency_ms.unwrap_or(100)),
        gateway_failure_rate: options.failure_rate.unwrap_or(0.1),
        events_topic: options
            .events_topic
            .unwrap_or_else(|| Config::default().events_topic),
        kafka_brokers: options.kafka_brokers,
    };
    demo::run(&config).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_options() {
        let (command, options) = parse(args(&[
            "demo",
            "--addr=127.0.0.1:0",
            "--gateway-latency-ms",
            "5",
            "--no-http-layer",
        ]))
        .unwrap();
        assert_eq!(command, Command::Demo);
        assert_eq!(options.addr, Some(SocketAddr::from(([127, 0, 0, 1], 0))));
        assert_eq!(options.latency_ms, Some(5));
        assert!(options.no_http_layer);
        let (_, options) = parse(args(&["--idempotency-store", "redis://127.0.0.1:6379"])).unwrap();
        assert_eq!(
            options.idempotency_store.as_deref(),
            Some("redis://127.0.0.1:6379")
        );
        assert!(parse(args(&["--idempotency-store"])).is_err());
        let (_, options) = parse(args(&[
            "--kafka-brokers=127.0.0.1:9092",
            "--events-topic",
            "payments.v1",
        ]))
        .unwrap();
        assert_eq!(options.kafka_brokers.as_deref(), Some("127.0.0.1:9092"));
        assert_eq!(options.events_topic.as_deref(), Some("payments.v1"));
        assert!(parse(args(&["--kafka-brokers"])).is_err());
        assert_eq!(parse(args(&[])).unwrap().0, Command::Serve);
        assert!(parse(args(&["--gateway-failure-rate", "2"])).is_err());
        assert!(parse(args(&["--bogus"])).is_err());
        assert!(parse(args(&["--addr"])).is_err());
    }
}
