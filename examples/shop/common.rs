// The shop both consumer examples apply their events to: the orders, the
// stock and invoices on SQLite or PostgreSQL, and the one transaction that
// writes an order's effect with its dedupe marker. Included, as text, by
// `consumer_rabbitmq.rs` and `consumer_kafka.rs`, which bring the names it
// uses (`BoxError`, `Deduplicator`, `Handled`, `Key`, serde's traits).

/// Units of each product in stock at the start.
const STOCK: i64 = 10_000;
const PRODUCTS: [&str; 3] = ["apple", "pear", "plum"];

#[derive(Clone, Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
    customer: String,
    lines: Vec<Line>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: i64,
}

impl OrderPlaced {
    fn number(n: usize) -> Self {
        let lines = (0..1 + n % 2)
            .map(|i| Line {
                sku: PRODUCTS[(n + i) % PRODUCTS.len()].to_owned(),
                quantity: (n % 4 + 1) as i64,
            })
            .collect();
        OrderPlaced {
            order_id: format!("order-{n:03}"),
            customer: format!("customer-{}", n % 7),
            lines,
        }
    }

    fn units(&self) -> i64 {
        self.lines.iter().map(|l| l.quantity).sum()
    }

    /// The event as the publisher writes it.
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an event serializes")
    }

    /// The same event as another writer would put it: every object's
    /// members in reverse order, with whitespace. The bytes differ; the
    /// canonical JSON does not.
    fn re_encode(&self) -> Vec<u8> {
        let lines: Vec<String> = self
            .lines
            .iter()
            .map(|l| format!("{{ \"quantity\": {}, \"sku\": {:?} }}", l.quantity, l.sku))
            .collect();
        format!(
            "{{ \"lines\": [{}], \"customer\": {:?}, \"order_id\": {:?} }}",
            lines.join(", "),
            self.customer,
            self.order_id
        )
        .into_bytes()
    }
}

