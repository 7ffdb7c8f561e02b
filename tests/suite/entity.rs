//! Entity mode (the domain-model token pattern) and upserts.
//!
//! The business table carries the UNIQUE idempotency token; there is no
//! records table. Each case runs on SQLite, PostgreSQL and MariaDB, each in
//! a namespace of its own (a database file, a schema, a database) that is
//! dropped when the case ends:
//!
//! - a token found is returned as stored, without running the body;
//! - a token reused with another payload is `KeyReused` when the table has
//!   a request-hash column, and returns the existing row when it has none;
//! - a body error stores nothing, and the retry runs;
//! - storms of concurrent first calls over a few tokens run each body once
//!   (the runs are counted), store one row per token, and every caller gets
//!   that row; upsert storms leave one row per key;
//! - a call dropped while it holds the token's claim hands it back: another
//!   pool, like another process, runs the token next;
//! - a killed connection never lets a retry run the body again, and a
//!   failed insert is retried before anything is handed back;
//! - a scope with a principal is refused, since rows are found by token
//!   alone.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Barrier;

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("gateway unavailable")]
    Unavailable,
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

#[derive(Debug, Clone, Serialize)]
pub struct Charge {
    pub token: String,
    pub amount: i64,
}

pub fn charge(token: &str, amount: i64) -> Charge {
    Charge {
        token: token.to_owned(),
        amount,
    }
}

/// A payment: the token and the payload's fingerprint live in the row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "payments")]
pub struct Payment {
    #[idem(generated)]
    pub id: i64,
    #[idem(token, column = "idempotency_token")]
    #[sqlx(rename = "idempotency_token")]
    pub token: String,
    pub amount: i64,
    pub charge: i64,
    #[idem(request_hash)]
    pub request_hash: Option<String>,
}

/// An order: a token, but no request-hash column.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "orders")]
pub struct Order {
    #[idem(generated)]
    pub id: i64,
    #[idem(token)]
    pub token: String,
    pub amount: i64,
    pub charge: i64,
}

/// One subscription per user: the natural key of the upserts.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "subscriptions")]
pub struct Subscription {
    pub user_id: i64,
    pub plan: String,
    pub seats: i64,
}

/// A user in a team: every column is part of the key.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "memberships")]
pub struct Membership {
    pub user_id: i64,
    pub team_id: i64,
}

/// The card gateway: counts its runs per token, and can fail or stall.
#[derive(Default)]
pub struct Gateway {
    runs: Mutex<HashMap<String, usize>>,
    pub fail_next: AtomicBool,
    pub stall: AtomicBool,
    pub delay: Mutex<Duration>,
}

impl Gateway {
    pub async fn charge(&self, token: &str) -> Result<i64, PayError> {
        let run = {
            let mut runs = self.runs.lock().unwrap();
            let n = runs.entry(token.to_owned()).or_default();
            *n += 1;
            runs.values().sum::<usize>() as i64
        };
        let delay = *self.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if self.stall.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(PayError::Unavailable);
        }
        Ok(run)
    }

    pub fn runs(&self, token: &str) -> usize {
        self.runs.lock().unwrap().get(token).copied().unwrap_or(0)
    }

    pub fn total_runs(&self) -> usize {
        self.runs.lock().unwrap().values().sum()
    }
}

/// The tables of the cases, in each backend's SQL.
fn tables(backend: &str) -> &'static str {
    match backend {
        "sqlite_file" => SQLITE_TABLES,
        "postgres" => POSTGRES_TABLES,
        "mysql" => MYSQL_TABLES,
        other => panic!("no tables for {other}"),
    }
}

const SQLITE_TABLES: &str = "
    CREATE TABLE payments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_token TEXT NOT NULL UNIQUE,
        amount INTEGER NOT NULL,
        charge INTEGER NOT NULL,
        request_hash TEXT
    );
    CREATE TABLE orders (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        token TEXT NOT NULL UNIQUE,
        amount INTEGER NOT NULL,
        charge INTEGER NOT NULL
    );
    CREATE TABLE subscriptions (
        user_id INTEGER PRIMARY KEY,
        plan TEXT NOT NULL,
        seats INTEGER NOT NULL
    );
    CREATE TABLE memberships (
        user_id INTEGER NOT NULL,
        team_id INTEGER NOT NULL,
        PRIMARY KEY (user_id, team_id)
    );
