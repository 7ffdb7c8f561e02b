use sqlx::SqlitePool;

#[derive(sqlx::FromRow, idem::Entity)]
#[idem(table = "payments")]
struct Payment {
    #[idem(token)]
    token: String,
}

#[idem::idempotent(
    key = key,
    store = pool,
    entity,
    scope = idem::Scope::new("payments.create").with_principal(tenant)
)]
async fn pay(pool: &SqlitePool, tenant: &str, key: &str) -> Result<Payment, idem::Error> {
    let _ = (pool, tenant);
    Ok(Payment { token: key.into() })
}

fn main() {}