/// Crash after committing these orders, before acknowledging them (an ack,
/// or an offset commit).
fn crashes_on(order: &OrderPlaced) -> bool {
    order
        .order_id
        .strip_prefix("order-")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n % 7 == 3)
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("not enough {0} in stock")]
    OutOfStock(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

impl ShopError {
    /// Whether a redelivery may succeed: requeue it; otherwise dead-letter.
    fn is_retryable(&self) -> bool {
        match self {
            ShopError::OutOfStock(_) => false,
            ShopError::Db(_) => true,
            ShopError::Idem(err) => err.is_retryable(),
        }
    }
}

/// The business database, SQLite or PostgreSQL.
trait Shop: Send + Sync + 'static {
    /// Reserves the order's stock and writes its invoice, once per `key`:
    /// the marker and the rows commit together.
    fn handle<M: Serialize + Sync + ?Sized>(
        &self,
        key: &Key,
        message: &M,
        order: &OrderPlaced,
    ) -> impl Future<Output = Result<Handled<i64>, ShopError>> + Send;
    /// Invoices written and units reserved.
    fn effects(&self) -> impl Future<Output = Result<(i64, i64), sqlx::Error>> + Send;
    /// Where the data lives, for the report.
    fn describe(&self) -> String;
    /// Drops what the run created.
    fn clean_up(&self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// The statements, the same on both databases (sqlx binds `$n` on SQLite
/// too). `{stock}` and `{invoices}` are the run's tables.
const SCHEMA: &[&str] = &[
    "CREATE TABLE {stock} (sku VARCHAR(64) PRIMARY KEY, available BIGINT NOT NULL)",
    "CREATE TABLE {invoices} (order_id VARCHAR(255) NOT NULL, customer VARCHAR(255) NOT NULL, \
     units BIGINT NOT NULL)",
];
const SEED: &str = "INSERT INTO {stock} (sku, available) VALUES ($1, $2)";
const RESERVE: &str =
    "UPDATE {stock} SET available = available - $1 WHERE sku = $2 AND available >= $1";
const INVOICE: &str = "INSERT INTO {invoices} (order_id, customer, units) VALUES ($1, $2, $3)";
const INVOICES: &str = "SELECT COUNT(*) FROM {invoices}";
const AVAILABLE: &str = "SELECT CAST(COALESCE(SUM(available), 0) AS BIGINT) FROM {stock}";

fn sql(template: &str, stock: &str, invoices: &str) -> String {
    template
        .replace("{stock}", stock)
        .replace("{invoices}", invoices)
}

/// The order's lines in one order on every consumer, so that two
/// transactions never lock the same rows in opposite orders.
fn sorted_lines(order: &OrderPlaced) -> Vec<&Line> {
    let mut lines: Vec<&Line> = order.lines.iter().collect();
    lines.sort_by(|a, b| a.sku.cmp(&b.sku));
    lines
}

mod sqlite {
    use super::*;
    use idem::SqliteStore;
    use sqlx::{SqliteConnection, SqlitePool};

    pub(crate) struct SqliteShop {
        dedup: Deduplicator<SqliteStore>,
        pool: SqlitePool,
        dir: tempfile::TempDir,
    }

    impl SqliteShop {
        /// A database file in a temporary directory, removed at the end.
        pub(crate) async fn open() -> Result<Self, BoxError> {
            let dir = tempfile::tempdir()?;
            let url = format!("sqlite://{}", dir.path().join("shop.db").display());
            let store = SqliteStore::connect(&url).await?;
            let pool = store.pool().clone();
            for statement in SCHEMA {
                sqlx::query(&sql(statement, "stock", "invoices"))
                    .execute(&pool)
                    .await?;
            }
            for sku in PRODUCTS {
                sqlx::query(&sql(SEED, "stock", "invoices"))
                    .bind(sku)
                    .bind(STOCK)
                    .execute(&pool)
                    .await?;
            }
            let dedup = Deduplicator::new(store, "orders.reserve-and-invoice");
            Ok(SqliteShop { dedup, pool, dir })
        }
    }

    async fn reserve_and_invoice(
        conn: &mut SqliteConnection,
        order: &OrderPlaced,
    ) -> Result<i64, ShopError> {
        for line in sorted_lines(order) {
            let done = sqlx::query(&sql(RESERVE, "stock", "invoices"))
                .bind(line.quantity)
                .bind(&line.sku)
                .execute(&mut *conn)
                .await?;
            if done.rows_affected() == 0 {
                return Err(ShopError::OutOfStock(line.sku.clone()));
            }
        }
        sqlx::query(&sql(INVOICE, "stock", "invoices"))
            .bind(&order.order_id)
            .bind(&order.customer)
            .bind(order.units())
            .execute(&mut *conn)
            .await?;
        Ok(order.units())
    }

    impl Shop for SqliteShop {
        async fn handle<M: Serialize + Sync + ?Sized>(
            &self,
            key: &Key,
            message: &M,
            order: &OrderPlaced,
        ) -> Result<Handled<i64>, ShopError> {
            // SQLite: take the write lock at BEGIN (the guide: Transactional mode).
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let handled = self
                .dedup
                .process_in_transaction(&mut tx, key, message, |tx| async move {
                    let result = reserve_and_invoice(tx, order).await;
                    (result, tx)
                })
                .await;
            match handled {
                Ok(handled) => {
                    tx.commit().await?;
                    Ok(handled)
                }
                Err(err) => {
                    tx.rollback().await?;
                    Err(err)
                }
            }
        }

        async fn effects(&self) -> Result<(i64, i64), sqlx::Error> {
            let invoices: i64 = sqlx::query_scalar(&sql(INVOICES, "stock", "invoices"))
                .fetch_one(&self.pool)
                .await?;
            let available: i64 = sqlx::query_scalar(&sql(AVAILABLE, "stock", "invoices"))
                .fetch_one(&self.pool)
                .await?;
            Ok((invoices, STOCK * PRODUCTS.len() as i64 - available))
        }

        fn describe(&self) -> String {
            format!("SQLite ({})", self.dir.path().join("shop.db").display())
        }

        async fn clean_up(&self) -> Result<(), sqlx::Error> {
            Ok(())
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idem::PostgresStore;
    use sqlx::{PgConnection, PgPool};

    pub(crate) struct PostgresShop {
        dedup: Deduplicator<PostgresStore>,
        pool: PgPool,
        url: String,
        tables: [String; 3],
    }

    impl PostgresShop {
        /// Tables of this run's own: the markers, the stock, the invoices.
        pub(crate) async fn open(run: &str) -> Result<Self, BoxError> {
            let url = std::env::var("IDEM_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
            let pool = PgPool::connect(&url).await.map_err(|err| {
                format!(
                    "cannot reach PostgreSQL at {url} (set IDEM_POSTGRES_URL to the URL of a \
                     reachable server): {err}"
                )
            })?;
            let tables =
                ["records", "stock", "invoices"].map(|t| format!("idem_example_{run}_{t}"));
            let store = PostgresStore::new(pool.clone()).with_table_name(&tables[0])?;
            store.migrate().await?;
            let shop = PostgresShop {
                dedup: Deduplicator::new(store, "orders.reserve-and-invoice"),
                pool,
                url,
                tables,
            };
            for statement in SCHEMA {
                sqlx::query(&shop.sql(statement))
                    .execute(&shop.pool)
                    .await?;
            }
            for sku in PRODUCTS {
                sqlx::query(&shop.sql(SEED))
                    .bind(sku)
                    .bind(STOCK)
                    .execute(&shop.pool)
                    .await?;
            }
            Ok(shop)
        }

        fn sql(&self, template: &str) -> String {
            sql(template, &self.tables[1], &self.tables[2])
        }

        async fn reserve_and_invoice(
            &self,
            conn: &mut PgConnection,
            order: &OrderPlaced,
        ) -> Result<i64, ShopError> {
            for line in sorted_lines(order) {
                let done = sqlx::query(&self.sql(RESERVE))
                    .bind(line.quantity)
                    .bind(&line.sku)
                    .execute(&mut *conn)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(ShopError::OutOfStock(line.sku.clone()));
                }
            }
            sqlx::query(&self.sql(INVOICE))
                .bind(&order.order_id)
                .bind(&order.customer)
                .bind(order.units())
                .execute(&mut *conn)
                .await?;
            Ok(order.units())
        }
    }

    impl Shop for PostgresShop {
        async fn handle<M: Serialize + Sync + ?Sized>(
            &self,
            key: &Key,
            message: &M,
            order: &OrderPlaced,
        ) -> Result<Handled<i64>, ShopError> {
            let mut tx = self.pool.begin().await?;
            let handled = self
                .dedup
                .process_in_transaction(&mut tx, key, message, |tx| async move {
                    let result = self.reserve_and_invoice(tx, order).await;
                    (result, tx)
                })
                .await;
            match handled {
                Ok(handled) => {
                    tx.commit().await?;
                    Ok(handled)
                }
                Err(err) => {
                    tx.rollback().await?;
                    Err(err)
                }
            }
        }

        async fn effects(&self) -> Result<(i64, i64), sqlx::Error> {
            let invoices: i64 = sqlx::query_scalar(&self.sql(INVOICES))
                .fetch_one(&self.pool)
                .await?;
            let available: i64 = sqlx::query_scalar(&self.sql(AVAILABLE))
                .fetch_one(&self.pool)
                .await?;
            Ok((invoices, STOCK * PRODUCTS.len() as i64 - available))
        }

        fn describe(&self) -> String {
            format!(
                "PostgreSQL ({}, tables {})",
                self.url,
                self.tables.join(", ")
            )
        }

        async fn clean_up(&self) -> Result<(), sqlx::Error> {
            for table in &self.tables {
                sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                    .execute(&self.pool)
                    .await?;
            }
            sqlx::query("DELETE FROM idem_migrations WHERE table_name = $1")
                .bind(&self.tables[0])
                .execute(&self.pool)
                .await?;
            Ok(())
        }
    }
}