";

const POSTGRES_TABLES: &str = "
    CREATE TABLE payments (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        idempotency_token TEXT NOT NULL UNIQUE,
        amount BIGINT NOT NULL,
        charge BIGINT NOT NULL,
        request_hash TEXT
    );
    CREATE TABLE orders (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        token TEXT NOT NULL UNIQUE,
        amount BIGINT NOT NULL,
        charge BIGINT NOT NULL
    );
    CREATE TABLE subscriptions (
        user_id BIGINT PRIMARY KEY,
        plan TEXT NOT NULL,
        seats BIGINT NOT NULL
    );
    CREATE TABLE memberships (
        user_id BIGINT NOT NULL,
        team_id BIGINT NOT NULL,
        PRIMARY KEY (user_id, team_id)
    );
";

// The default, case-insensitive collation: sqlx 0.8 does not decode a
// `_bin` column into a `String`.
const MYSQL_TABLES: &str = "
    CREATE TABLE payments (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        idempotency_token VARCHAR(255) CHARACTER SET ascii NOT NULL UNIQUE,
        amount BIGINT NOT NULL,
        charge BIGINT NOT NULL,
        request_hash CHAR(64) CHARACTER SET ascii
    ) ENGINE = InnoDB;
    CREATE TABLE orders (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        token VARCHAR(255) CHARACTER SET ascii NOT NULL UNIQUE,
        amount BIGINT NOT NULL,
        charge BIGINT NOT NULL
    ) ENGINE = InnoDB;
    CREATE TABLE subscriptions (
        user_id BIGINT PRIMARY KEY,
        plan VARCHAR(64) NOT NULL,
        seats BIGINT NOT NULL
    ) ENGINE = InnoDB;
    CREATE TABLE memberships (
        user_id BIGINT NOT NULL,
        team_id BIGINT NOT NULL,
        PRIMARY KEY (user_id, team_id)
    ) ENGINE = InnoDB;
";

