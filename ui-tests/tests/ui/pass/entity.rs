// Entity mode through the attribute and the derive, with local items named
// like the paths the generated code uses.
#![allow(dead_code)]

use idem::{idempotent, Entity};
use sqlx::SqlitePool;

mod core {}
mod std {}
struct Key;
struct Fingerprint;
type Result<T> = ::std::result::Result<T, idem::Error>;

#[derive(Debug, PartialEq, sqlx::FromRow, Entity)]
#[idem(table = "payments")]
struct Payment {
    #[idem(generated)]
    id: i64,
    #[idem(token, column = "idempotency_token")]
    #[sqlx(rename = "idempotency_token")]
    token: String,
    amount: i64,
    #[idem(request_hash)]
    request_hash: Vec<u8>,
}

struct Payments {
    pool: SqlitePool,
}

impl Payments {
    #[idempotent(key = token, store = self.pool, entity, wait = "1s")]
    async fn pay(&self, token: &str, amount: i64) -> Result<Payment> {
        Ok(Payment {
            id: 0,
            token: token.to_owned(),
            amount,
            request_hash: Vec::new(),
        })
    }
}

fn main() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let pool = SqlitePool::connect("sqlite::memory:").await.unwrap();
            sqlx::query(
                "CREATE TABLE payments (id INTEGER PRIMARY KEY, \
                 idempotency_token TEXT NOT NULL UNIQUE, amount INTEGER NOT NULL, \
                 request_hash BLOB NOT NULL)",
            )
            .execute(&pool)
            .await
            .unwrap();
            let payments = Payments { pool };
            let first = payments.pay("k-1", 500).await.unwrap();
            assert_eq!(first.id, 1);
            assert_eq!(first.request_hash.len(), 32);
            assert_eq!(payments.pay("k-1", 500).await.unwrap(), first);
            assert!(matches!(
                payments.pay("k-1", 900).await,
                Err(idem::Error::KeyReused)
            ));
        });
}
