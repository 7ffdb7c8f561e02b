use std::sync::Arc;

use idem::{idempotent, MemoryStore};

#[derive(Clone)]
struct Job {
    store: MemoryStore,
    name: String,
}

impl Job {
    #[idempotent(key = key, store = self.store)]
    async fn finish(self, key: u64) -> Result<String, idem::Error> {
        Ok(self.name)
    }

    #[idempotent(key = key, store = self.store)]
    async fn shared(self: Arc<Self>, key: u64) -> Result<usize, idem::Error> {
        Ok(self.name.len())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let job = Job {
        store: MemoryStore::new(),
        name: "nightly".into(),
    };
    assert_eq!(job.clone().finish(1).await.unwrap(), "nightly");
    assert_eq!(Arc::new(job).shared(1).await.unwrap(), 7);
}
