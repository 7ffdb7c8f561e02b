use sqlx::SqlitePool;

#[derive(sqlx::FromRow, idem::Entity)]
#[idem(table = "payments")]
struct Payment {
    #[idem(token)]
    token: String,
}

#[idem::idempotent(key = key, store = pool, entity, ttl = "24h")]
async fn pay(pool: &SqlitePool, key: &str) -> Result<Payment, idem::Error> {
    let _ = pool;
    Ok(Payment { token: key.into() })
}

fn main() {}