// Each case in a namespace of its own: a database file, a schema, a
// database, dropped when the case ends.
common::backends!(sqlite_file, postgres, mysql => {
    use common::namespace::Namespace;
    use idem::{idempotent, Key};

    type Pool = sqlx::Pool<backend::Database>;

    /// A namespace of the case's own, with the tables.
    async fn namespace() -> Namespace {
        let ns = backend::namespace("entity").await;
        let pool = backend::pool(&ns, 1).await;
        sqlx::raw_sql(tables(backend::NAME))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        ns
    }

    pub struct Payments {
        pub pool: Pool,
        pub gateway: Gateway,
        /// Another pool on the same database, for writers that
        /// do not take the lock.
        pub rogue: Option<Pool>,
        /// `pay_in_steps` fails once after its charge step, before its
        /// row is inserted.
        pub fail_after_charge: AtomicBool,
        /// The keys `pay_refusing`'s step was given.
        pub step_keys: Mutex<Vec<idem::steps::StepKey>>,
    }

    impl Payments {
        fn new(pool: Pool) -> Self {
            Payments {
                pool,
                gateway: Gateway::default(),
                rogue: None,
                fail_after_charge: AtomicBool::new(false),
                step_keys: Mutex::new(Vec::new()),
            }
        }

        #[idempotent(key = cmd.token, store = self.pool, entity, wait = "60s")]
        pub async fn pay(&self, cmd: &Charge) -> Result<Payment, PayError> {
            let charge = self.gateway.charge(&cmd.token).await?;
            if let Some(rogue) = &self.rogue {
                sqlx::query(&format!(
                    "INSERT INTO payments (idempotency_token, amount, charge) VALUES ({}, {}, -1)",
                    backend::param(1),
                    backend::param(2),
                ))
                .bind(&cmd.token)
                .bind(cmd.amount)
                .execute(rogue)
                .await
                .unwrap();
            }
            Ok(Payment {
                id: 0,
                token: cmd.token.clone(),
                amount: cmd.amount,
                charge,
                request_hash: None,
            })
        }

        /// Charges through a durable step.
        #[idempotent(key = cmd.token, store = self.pool, entity)]
        pub async fn pay_in_steps(&self, cmd: &Charge) -> Result<Payment, PayError> {
            let gateway = &self.gateway;
            let charge: i64 = idem::steps::step("charge", |_key| async move {
                gateway.charge(&cmd.token).await
            })
            .await?;
            if self.fail_after_charge.swap(false, Ordering::SeqCst) {
                return Err(PayError::Unavailable);
            }
            Ok(Payment {
                id: 0,
                token: cmd.token.clone(),
                amount: cmd.amount,
                charge,
                request_hash: None,
            })
        }

        /// Charges through a step that refuses when in doubt, under a short
        /// lease; keeps the key the step was given.
        #[idempotent(
            key = cmd.token,
            store = self.pool,
            entity,
            lease = "100ms",
        )]
        pub async fn pay_refusing(&self, cmd: &Charge) -> Result<Payment, PayError> {
            let gateway = &self.gateway;
            let charge: i64 = idem::steps::Step::new("charge")
                .refuse()
                .run(|key| async move {
                    self.step_keys.lock().unwrap().push(key);
                    gateway.charge(&cmd.token).await
                })
                .await?;
            Ok(Payment {
                id: 0,
                token: cmd.token.clone(),
                amount: cmd.amount,
                charge,
                request_hash: None,
            })
        }

        #[idempotent(key = cmd.token, store = self.pool, entity, fail_fast)]
        pub async fn pay_or_fail_fast(&self, cmd: &Charge) -> Result<Payment, PayError> {
            unreachable!("only called while another call holds {}", cmd.token)
        }

        #[idempotent(key = cmd.token, store = self.pool, entity)]
        pub async fn order(&self, cmd: &Charge) -> Result<Order, PayError> {
            let charge = self.gateway.charge(&cmd.token).await?;
            Ok(Order {
                id: 0,
                token: cmd.token.clone(),
                amount: cmd.amount,
                charge,
            })
        }

        #[idempotent(key = cmd.token, store = self.pool, entity)]
        pub async fn pay_under_another_token(
            &self,
            cmd: &Charge,
        ) -> Result<Payment, PayError> {
            Ok(Payment {
                id: 0,
                token: format!("{}-other", cmd.token),
                amount: cmd.amount,
                charge: 0,
                request_hash: None,
            })
        }
    }

    /// Pays `token` on a task of its own, once its body runs.
    async fn paying(
        service: &Arc<Payments>,
        token: &str,
    ) -> tokio::task::JoinHandle<Result<Payment, PayError>> {
        let running = {
            let (service, token) = (service.clone(), token.to_owned());
            tokio::spawn(async move { service.pay(&charge(&token, 500)).await })
        };
        while service.gateway.runs(token) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        running
    }

    async fn count(pool: &Pool, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// A failure after the charge step, before the row is inserted: the
    /// retry replays the journaled charge and inserts the row, so the
    /// gateway charged once.
    #[tokio::test]
    async fn a_charge_made_through_a_step_is_not_made_again() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        service.fail_after_charge.store(true, Ordering::SeqCst);
        let failed = service.pay_in_steps(&charge("t-steps", 500)).await;
        assert!(matches!(failed, Err(PayError::Unavailable)), "{failed:?}");
        assert_eq!(count(&service.pool, "payments").await, 0);
        let paid = service.pay_in_steps(&charge("t-steps", 500)).await.unwrap();
        assert_eq!(service.gateway.runs("t-steps"), 1, "charged again");
        assert_eq!(paid.charge, 1);
        assert_eq!(service.pay_in_steps(&charge("t-steps", 500)).await.unwrap(), paid);
        assert_eq!(count(&service.pool, "payments").await, 1);
    }

    /// A step's journal is the operation's, not its claim's: it outlives
    /// the claim's lease (a step in doubt is still refused two leases
    /// later), its keys derive from the operation's scope, and a retry of
    /// the token with another payload is refused at the step.
    #[tokio::test]
    async fn steps_journal_under_the_operation() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        service.gateway.fail_next.store(true, Ordering::SeqCst);
        let lost = service.pay_refusing(&charge("t-doubt", 500)).await;
        assert!(matches!(lost, Err(PayError::Unavailable)), "{lost:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let refused = service.pay_refusing(&charge("t-doubt", 500)).await;
        assert!(
            matches!(refused, Err(PayError::Idem(idem::Error::OutcomeUnknown { .. }))),
            "{refused:?}"
        );
        assert_eq!(service.gateway.runs("t-doubt"), 1, "a refused step ran");
        let key = Key::new("t-doubt").unwrap();
        assert_eq!(
            service.step_keys.lock().unwrap()[0],
            idem::steps::StepKey::derive(
                &idem::Scope::new(concat!(module_path!(), "::pay_refusing")),
                &key,
                "charge",
                0
            )
        );

        service.fail_after_charge.store(true, Ordering::SeqCst);
        let failed = service.pay_in_steps(&charge("t-other", 500)).await;
        assert!(matches!(failed, Err(PayError::Unavailable)), "{failed:?}");
        let other = service.pay_in_steps(&charge("t-other", 600)).await;
        assert!(
            matches!(other, Err(PayError::Idem(idem::Error::KeyReused))),
            "{other:?}"
        );
        assert_eq!(service.gateway.runs("t-other"), 1);
    }

    /// A body that outlives its journal's ttl, then fails: the journal is
    /// kept while the body runs (under the claim's scope, where its entries
    /// are written, not the operation's), so the retry replays the
    /// completed step that refuses when in doubt instead of charging again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_journal_outlives_its_ttl_while_the_body_runs() {
        let ns = namespace().await;
        let pool = backend::pool(&ns, 4).await;
        let gateway = Gateway::default();
        let fail = AtomicBool::new(true);
        let call = || {
            idem::Call::new(concat!(module_path!(), "::slow"), "t-slow", &500).with_policy(
                idem::Policy::new()
                    .lease(Duration::from_millis(120))
                    .ttl(Duration::from_millis(300)),
            )
        };
        let attempt = || {
            idem::entity::run(&pool, call(), async {
                let charge: i64 = idem::steps::Step::new("charge")
                    .refuse()
                    .run(|_key| gateway.charge("t-slow"))
                    .await?;
                // Three ttls of work, the lease renewed all along.
                tokio::time::sleep(Duration::from_millis(900)).await;
                if fail.swap(false, Ordering::SeqCst) {
                    return Err(PayError::Unavailable);
                }
                Ok::<_, PayError>(Payment {
                    id: 0,
                    token: "t-slow".into(),
                    amount: 500,
                    charge,
                    request_hash: None,
                })
            })
        };
        let failed = attempt().await;
        assert!(matches!(failed, Err(PayError::Unavailable)), "{failed:?}");
        let paid = attempt().await;
        assert_eq!(
            gateway.runs("t-slow"),
            1,
            "the retry charged again (it answered {paid:?}): the completed step's entry \
             expired while the body that wrote it still ran"
        );
        assert_eq!(paid.unwrap().charge, 1);
    }

    #[tokio::test]
    async fn a_stored_token_is_returned_without_running_the_body() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        let first = service.pay(&charge("t-1", 500)).await.unwrap();
        assert_eq!(first.token, "t-1");
        assert!(first.id > 0, "the generated id is read back: {first:?}");
        let fingerprint = idem::Fingerprint::of(&(&charge("t-1", 500),)).unwrap();
        assert_eq!(first.request_hash, Some(fingerprint.to_hex()));
        for _ in 0..3 {
            assert_eq!(service.pay(&charge("t-1", 500)).await.unwrap(), first);
        }
        assert_eq!(service.gateway.runs("t-1"), 1);
        assert_eq!(count(&service.pool, "payments").await, 1);
        let found: Option<Payment> =
            idem::entity::find(&service.pool, &Key::new("t-1").unwrap())
                .await
                .unwrap();
        assert_eq!(found, Some(first));
    }

    #[tokio::test]
    async fn a_token_reused_with_another_payload_is_refused_given_a_hash_column() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        service.pay(&charge("t-2", 500)).await.unwrap();
        let err = service.pay(&charge("t-2", 900)).await.unwrap_err();
        assert!(
            matches!(err, PayError::Idem(idem::Error::KeyReused)),
            "{err:?}"
        );
        assert_eq!(service.gateway.runs("t-2"), 1);
        assert_eq!(count(&service.pool, "payments").await, 1);
    }

    #[tokio::test]
    async fn a_token_reused_without_a_hash_column_returns_the_existing_row() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        let first = service.order(&charge("t-3", 500)).await.unwrap();
        let other = service.order(&charge("t-3", 900)).await.unwrap();
        assert_eq!(other, first);
        assert_eq!(other.amount, 500);
        assert_eq!(service.gateway.runs("t-3"), 1);
        assert_eq!(count(&service.pool, "orders").await, 1);
    }

    #[tokio::test]
    async fn a_body_error_stores_nothing_and_the_retry_runs() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        service.gateway.fail_next.store(true, Ordering::SeqCst);
        let err = service.pay(&charge("t-4", 500)).await.unwrap_err();
        assert!(matches!(err, PayError::Unavailable), "{err:?}");
        assert_eq!(count(&service.pool, "payments").await, 0);
        let paid = service.pay(&charge("t-4", 500)).await.unwrap();
        assert_eq!(service.pay(&charge("t-4", 500)).await.unwrap(), paid);
        assert_eq!(service.gateway.runs("t-4"), 2);
        assert_eq!(count(&service.pool, "payments").await, 1);
    }

    #[tokio::test]
    async fn an_entity_under_another_token_is_refused() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        let err = service
            .pay_under_another_token(&charge("t-5", 500))
            .await
            .unwrap_err();
        let PayError::Idem(idem::Error::Config(message)) = &err else {
            panic!("{err:?}");
        };
        assert!(
            message.contains("\"t-5-other\" is not the call's key \"t-5\""),
            "{message}"
        );
        assert_eq!(count(&service.pool, "payments").await, 0);
    }

    #[tokio::test]
    async fn invalid_keys_and_names_fail_before_any_run() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        let err = service.pay(&charge("has space", 1)).await.unwrap_err();
        assert!(
            matches!(err, PayError::Idem(idem::Error::InvalidKey(_))),
            "{err:?}"
        );
        let err = idem::entity::upsert(
            &service.pool,
            &Subscription {
                user_id: 1,
                plan: "basic".into(),
                seats: 1,
            },
            &["email"],
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("\"email\" is not among"), "{err}");
        assert_eq!(service.gateway.total_runs(), 0);
    }

    /// Rows are found by token alone, so a principal cannot narrow
    /// them: the call is refused before the body runs, not widened
    /// to every tenant.
    #[tokio::test]
    async fn a_scope_with_a_principal_is_refused_not_widened() {
        let ns = namespace().await;
        let service = Payments::new(backend::pool(&ns, 4).await);
        let first = service.pay(&charge("t-6", 500)).await.unwrap();
        let scope = idem::Scope::new("payments.pay").with_principal("tenant-b");
        let call = idem::Call::new(scope, "t-6", &charge("t-6", 500));
        let err = idem::entity::run(&service.pool, call, async {
            service.gateway.charge("t-6").await?;
            Ok::<_, PayError>(first.clone())
        })
        .await
        .unwrap_err();
        let PayError::Idem(idem::Error::Config(message)) = &err else {
            panic!("{err:?}");
        };
        assert!(message.contains("the principal \"tenant-b\""), "{message}");
        assert_eq!(service.gateway.runs("t-6"), 1);
        assert_eq!(count(&service.pool, "payments").await, 1);
    }

    /// 200 concurrent first calls over 10 tokens, through a pool
    /// of 8: one run and one row per token, one answer per token.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn storm_runs_each_token_once() {
        const CALLS: usize = 200;
        const TOKENS: usize = 10;
        let ns = namespace().await;
        let service = Arc::new(Payments::new(backend::pool(&ns, 8).await));
        *service.gateway.delay.lock().unwrap() = Duration::from_millis(20);
        let barrier = Arc::new(Barrier::new(CALLS));
        let tasks: Vec<_> = (0..CALLS)
            .map(|i| {
                let (service, barrier) = (service.clone(), barrier.clone());
                tokio::spawn(async move {
                    let token = format!("storm-{}", i % TOKENS);
                    barrier.wait().await;
                    let payment = service.pay(&charge(&token, 42)).await;
                    (token, payment)
                })
            })
            .collect();
        let mut answers: HashMap<String, Vec<Payment>> = HashMap::new();
        for task in tasks {
            let (token, payment) = task.await.unwrap();
            let payment = payment.unwrap_or_else(|e| panic!("{token}: {e:?}"));
            answers.entry(token).or_default().push(payment);
        }
        assert_eq!(answers.len(), TOKENS);
        for (token, payments) in &answers {
            assert_eq!(service.gateway.runs(token), 1, "{token} ran more than once");
            assert_eq!(payments.len(), CALLS / TOKENS);
            assert!(
                payments.iter().all(|p| p == &payments[0]),
                "{token}: {payments:?}"
            );
            assert_eq!(&payments[0].token, token);
        }
        assert_eq!(service.gateway.total_runs(), TOKENS);
        assert_eq!(count(&service.pool, "payments").await, TOKENS as i64);
    }

    /// A call dropped while its body runs (so while it holds the
    /// token's lock) leaves no lock behind: meanwhile a duplicate
    /// fails fast, afterwards another pool runs the token.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_call_frees_the_token() {
        let ns = namespace().await;
        let first = Arc::new(Payments::new(backend::pool(&ns, 2).await));
        first.gateway.stall.store(true, Ordering::SeqCst);
        let running = paying(&first, "t-6").await;
        let other = Payments::new(backend::pool(&ns, 2).await);
        let err = other
            .pay_or_fail_fast(&charge("t-6", 500))
            .await
            .unwrap_err();
        assert!(
            matches!(err, PayError::Idem(idem::Error::InProgress { .. })),
            "{err:?}"
        );

        running.abort();
        assert!(running.await.unwrap_err().is_cancelled());
        let paid =
            tokio::time::timeout(Duration::from_secs(20), other.pay(&charge("t-6", 500)))
                .await
                .expect("the token is still locked after its call was dropped")
                .unwrap();
        assert_eq!(paid.token, "t-6");
        assert_eq!(other.gateway.runs("t-6"), 1);
        assert_eq!(count(&other.pool, "payments").await, 1);
        // The first pool still works, and replays.
        first.gateway.stall.store(false, Ordering::SeqCst);
        assert_eq!(first.pay(&charge("t-6", 500)).await.unwrap(), paid);
    }

    // An embedded SQLite database has no connections to kill.
    backend::if_server! {
        /// The claim outlives the connections: with every connection
        /// of the service killed while its body runs, a retry is told
        /// the call is in progress (it never runs the body), and the
        /// body's row is stored once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_killed_connection_never_lets_a_retry_run_the_body_again() {
            let ns = namespace().await;
            let service = Arc::new(Payments::new(backend::pool(&ns, 4).await));
            *service.gateway.delay.lock().unwrap() = Duration::from_millis(1_500);
            let running = paying(&service, "t-k").await;
            let mut killed = 0;
            for _ in 0..5 {
                killed += ns.kill_connections().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(killed > 0, "no connection was killed");
            let other = Payments::new(backend::pool(&ns, 2).await);
            let err = other
                .pay_or_fail_fast(&charge("t-k", 500))
                .await
                .unwrap_err();
            assert!(
                matches!(err, PayError::Idem(idem::Error::InProgress { .. })),
                "{err:?}"
            );
            let paid = running.await.unwrap().unwrap();
            assert_eq!(other.pay(&charge("t-k", 500)).await.unwrap(), paid);
            assert_eq!(service.gateway.runs("t-k"), 1);
            assert_eq!(count(&other.pool, "payments").await, 1);
        }

        /// The body ran, then inserting its row fails (the table is
        /// locked, and the inserting connections are killed): the
        /// insert is tried again until it lands, and nothing is handed
        /// back meanwhile, so the body never runs twice.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_failed_insert_is_retried_before_anything_is_released() {
            let ns = namespace().await;
            let service = Arc::new(Payments::new(backend::pool(&ns, 4).await));
            let lock = ns.block_writes("payments").await;
            let running = paying(&service, "t-i").await;
            let mut killed = 0;
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                killed += ns.kill_connections().await;
            }
            assert!(killed > 0, "no connection was killed");
            drop(lock);
            let paid = tokio::time::timeout(Duration::from_secs(30), running)
                .await
                .expect("the insert never landed")
                .unwrap()
                .unwrap();
            assert_eq!(service.pay(&charge("t-i", 500)).await.unwrap(), paid);
            assert_eq!(service.gateway.runs("t-i"), 1);
            assert_eq!(count(&service.pool, "payments").await, 1);
        }

        /// The row and its claim's completion commit together: while
        /// the completion waits (the claims' table is locked), the row
        /// is not visible and the claim is in progress; connections
        /// killed then roll both back, and the insert is tried again
        /// until both land. The body runs once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_row_and_the_claims_completion_commit_together() {
            let ns = namespace().await;
            let service = Arc::new(Payments::new(backend::pool(&ns, 4).await));
            *service.gateway.delay.lock().unwrap() = Duration::from_millis(300);
            let running = paying(&service, "t-c").await;
            let lock = ns.block_writes("idem_entity_claims").await;
            // The body ends; its row is inserted, and the completion
            // waits for the lock.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            let claim = || async {
                let look = backend::pool(&ns, 1).await;
                use idem::Store as _;
                let claims = idem::store::SqlStore::new(look.clone())
                    .with_table_name("idem_entity_claims")
                    .unwrap();
                let record = claims
                    .get(
                        &idem::Scope::new("idem.entity.payments"),
                        &Key::try_from("t-c").unwrap(),
                    )
                    .await
                    .unwrap()
                    .expect("the claim's record");
                let rows = count(&look, "payments").await;
                look.close().await;
                (record.state, rows)
            };
            assert_eq!(
                claim().await,
                (idem::record::State::InProgress, 0),
                "the row was committed before its claim's completion"
            );
            assert!(!running.is_finished());
            // The service's connections, and the lock's.
            assert!(ns.kill_connections().await > 0);
            drop(lock);
            let paid = tokio::time::timeout(Duration::from_secs(30), running)
                .await
                .expect("the row never landed")
                .unwrap()
                .unwrap();
            assert_eq!(claim().await, (idem::record::State::Completed, 1));
            assert_eq!(service.pay(&charge("t-c", 500)).await.unwrap(), paid);
            assert_eq!(service.gateway.runs("t-c"), 1);
        }
    }

    /// A writer that skips the claim stores the token while the
    /// body runs: the insert loses on the UNIQUE constraint and the
    /// writer's row is returned.
    #[tokio::test]
    async fn the_unique_constraint_is_the_last_line_of_defense() {
        let ns = namespace().await;
        let mut service = Payments::new(backend::pool(&ns, 2).await);
        service.rogue = Some(backend::pool(&ns, 1).await);
        let paid = service.pay(&charge("t-7", 500)).await.unwrap();
        assert_eq!(paid.charge, -1, "not the rogue writer's row: {paid:?}");
        assert_eq!(paid.request_hash, None);
        assert_eq!(count(&service.pool, "payments").await, 1);
    }

    // Only the MariaDB tables compare tokens case-insensitively.
    backend::if_mysql! {
        /// A token column that ignores case would answer one key
        /// with another key's row: that is refused.
        #[tokio::test]
        async fn a_row_under_a_token_that_differs_from_the_key_is_refused() {
            let ns = namespace().await;
            let service = Payments::new(backend::pool(&ns, 2).await);
            service.order(&charge("T-9", 500)).await.unwrap();
            let err = service.order(&charge("t-9", 500)).await.unwrap_err();
            let PayError::Idem(idem::Error::Config(message)) = &err else {
                panic!("{err:?}");
            };
            assert!(message.contains("holds the token Ok(\"T-9\")"), "{message}");
            assert_eq!(service.gateway.total_runs(), 1);
        }
    }

    #[tokio::test]
    async fn duplicates_are_unique_violations() {
        let ns = namespace().await;
        let pool = backend::pool(&ns, 1).await;
        let insert =
            "INSERT INTO subscriptions (user_id, plan, seats) VALUES (7, 'basic', 1)";
        sqlx::query(insert).execute(&pool).await.unwrap();
        let err = sqlx::query(insert).execute(&pool).await.unwrap_err();
        assert!(idem::entity::is_unique_violation(&err), "{err:?}");
        let err = sqlx::query(
            "INSERT INTO subscriptions (user_id, plan, seats) VALUES (8, NULL, 1)",
        )
        .execute(&pool)
        .await
        .unwrap_err();
        assert!(!idem::entity::is_unique_violation(&err), "{err:?}");
    }

    #[tokio::test]
    async fn upsert_creates_then_updates_and_repeats_converge() {
        let ns = namespace().await;
        let pool = backend::pool(&ns, 2).await;
        let basic = Subscription {
            user_id: 1,
            plan: "basic".into(),
            seats: 1,
        };
        let stored = idem::entity::upsert(&pool, &basic, &["user_id"])
            .await
            .unwrap();
        assert_eq!(stored, basic);
        let pro = Subscription {
            plan: "pro".into(),
            seats: 5,
            ..basic.clone()
        };
        for _ in 0..3 {
            let stored = idem::entity::upsert(&pool, &pro, &["user_id"])
                .await
                .unwrap();
            assert_eq!(stored, pro);
        }
        let rows: Vec<Subscription> = sqlx::query_as("SELECT * FROM subscriptions")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(rows, vec![pro.clone()]);
        // Every column a key: nothing to update, the row is still
        // answered.
        let member = Membership {
            user_id: 1,
            team_id: 2,
        };
        for _ in 0..2 {
            let same = idem::entity::upsert(&pool, &member, &["user_id", "team_id"])
                .await
                .unwrap();
            assert_eq!(same, member);
        }
        assert_eq!(count(&pool, "memberships").await, 1);
    }

    /// 100 concurrent upserts over 5 users: one row per user, and
    /// every caller gets that row.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn upsert_storm_leaves_one_row_per_key() {
        const CALLS: usize = 100;
        const USERS: usize = 5;
        let ns = namespace().await;
        let pool = backend::pool(&ns, 8).await;
        let barrier = Arc::new(Barrier::new(CALLS));
        let tasks: Vec<_> = (0..CALLS)
            .map(|i| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                tokio::spawn(async move {
                    let user = (i % USERS) as i64;
                    let wanted = Subscription {
                        user_id: user,
                        plan: format!("plan-{user}"),
                        seats: user * 10,
                    };
                    barrier.wait().await;
                    let stored = idem::entity::upsert(&pool, &wanted, &["user_id"])
                        .await
                        .unwrap_or_else(|e| panic!("user {user}: {e}"));
                    (wanted, stored)
                })
            })
            .collect();
        for task in tasks {
            let (wanted, stored) = task.await.unwrap();
            assert_eq!(stored, wanted);
        }
        let rows: Vec<Subscription> =
            sqlx::query_as("SELECT * FROM subscriptions ORDER BY user_id")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(rows.len(), USERS);
        for (user, row) in rows.iter().enumerate() {
            assert_eq!(row.user_id, user as i64);
            assert_eq!(row.plan, format!("plan-{user}"));
        }
    }
});

