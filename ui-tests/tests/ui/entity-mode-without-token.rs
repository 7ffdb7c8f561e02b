use sqlx::SqlitePool;

#[derive(sqlx::FromRow, idem::Entity)]
#[idem(table = "subscriptions")]
struct Subscription {
    user_id: i64,
    plan: String,
}

#[idem::idempotent(key = key, store = pool, entity)]
async fn subscribe(pool: &SqlitePool, key: &str, user_id: i64) -> Result<Subscription, idem::Error> {
    Ok(Subscription {
        user_id,
        plan: "basic".into(),
    })
}

fn main() {}
