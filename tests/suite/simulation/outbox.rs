//! The outbox's part of a history (SQL backends): the messages a body
//! publishes in the transaction of its effect, the relays that lease them,
//! deliver them to a deduping consumer and mark them (or die, give them
//! back, or mark late), and the final drain; and what the checker reads of
//! all that ([`Seen`]). The relay is the outbox's own API, as a relay of
//! one's own would use it: no broker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::history::Messages;

/// The relay index of the final drain.
pub const DRAIN: usize = usize::MAX;

/// One message as the harness saw it: its id, the id derived from its
/// content (`MessageId::derive` for the history's operation), its topic
/// and its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub id: String,
    pub derived: String,
    pub topic: String,
    pub payload: String,
}

/// One body's publishing: what `publish` (or `enqueue`) answered, and
/// whether the transaction it was written on committed (`None`: not
/// known, the caller dropped it or its commit failed).
#[derive(Clone, Debug)]
pub struct Publication {
    pub attempt: usize,
    pub charge: u64,
    /// When it began, from the history's start: its rows cannot be seen
    /// before.
    pub at: Duration,
    pub messages: Vec<Msg>,
    pub committed: Option<bool>,
}

/// How a lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    /// Its relay died holding it: nothing marked or given back.
    Died,
    /// Marked: the call was sent at `sent` and answered at `done`;
    /// `newly` rows were not marked yet.
    Marked {
        sent: Duration,
        done: Duration,
        newly: u64,
    },
    /// Given back (`Outbox::release`).
    Released { sent: Duration, done: Duration },
    /// Parked (`Outbox::park`, answered at `done`; `parked` rows were),
    /// then unparked (`Outbox::unpark`, sent at `unparked`): no lease may
    /// take them between the two.
    Parked {
        done: Duration,
        parked: u64,
        unparked: Duration,
    },
    /// The mark or the give-back failed: the rows wait for the lease.
    Failed(String),
}

/// One row of a lease.
#[derive(Clone, Debug)]
pub struct LeasedRow {
    pub seq: i64,
    pub id: String,
    /// `Leased::attempts`: its leases so far, this one included.
    pub attempts: i64,
}

/// One lease a relay took (an empty one is not kept).
#[derive(Clone, Debug)]
pub struct LeaseSeen {
    /// Which relay ([`DRAIN`]: the final drain).
    pub relay: usize,
    /// When the lease was asked for and when it was answered, from the
    /// history's start; its length.
    pub asked: Duration,
    pub got: Duration,
    pub lease: Duration,
    pub rows: Vec<LeasedRow>,
    /// The sequence numbers it delivered to the consumer.
    pub delivered: Vec<i64>,
    /// `None` while it is held.
    pub end: Option<LeaseEnd>,
}

impl LeaseSeen {
    /// Whether the lease may have passed before its mark or give-back
    /// reached the database (the database's clock counts in whole
    /// milliseconds): always when its relay died or a call failed.
    pub fn may_have_passed(&self) -> bool {
        let lease_ends = self.asked + self.lease;
        match &self.end {
            Some(
                LeaseEnd::Marked { done, .. }
                | LeaseEnd::Released { done, .. }
                | LeaseEnd::Parked { done, .. },
            ) => *done + Duration::from_millis(2) >= lease_ends,
            _ => true,
        }
    }

    /// When its relay started to give its rows back, if it did.
    pub fn released(&self) -> Option<Duration> {
        match &self.end {
            Some(LeaseEnd::Released { sent, .. }) => Some(*sent),
            Some(LeaseEnd::Parked { unparked, .. }) => Some(*unparked),
            _ => None,
        }
    }

    /// When its rows were parked and when they were unparked, if they were.
    pub fn parked(&self) -> Option<(Duration, Duration)> {
        match &self.end {
            Some(LeaseEnd::Parked { done, unparked, .. }) => Some((*done, *unparked)),
            _ => None,
        }
    }
}

/// One delivery to the consumer.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub seq: i64,
    /// The lease it was delivered under (an index into [`Log::leases`]).
    pub lease: usize,
    pub message: Msg,
}

