use idem::idempotent;

#[idempotent(key = token, store = store)]
struct Charge {
    token: String,
}

fn main() {}
