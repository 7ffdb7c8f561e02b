//! How many allocations a call over `MemoryStore` makes (benchmark B6's
//! calls), counted by a global allocator for the test's own thread: a
//! change that allocates again per call (a metric label, a span, a map
//! key, a fingerprint buffer, a copy of the outcome) fails here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// count is a thread-local `Cell` without a destructor, which never
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

async fn call<S: idem::Store + ?Sized>(store: &S, key: &str) -> i64 {
    let body = async { Ok::<_, idem::Error>(std::hint::black_box(500i64)) };
    idem::run(store, idem::Call::new("bench.mem", key, &500i64), body)
        .await
        .unwrap()
}

/// What a call allocates, at most:
///
/// - a replay: its key (`Call::new` owns it; the scope shares the text of
///   the thread's last scope of the same operation) and the copy of the
///   stored outcome it is answered with (a store in memory answers the
///   claim at once, `Immediate::begin_now`, without a boxed future);
/// - a first execution: its key, the execution's future (on the heap, so
///   that a replay neither carries nor copies it), the outcome's bytes,
///   the record's copy of them, the owned handle on the store through
///   which the body's durable steps journal (`Detach`), and the
///   list of their journal writes on the way, shared with the engine (so
///   that a dropped caller's claim is handed back after them); and, now
///   and then, the growth of the store's map.
///
/// So no metric, span, fingerprint, scope, look-up or store future
/// allocates.
const REPLAY: usize = 2;
const FIRST: usize = 6;

#[test]
fn calls_allocate_only_what_they_keep_or_box() {
    measure(&idem::MemoryStore::new());
}

/// The same through the handles a store is shared with, which must pass
/// on its answers at once (`Immediate::begin_now`, `Immediate::complete_now`).
#[test]
fn shared_stores_allocate_no_more() {
    measure(&std::sync::Arc::new(idem::MemoryStore::new()));
    let boxed: Box<dyn idem::Store> = Box::new(idem::MemoryStore::new());
    measure(&boxed);
}

fn measure<S: idem::Store + ?Sized>(store: &S) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let n = 1000;
    let keys: Vec<String> = (0..2 * n).map(|i| format!("key-{i}")).collect();
    let (warm, measured) = keys.split_at(n);
    runtime.block_on(async {
        // Once per thread and operation: the metric keys, the runtime's
        // own state, the store's map at its first sizes.
        for key in warm {
            call(store, key).await;
            call(store, key).await;
        }

        let before = allocations();
        for key in measured {
            call(store, key).await;
        }
        let first = allocations() - before;
        // The map doubles at most twice over these calls (its entries and
        // its index): a few allocations, far fewer than one per call.
        assert!(
            first <= FIRST * n + 16,
            "{first} allocations for {n} first executions: more than {FIRST} per call"
        );

        let before = allocations();
        for key in measured {
            assert_eq!(call(store, key).await, 500);
        }
        let replays = allocations() - before;
        assert!(
            replays <= REPLAY * n,
            "{replays} allocations for {n} replays: more than {REPLAY} per call"
        );
    });
}
