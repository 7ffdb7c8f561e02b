#[derive(idem::Entity)]
#[idem(table = "payments")]
struct Payment {
    #[idem(token, column = "token; DROP TABLE payments")]
    token: String,
}

fn main() {}
