use idem::{idempotent, MemoryStore};
use serde::Serialize;

#[derive(Serialize)]
struct Batch {
    key: String,
    lines: Vec<String>,
}

fn consume(lines: Vec<String>) -> usize {
    lines.len()
}

// Owned arguments are moved and mutated inside the body.
#[idempotent(key = batch.key, store = store)]
async fn import(
    store: &MemoryStore,
    batch: Batch,
    mut extra: Vec<String>,
) -> Result<usize, idem::Error> {
    extra.push("trailer".to_owned());
    let Batch { lines, .. } = batch;
    let handle = tokio::spawn(async move { consume(lines) + extra.len() });
    Ok(handle.await.unwrap())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = MemoryStore::new();
    let batch = Batch {
        key: "b".into(),
        lines: vec!["x".into()],
    };
    assert_eq!(import(&store, batch, vec![]).await.unwrap(), 2);
}