/// MySQL's upsert runs again only when InnoDB chose it as a deadlock's
/// victim (error 1213): an error that merely carries SQLSTATE 40001, as a
/// trigger's `SIGNAL SQLSTATE '40001'` does (error 1644), is the caller's
/// at once, and the trigger's writes that outlive a rollback (a MyISAM
/// table's) happen once.
#[cfg(feature = "mysql")]
mod mysql_upsert_retries {
    use super::*;
    use crate::common::backend::mysql as backend;

    #[tokio::test]
    async fn a_signalled_40001_is_not_a_deadlock() {
        let ns = backend::namespace("upsert_signal").await;
        let pool = backend::pool(&ns, 1).await;
        sqlx::raw_sql(tables(backend::NAME))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE upsert_attempts (n INT AUTO_INCREMENT PRIMARY KEY) ENGINE = MyISAM;
             CREATE TRIGGER subscriptions_refused BEFORE INSERT ON subscriptions
             FOR EACH ROW BEGIN
                 INSERT INTO upsert_attempts () VALUES ();
                 SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'refused by a trigger';
             END",
        )
        .execute(&pool)
        .await
        .unwrap();
        let wanted = Subscription {
            user_id: 1,
            plan: "basic".into(),
            seats: 1,
        };
        let err = idem::entity::upsert(&pool, &wanted, &["user_id"])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("refused by a trigger"), "{err}");
        let (attempts,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM upsert_attempts")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            attempts, 1,
            "the upsert ran again on an error that is no deadlock"
        );
    }
}
