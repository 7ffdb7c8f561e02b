use idem::idempotent;

#[idempotent(key = key, store = STORE)]
const fn charge(key: u64) -> Result<u64, idem::Error> {
    Ok(key)
}

fn main() {}