/// Everything the outbox side noted during a history.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub publications: Vec<Publication>,
    pub leases: Vec<LeaseSeen>,
    /// The consumer: every delivery, by message id.
    pub deliveries: BTreeMap<String, Vec<Delivery>>,
    /// The consumer's effects, by message (topic, payload): it dedupes by
    /// message id, so a message whose id is stable has one.
    pub effects: BTreeMap<(String, String), u32>,
    /// Message ids the consumer has processed.
    pub processed: BTreeSet<String>,
    /// Rows deleted by relays' purges.
    pub purged: u64,
    /// Relay calls that failed (lease, purge), with the relay's index.
    pub errors: Vec<(usize, String)>,
}

impl Log {
    /// Delivers `message` (row `seq`) under lease `lease` to the deduping
    /// consumer: the effect happens unless its id was processed before.
    pub fn deliver(&mut self, lease: usize, seq: i64, message: Msg) {
        self.leases[lease].delivered.push(seq);
        if self.processed.insert(message.id.clone()) {
            *self
                .effects
                .entry((message.topic.clone(), message.payload.clone()))
                .or_default() += 1;
        }
        self.deliveries
            .entry(message.id.clone())
            .or_default()
            .push(Delivery {
                seq,
                lease,
                message,
            });
    }
}

/// One outbox row as the table holds it at the end.
#[derive(Clone, Debug)]
pub struct Row {
    pub seq: i64,
    pub id: String,
    pub topic: String,
    pub payload: String,
    pub relayed: bool,
}

/// What the checker reads of the outbox.
#[derive(Clone, Debug)]
pub struct Seen {
    pub messages: Messages,
    pub log: Log,
    /// The table's rows after the final drain.
    pub rows: Vec<Row>,
    /// `Outbox::waiting` after the final drain.
    pub waiting: u64,
}

/// The topic and payload of the messages a body publishes for its charge
/// `charge`, in order.
pub fn contents(kind: Messages, charge: u64) -> Vec<(&'static str, String)> {
    let created = ("sim.charged", format!("ch_{charge}"));
    match kind {
        Messages::One => vec![created],
        Messages::TwoTopics => vec![created, ("sim.receipts", format!("ch_{charge}"))],
        Messages::TwoPayloads => vec![created, ("sim.charged", format!("ch_{charge}:captured"))],
        Messages::SameTwice => vec![created.clone(), created],
    }
}

#[cfg(feature = "_sql")]
pub use side::Side;

#[cfg(feature = "_sql")]
mod side {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use idem::outbox::{Leased, Message, MessageId, Outbox};
    use idem::{Fingerprint, Key, Scope};
    use tokio::time::Instant;

    use super::super::history::{OutboxPlan, Relay, RelayFate};
    use super::super::run::{SimError, OP_KEY, PAYLOAD, SCOPE};
    use super::{contents, LeaseEnd, LeaseSeen, LeasedRow, Log, Msg, Publication, DRAIN};

    /// How a relay's round went.
    enum Round {
        /// Nothing to lease (or the lease failed).
        Empty,
        /// It leased messages, delivered them, and marked them or gave
        /// them back.
        Ended,
        /// It leased messages and died.
        Died,
    }

    /// The most rows the final drain leases at once.
    const DRAIN_BATCH: usize = 100;

    /// The outbox of a history's store, with its log.
    pub struct Side<D: idem::store::Backend> {
        pub outbox: Outbox<D>,
        plan: OutboxPlan,
        start: Instant,
        pub log: Mutex<Log>,
        /// Set once the history's calls are over: the relays stop looking.
        stop: AtomicBool,
    }

    fn message(topic: &str, payload: &str) -> Message {
        Message::new(topic, payload.to_owned())
            .and_then(|m| m.with_key(OP_KEY))
            .and_then(|m| m.with_header("content-type", "text/plain"))
            .expect("a valid message")
    }

    /// `message` with `id`, and the id its content derives.
    fn msg(id: &MessageId, message: &Message) -> Msg {
        let derived = MessageId::derive(
            &Scope::new(SCOPE),
            &Key::new(OP_KEY).expect("a key"),
            &Fingerprint::of(&PAYLOAD).expect("a fingerprint"),
            message,
        );
        Msg {
            id: id.to_string(),
            derived: derived.to_string(),
            topic: message.topic().to_owned(),
            payload: String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
        }
    }

