use std::fmt::Display;

use idem::{idempotent, MemoryStore, Store};
use serde::de::DeserializeOwned;
use serde::Serialize;

// A generic fn names its scope: its instantiations would share the default.
#[idempotent(key = key, store = store, scope = "echo")]
async fn echo<'a, S, T>(store: &'a S, key: &'a str, value: T) -> Result<T, idem::Error>
where
    S: Store + ?Sized,
    T: Serialize + DeserializeOwned + Clone + Send,
{
    Ok(value.clone())
}

struct Service<S> {
    store: S,
}

impl<S: Store> Service<S> {
    #[idempotent(key = key.as_ref(), store = self.store, scope = "service.describe")]
    async fn describe<K: AsRef<str> + Serialize + Display>(
        &self,
        key: K,
    ) -> Result<String, idem::Error> {
        Ok(format!("{key}"))
    }
}

// Lifetimes alone do not make a fn generic in what it stores.
#[idempotent(key = key, store = store)]
async fn shout<'a>(store: &'a MemoryStore, key: &'a str, word: &'a str) -> Result<String, idem::Error> {
    Ok(word.to_uppercase())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = MemoryStore::new();
    assert_eq!(echo(&store, "k", vec![1, 2]).await.unwrap(), [1, 2]);
    let service = Service {
        store: std::sync::Arc::new(MemoryStore::new()),
    };
    assert_eq!(service.describe("k").await.unwrap(), "k");
    assert_eq!(shout(&store, "s", "hey").await.unwrap(), "HEY");
}
