use idem::idempotent;

#[idempotent(key = key)]
async fn charge(key: String) -> Result<usize, idem::Error> {
    Ok(key.len())
}

fn main() {}
