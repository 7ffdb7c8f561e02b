use idem::{idempotent, MemoryStore};
use serde::de::DeserializeOwned;
use serde::Serialize;

// Each instantiation stores another type under the same default scope.
#[idempotent(key = key, store = store)]
async fn cache<T: Serialize + DeserializeOwned + Default>(
    store: &MemoryStore,
    key: &str,
) -> Result<T, idem::Error> {
    let _ = (store, key);
    Ok(T::default())
}

fn main() {}