    impl<D: idem::store::Backend> Side<D> {
        pub fn new(
            store: &idem::store::SqlStore<D>,
            plan: OutboxPlan,
            start: Instant,
        ) -> Arc<Self> {
            Arc::new(Side {
                outbox: Outbox::new(store),
                plan,
                start,
                log: Mutex::default(),
                stop: AtomicBool::new(false),
            })
        }

        fn log(&self) -> std::sync::MutexGuard<'_, Log> {
            self.log.lock().unwrap()
        }

        /// Notes that `attempt` publishes for `charge`: the publication's
        /// index.
        fn begins(&self, attempt: usize, charge: u64) -> usize {
            let mut log = self.log();
            log.publications.push(Publication {
                attempt,
                charge,
                at: self.start.elapsed(),
                messages: Vec::new(),
                committed: None,
            });
            log.publications.len() - 1
        }

        /// Publishes the body's messages for `charge` on `conn`, the
        /// transaction of its effect (record and transactional modes).
        pub async fn publish(
            &self,
            conn: &mut D::Connection,
            attempt: usize,
            charge: u64,
        ) -> Result<(), SimError> {
            let at = self.begins(attempt, charge);
            for (topic, payload) in contents(self.plan.messages, charge) {
                let message = message(topic, &payload);
                let id = self.outbox.publish(&mut *conn, &message).await?;
                self.log().publications[at]
                    .messages
                    .push(msg(&id, &message));
            }
            Ok(())
        }

        /// Enqueues the body's messages for `charge` (entity mode).
        pub fn enqueue(&self, attempt: usize, charge: u64) -> Result<(), SimError> {
            let at = self.begins(attempt, charge);
            for (topic, payload) in contents(self.plan.messages, charge) {
                let message = message(topic, &payload);
                let id = self.outbox.enqueue(message.clone())?;
                self.log().publications[at]
                    .messages
                    .push(msg(&id, &message));
            }
            Ok(())
        }

        /// Notes what became of the transaction `attempt` published on.
        pub fn settle(&self, attempt: usize, committed: Option<bool>) {
            for p in self.log().publications.iter_mut() {
                if p.attempt == attempt && p.committed.is_none() {
                    p.committed = committed;
                }
            }
        }

        /// Entity mode: the attempt's messages committed with the row it
        /// answered with when that row holds its own charge (`value`).
        pub fn settle_entity(&self, attempt: usize, value: &str) {
            for p in self.log().publications.iter_mut() {
                if p.attempt == attempt && p.committed.is_none() {
                    let own = value
                        .strip_prefix(&format!("ch_{}", p.charge))
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'));
                    p.committed = Some(own);
                }
            }
        }

        /// Record mode's body after its work: the transaction of its
        /// effect on the store's pool, with its messages, committed, or
        /// rolled back when the body `fails`.
        pub async fn announce(
            &self,
            attempt: usize,
            charge: u64,
            fails: bool,
        ) -> Result<(), SimError> {
            let mut tx = self
                .outbox
                .store()
                .pool()
                .begin()
                .await
                .map_err(|err| SimError::Idem(idem::Error::store(err)))?;
            let published = self.publish(&mut tx, attempt, charge).await;
            if published.is_err() || fails {
                let _ = tx.rollback().await;
                self.settle(attempt, Some(false));
                return published.and(Err(SimError::Body));
            }
            match tx.commit().await {
                Ok(()) => {
                    self.settle(attempt, Some(true));
                    Ok(())
                }
                Err(err) => Err(SimError::Idem(idem::Error::store(err))),
            }
        }

