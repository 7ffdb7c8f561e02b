use idem::{idempotent, MemoryStore};

struct Counter {
    store: MemoryStore,
    count: u64,
    log: Vec<String>,
}

impl Counter {
    // The body mutates other fields of `self` while the store field is
    // borrowed.
    #[idempotent(key = key, store = self.store)]
    async fn bump(&mut self, key: String, by: u64) -> Result<u64, idem::Error> {
        self.count += by;
        self.log.push(key);
        Ok(self.count)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut counter = Counter {
        store: MemoryStore::new(),
        count: 0,
        log: Vec::new(),
    };
    assert_eq!(counter.bump("a".into(), 2).await.unwrap(), 2);
    assert_eq!(counter.bump("a".into(), 2).await.unwrap(), 2);
    assert_eq!(counter.bump("b".into(), 2).await.unwrap(), 4);
    assert_eq!(counter.log, ["a", "b"]);
}
