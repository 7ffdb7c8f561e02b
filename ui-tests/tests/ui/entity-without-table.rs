#[derive(idem::Entity)]
struct Payment {
    #[idem(token)]
    token: String,
    amount: i64,
}

fn main() {}
