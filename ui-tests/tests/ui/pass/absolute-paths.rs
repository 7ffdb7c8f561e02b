// Local items named like the paths the expansion uses must not capture them.
#![allow(dead_code, unused_macros)]

use idem::{idempotent, MemoryStore};

mod core {}
mod std {}
struct Duration;
struct Policy;
type Result<T> = ::std::result::Result<T, idem::Error>;
macro_rules! concat {
    ($($t:tt)*) => {
        compile_error!("the local `concat!` was used")
    };
}
macro_rules! module_path {
    () => {
        compile_error!("the local `module_path!` was used")
    };
}

#[idempotent(key = key, store = store, ttl = "1h", lease = "10s", wait = "1s")]
async fn charge(store: &MemoryStore, key: String) -> Result<u64> {
    Ok(1)
}

fn main() {
    let _ = charge;
}
