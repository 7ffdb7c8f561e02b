use idem::{idempotent, SqliteStore};
use sqlx::{Sqlite, SqliteConnection, Transaction};

struct Ledger {
    store: SqliteStore,
}

impl Ledger {
    /// On a transaction: the body writes its rows on the same connection.
    #[idempotent(key = key, store = self.store, tx = tx)]
    async fn credit(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        key: &str,
        cents: i64,
    ) -> Result<i64, idem::Error> {
        sqlx::query("INSERT INTO ledger (cents) VALUES (?)")
            .bind(cents)
            .execute(&mut **tx)
            .await
            .map_err(idem::Error::store)?;
        Ok(cents)
    }
}

/// On a bare connection, a free function, with `replayable`.
#[idempotent(key = key, store = store, tx = conn, replayable = |_| true)]
async fn debit(
    store: &SqliteStore,
    conn: &mut SqliteConnection,
    key: String,
) -> Result<u32, Refused> {
    if key.is_empty() {
        return Err(Refused);
    }
    let _ = &mut *conn;
    Ok(1)
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Refused;

impl From<idem::Error> for Refused {
    fn from(_: idem::Error) -> Self {
        Refused
    }
}

fn main() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
            sqlx::query("CREATE TABLE ledger (cents INTEGER NOT NULL)")
                .execute(store.pool())
                .await
                .unwrap();
            let ledger = Ledger { store: store.clone() };
            let mut tx = store.pool().begin().await.unwrap();
            assert_eq!(ledger.credit(&mut tx, "c1", 500).await.unwrap(), 500);
            tx.commit().await.unwrap();
            let mut tx = store.pool().begin().await.unwrap();
            assert_eq!(ledger.credit(&mut tx, "c1", 500).await.unwrap(), 500);
            tx.commit().await.unwrap();
            let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
                .fetch_one(store.pool())
                .await
                .unwrap();
            assert_eq!(rows, 1);

            let mut conn = store.pool().acquire().await.unwrap();
            assert_eq!(debit(&store, &mut conn, "d1".into()).await.unwrap(), 1);
        });
}