        /// A relay, as `relay` says; `who` is its index.
        pub async fn relay(self: Arc<Self>, who: usize, relay: Relay) {
            let from = self.start + Duration::from_millis(relay.at_ms);
            let until = from + Duration::from_millis(relay.for_ms);
            tokio::time::sleep_until(from).await;
            let mut held = 0;
            while Instant::now() < until && !self.stop.load(Ordering::SeqCst) {
                let fate = if held + 1 == relay.nth {
                    relay.fate
                } else {
                    RelayFate::Marks
                };
                match self.round(who, relay.batch, fate).await {
                    Round::Empty => {}
                    Round::Died => return,
                    Round::Ended => {
                        held += 1;
                        if relay.purges {
                            match self.outbox.purge(100).await {
                                Ok(n) => self.log().purged += n,
                                Err(err) => self.log().errors.push((who, format!("purge: {err}"))),
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(relay.pause_ms)).await;
            }
        }

        /// One round of relay `who`: a lease of at most `batch` rows,
        /// delivered and ended as `fate` says.
        async fn round(&self, who: usize, batch: usize, fate: RelayFate) -> Round {
            let length = Duration::from_millis(self.plan.lease_ms);
            let asked = self.start.elapsed();
            let lease = match self.outbox.lease(batch, length).await {
                Ok(lease) => lease,
                Err(err) => {
                    self.log().errors.push((who, format!("lease: {err}")));
                    return Round::Empty;
                }
            };
            if lease.is_empty() {
                return Round::Empty;
            }
            let got = self.start.elapsed();
            let index = {
                let mut log = self.log();
                log.leases.push(LeaseSeen {
                    relay: who,
                    asked,
                    got,
                    lease: length,
                    rows: lease
                        .messages()
                        .iter()
                        .map(|m| LeasedRow {
                            seq: m.seq(),
                            id: m.id().to_string(),
                            attempts: m.attempts(),
                        })
                        .collect(),
                    delivered: Vec::new(),
                    end: None,
                });
                log.leases.len() - 1
            };
            let messages = lease.messages();
            let delivered = match fate {
                RelayFate::Dies { delivered } => delivered.min(messages.len()),
                RelayFate::Parks { .. } => 0,
                _ => messages.len(),
            };
            for leased in &messages[..delivered] {
                self.deliver(index, leased);
                tokio::task::yield_now().await;
            }
            let seqs: Vec<i64> = messages.iter().map(Leased::seq).collect();
            let end = match fate {
                RelayFate::Dies { .. } => {
                    self.log().leases[index].end = Some(LeaseEnd::Died);
                    return Round::Died;
                }
                RelayFate::Releases => {
                    let sent = self.start.elapsed();
                    match self.outbox.release(&lease, &seqs).await {
                        Ok(_) => LeaseEnd::Released {
                            sent,
                            done: self.start.elapsed(),
                        },
                        Err(err) => LeaseEnd::Failed(format!("release: {err}")),
                    }
                }
                RelayFate::Parks { pause_ms } => {
                    let mut parked = 0;
                    let mut failed = None;
                    for seq in &seqs {
                        match self.outbox.park(&lease, *seq, "refused for good").await {
                            Ok(true) => parked += 1,
                            Ok(false) => {}
                            Err(err) => failed = Some(format!("park: {err}")),
                        }
                    }
                    let done = self.start.elapsed();
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    let unparked = self.start.elapsed();
                    match (failed, self.outbox.unpark(&seqs).await) {
                        (None, Ok(n)) if n == parked => LeaseEnd::Parked {
                            done,
                            parked,
                            unparked,
                        },
                        // A slower relay that delivered a row before this
                        // lease took it may mark it relayed while it is
                        // parked (a delivery is marked whoever leases the
                        // row now): it is then not unparked, and must not
                        // be parked any more.
                        (None, Ok(n)) if n < parked => match self.outbox.parked(1_000).await {
                            Ok(still)
                                if still.iter().all(|p| !seqs.contains(&p.message().seq())) =>
                            {
                                LeaseEnd::Parked {
                                    done,
                                    parked: n,
                                    unparked,
                                }
                            }
                            Ok(_) => LeaseEnd::Failed(format!(
                                "unpark: {n} rows of {parked} parked, and the rest still parked"
                            )),
                            Err(err) => LeaseEnd::Failed(format!("parked: {err}")),
                        },
                        (None, Ok(n)) => {
                            LeaseEnd::Failed(format!("unpark: {n} rows of {parked} parked"))
                        }
                        (Some(err), _) => LeaseEnd::Failed(err),
                        (None, Err(err)) => LeaseEnd::Failed(format!("unpark: {err}")),
                    }
                }
                RelayFate::Marks | RelayFate::Slow => {
                    if fate == RelayFate::Slow {
                        let passed = self.start + asked + length + Duration::from_millis(20);
                        tokio::time::sleep_until(passed).await;
                    }
                    let sent = self.start.elapsed();
                    match self.outbox.mark_relayed(&seqs).await {
                        Ok(newly) => LeaseEnd::Marked {
                            sent,
                            done: self.start.elapsed(),
                            newly,
                        },
                        Err(err) => LeaseEnd::Failed(format!("mark: {err}")),
                    }
                }
            };
            self.log().leases[index].end = Some(end);
            Round::Ended
        }

        fn deliver(&self, lease: usize, leased: &Leased) {
            let message = msg(leased.id(), leased.message());
            self.log().deliver(lease, leased.seq(), message);
        }

        /// Stops the relays after their round (the history's calls are
        /// over: what they left is the drain's).
        pub fn stop(&self) {
            self.stop.store(true, Ordering::SeqCst);
        }

        /// After the history: relays until nothing waits (a dead relay's
        /// rows once its lease passed), for at most ten seconds; answers
        /// what still waits.
        pub async fn drain(&self) -> u64 {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                self.round(DRAIN, DRAIN_BATCH, RelayFate::Marks).await;
                let waiting = match self.outbox.waiting().await {
                    Ok(waiting) => waiting,
                    Err(err) => {
                        self.log().errors.push((DRAIN, format!("waiting: {err}")));
                        u64::MAX
                    }
                };
                if waiting == 0 || Instant::now() >= deadline {
                    return waiting;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// What the outbox's histories of a run did, for its summary line.
#[derive(Debug, Default)]
pub struct Tally {
    /// Histories with an outbox.
    pub histories: u64,
    /// Messages the outbox held.
    pub messages: u64,
    /// Leases the relays took before the final drain.
    pub leases: u64,
    /// Relays that died holding a lease.
    pub deaths: u64,
    /// Leases whose rows had been leased before (taken over, or given
    /// back and leased again).
    pub retaken: u64,
    /// Leases given back.
    pub released: u64,
    /// Rows parked (and unparked).
    pub parked: u64,
    /// Leases marked after they may have passed.
    pub late: u64,
    /// Deliveries of a message processed before: absorbed by the
    /// consumer's dedupe.
    pub absorbed: u64,
    /// Rows purged while the relays ran.
    pub purged: u64,
}

impl Tally {
    pub fn add(&mut self, seen: &Seen) {
        let log = &seen.log;
        self.histories += 1;
        let ids: BTreeSet<&str> = seen
            .rows
            .iter()
            .map(|r| r.id.as_str())
            .chain(log.deliveries.keys().map(String::as_str))
            .collect();
        self.messages += ids.len() as u64;
        for lease in log.leases.iter().filter(|l| l.relay != DRAIN) {
            self.leases += 1;
            match &lease.end {
                Some(LeaseEnd::Died) => self.deaths += 1,
                Some(LeaseEnd::Released { .. }) => self.released += 1,
                Some(LeaseEnd::Parked { parked, .. }) => self.parked += parked,
                Some(LeaseEnd::Marked { .. }) if lease.may_have_passed() => self.late += 1,
                _ => {}
            }
        }
        self.retaken += log
            .leases
            .iter()
            .filter(|l| l.rows.iter().any(|r| r.attempts > 1))
            .count() as u64;
        self.absorbed += log
            .deliveries
            .values()
            .map(|d| d.len() as u64 - 1)
            .sum::<u64>();
        self.purged += log.purged;
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.histories == 0 {
            return f.write_str("no outbox");
        }
        write!(
            f,
            "an outbox in {} ({} messages; {} relay leases, {} relays died holding one, {} \
             given back, {} rows parked and unparked, {} marked late, {} leases of rows leased \
             before, {} redeliveries absorbed by the consumer, {} rows purged)",
            self.histories,
            self.messages,
            self.leases,
            self.deaths,
            self.released,
            self.parked,
            self.late,
            self.retaken,
            self.absorbed,
            self.purged
        )
    }
}
