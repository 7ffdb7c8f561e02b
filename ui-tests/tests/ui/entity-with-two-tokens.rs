#[derive(idem::Entity)]
#[idem(table = "payments")]
struct Payment {
    #[idem(token)]
    token: String,
    #[idem(token)]
    other_token: String,
}

fn main() {}
